"""What a terminal task is: instruction, setup, verifier and reference solution.

A `Task` is plain data (JSON-serialisable) so that task suites can be written to JSONL, read back
with `datasets.load_dataset("json", ...)`, and rebuilt into the same object.

Conventions every task follows:
- `files` are written into the workspace (paths relative to it) before `setup` runs; both happen
  before the agent's first command, and every file they leave gets the same fixed timestamp.
- `setup` and every agent command run with the workspace (`workdir`, default /app) as cwd.
- `verify` is a bash script run after the episode, in the same sandbox, with `verify_files`
  placed under /tests (invisible to the agent during the episode). The reward is the number the
  script writes to /logs/verifier/reward.txt (Harbor's convention), else 1.0 on exit code 0 and
  0.0 otherwise. Rewards are clipped to [0, 1].
- `solution` is the reference solution: a list of bash commands, one per agent turn.
- `kind` (optional) names the family's variant of the task (dir-stats: which number is asked);
  training interleaves kinds so every part of a run sees the same mix, and reports success per kind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Task:
    task_id: str
    family: str
    instruction: str
    solution: list[str]
    verify: str
    files: dict[str, str] = field(default_factory=dict)
    setup: str = ""
    verify_files: dict[str, str] = field(default_factory=dict)
    workdir: str = "/app"
    max_turns: int = 12
    source: str = "builtin"
    kind: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Task":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown task fields: {sorted(unknown)}")
        d = dict(d)
        d["solution"] = list(d.get("solution", []))
        return cls(**d)

    def content_hash(self) -> str:
        """sha256 of the canonical JSON form: equal hashes mean equal tasks."""
        blob = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(blob).hexdigest()
