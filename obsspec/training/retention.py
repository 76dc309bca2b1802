"""What a training run keeps on disk as it grows: adapter versions and each step's rollouts.

    protect = recorded_versions("RUN/checkpoints")        # world-model versions checkpoints name
    store.prune(recipe.train.keep_adapter_versions, protect | {serving})
    rollouts.after_rollouts.append(RolloutRotation("RUN", rank, recipe.train.keep_rollouts))

At a GPU recipe's scale a step writes ~0.24 GB of rollouts (256 episodes of 32k tokens: ids,
masks and logprobs as JSON, the trace) and a policy LoRA version of ~0.7 GB (rank 64 on
Qwen3-8B, fp32), so a run of 200 steps would fill ~190 GB (bench/run_disk.py):

- Adapter versions (`train.keep_adapter_versions` = k): after each publish, the store keeps its
  newest k versions, the one `latest` names, the one serving (a vLLM server may read a loaded
  adapter's folder again) and, for the world model, the version each complete checkpoint records
  (`--resume` serves it again). The servers hold one version each already: a new version is
  loaded, then the one it replaces unloaded.
- Rollout folders (`train.keep_rollouts` = n): after each step's rollouts, each process deletes
  its own step folders (`rollouts/step-N`, `.rankR` for rank R) older than its newest n.
  metrics.jsonl keeps every step's figures, so `obsspec report` still draws every step (and the
  newest folder's episodes); `obsspec train-worldmodel --data RUN` trains on the kept steps only.
"""

from __future__ import annotations

import os
import re
import shutil


def recorded_versions(checkpoints_dir: str) -> set[int]:
    """The world-model adapter versions the complete checkpoints under `checkpoints_dir` record."""
    from obsspec.training.checkpoints import find_checkpoints, read_state

    out = set()
    for path in find_checkpoints(checkpoints_dir).complete:
        version = read_state(path).get("wm_version")
        if isinstance(version, int):
            out.add(version)
    return out


class RolloutRotation:
    """An `after_rollouts` hook: this process's newest `keep` step folders stay, older ones go."""

    def __init__(self, out_dir: str, rank: int, keep: int):
        self.root, self.keep = os.path.join(out_dir, "rollouts"), keep
        self.name = re.compile(r"^step-(\d{6,})" + (re.escape(f".rank{rank}") if rank else "") + "$")

    def __call__(self, result=None) -> list[str]:
        if self.keep <= 0 or not os.path.isdir(self.root):
            return []
        for name in os.listdir(self.root):  # a deletion a crash cut short
            if name.startswith(".removing-") and self.name.match(name.removeprefix(".removing-")):
                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
        steps = sorted((int(m.group(1)), name) for name in os.listdir(self.root)
                       if (m := self.name.match(name)) and os.path.isdir(os.path.join(self.root, name)))
        removed = []
        for _, name in steps[:-self.keep]:
            aside = os.path.join(self.root, f".removing-{name}")
            os.rename(os.path.join(self.root, name), aside)  # a half-deleted step is never listed
            shutil.rmtree(aside, ignore_errors=True)
            removed.append(name)
        return removed
