"""How many observations could a world model write by copying? A ceiling on exact match, per class.

    PYTHONPATH=$PWD .venv/bin/python bench/observation_ceiling.py TASKS TRAJECTORIES \
        [--snapshot-tokens 512] [--out result.json]

TRAJECTORIES is a trajectories file of recorded episodes (a kit's rollouts.jsonl, or the
`--out ...trajectories.jsonl` of bench/evaluate_models.py); TASKS is the prepared suite they ran
on. A world model sees the episode so far (the instruction, the commands, earlier observations)
and, with `world_model.workspace_snapshot`, the task's `ls -lR` of /app before the first command
(at most --snapshot-tokens of it, as the rollout's drafts do). Each observation is sorted by what
it would take to write it exactly:

- empty        `(no output)` with exit code 0: no knowledge needed;
- context      every line of it is already in the episode so far: a copy;
- snapshot     every line, or every line's last path component, is in the snapshot: a copy
               from the snapshot (names only: an upper bound, a `find -size` filter also needs
               the sizes, which the snapshot holds, and the right selection);
- missing      a `No such file or directory` error (the rest of it copyable): knowable from the
               snapshot's absence of the name;
- computed     anything else: file contents beyond the snapshot, counts, grep hits, answers
               computed earlier, a listing after the episode moved files: what only running
               (or simulating) commands gives.

`ceiling_no_snapshot` = empty + context, `ceiling_snapshot` = all but computed: what a world model
that copies what it reads (and writes `(no output)`) can reach with those inputs; beyond it, it
must compute. Prints JSON (command, commit, date).
"""

from __future__ import annotations

import argparse
import asyncio
import re
from collections import Counter, defaultdict

from provenance import emit, stamp
from transformers import AutoTokenizer

from obsspec.commands import command_class
from obsspec.env.sandbox import SandboxConfig
from obsspec.env.suite import load_tasks
from obsspec.jsonl import read_jsonl
from obsspec.rollout.trajectory import Trajectory
from obsspec.tokens import ChatFormat
from obsspec.worldmodel.snapshot import snapshot_ids, workspace_texts

NO_OUTPUT = "(no output)\n(exit_code=0)"
KINDS = ("empty", "context", "snapshot", "missing", "computed")
LISTED_NAME = re.compile(r" \d\d:\d\d (.+)$")  # the name at the end of an `ls -l` line


def lines_of(body: str) -> list[str]:
    """The observation's lines without the exit-code line and blanks."""
    return [line for line in body.splitlines() if line.strip() and not line.startswith("(exit_code=")]


def kind(body: str, context: str, snapshot: str) -> str:
    """One of KINDS; lines match whole lines (a count such as `12` is not known because a size
    or a line somewhere reads 12), names match the names of the snapshot's listing lines."""
    if body == NO_OUTPUT:
        return "empty"
    lines = lines_of(body)
    seen = set(context.splitlines())
    if all(line in seen for line in lines):
        return "context"
    listed = set(snapshot.splitlines())
    names = {m.group(1) for line in listed if (m := LISTED_NAME.search(line))}
    in_snapshot = [line in listed or line.rstrip("/").rsplit("/", 1)[-1] in names for line in lines]
    if snapshot and all(in_snapshot):
        return "snapshot"
    if snapshot and any("No such file or directory" in line for line in lines) and all(
            ok or "No such file or directory" in line or line in seen for ok, line in zip(in_snapshot, lines)):
        return "missing"
    return "computed"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tasks")
    ap.add_argument("trajectories")
    ap.add_argument("--tokenizer", default="obsspec/bases/tiny-cpu/tokenizer")
    ap.add_argument("--snapshot-tokens", type=int, default=512)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    fmt = ChatFormat(AutoTokenizer.from_pretrained(args.tokenizer))
    trajectories = [Trajectory.from_dict(row) for row in read_jsonl(args.trajectories)]
    tasks = {t.task_id: t for t in load_tasks(args.tasks)}
    texts = asyncio.run(workspace_texts([tasks[tid] for tid in {tr.task_id for tr in trajectories}],
                                        SandboxConfig(timeout_s=10)))
    snapshots = {tid: fmt.decode(snapshot_ids(fmt, text, args.snapshot_tokens)) for tid, text in texts.items()}
    counts: dict[str, Counter] = defaultdict(Counter)
    for tr in trajectories:
        starts = [i for i, m in enumerate(tr.wm_mask) if m and (i == 0 or not tr.wm_mask[i - 1])]
        for start, turn in zip(starts, [t for t in tr.turns if t.kind == "bash"]):
            context = fmt.decode(tr.ids[:start])
            counts[command_class(turn.command, turn.observation)][kind(turn.observation, context,
                                                                       snapshots[tr.task_id])] += 1
    total = Counter()
    for c in counts.values():
        total.update(c)
    steps = sum(total.values())

    def share(c: Counter, kinds) -> float:
        return round(sum(c[k] for k in kinds) / max(sum(c.values()), 1), 4)

    result = {**stamp(), "trajectories": args.trajectories, "episodes": len(trajectories), "steps": steps,
              "snapshot_tokens": args.snapshot_tokens,
              "ceiling_no_snapshot": share(total, ("empty", "context")),
              "ceiling_snapshot": share(total, KINDS[:-1]),
              "kinds": {k: total[k] for k in KINDS},
              "per_class": {cls: {"steps": sum(c.values()), **{k: c[k] for k in KINDS},
                                  "ceiling_no_snapshot": share(c, ("empty", "context")),
                                  "ceiling_snapshot": share(c, KINDS[:-1])}
                            for cls, c in sorted(counts.items())}}
    emit(result, args.out)


if __name__ == "__main__":
    main()
