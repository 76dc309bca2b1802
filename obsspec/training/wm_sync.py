"""The co-trained world model on every process of a run (`obsspec train` under torchrun or
accelerate): every rank drafts with the current adapter version, and co-training learns from
every rank's episodes.

    sync = WorldModelSync(state, rollouts, predictor, wm_engine, cotrainer, shared=True)
    rollouts.before_rollouts.append(sync.before_rollouts)
    rollouts.after_rollouts.append(sync.after_rollouts)

- Before each step's rollouts the main process finishes its co-training job (publishes the new
  version and serves it), then tells every rank the version it serves (one broadcast of its name
  and folder). A rank whose world model is its own (the hf engine, in process) loads it from the
  run's adapter store; a rank that shares the main process's vLLM server only names it.
- After each step's rollouts every rank waits for the others (one barrier; each has written its
  trajectories to rollouts/step-N.rankK/), and the main process co-trains on all of them.

Between the two, no rank drafts: the main process unloads an old version only when every rank is
at one of these points (a draft asked of a version unloaded anyway is a miss, never an error).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os

from obsspec.rollout.trajectory import Trajectory


class WorldModelSync:
    def __init__(self, state, rollouts, predictor, engine, cotrainer, shared: bool):
        self.state, self.rollouts, self.predictor = state, rollouts, predictor
        self.engine, self.cotrainer, self.shared = engine, cotrainer, shared
        self.version: int | None = None   # the version this rank drafts with (None: the initial adapter)

    def before_rollouts(self, step: int) -> None:
        from accelerate.utils import broadcast_object_list

        current = None
        if self.state.is_main_process and self.cotrainer is not None:
            self.cotrainer.before_rollouts(step)  # (its job done: the new version is served)
            if self.cotrainer.version is not None:
                v = self.cotrainer.store.get(self.cotrainer.version)
                current = {"version": v.version, "name": v.name, "path": v.path}
        [current] = broadcast_object_list([current], from_process=0)
        if current is None or current["version"] == self.version:
            return
        if not self.state.is_main_process:
            old = self.predictor.adapter
            if not self.shared:  # this rank's own engine: the adapter from the run's store
                asyncio.run(self.engine.load_adapter(current["name"], current["path"]))
                if old and old != current["name"]:
                    asyncio.run(self.engine.unload_adapter(old))
            self.predictor.adapter = current["name"]
        self.version = current["version"]

    def after_rollouts(self, result) -> None:
        self.state.wait_for_everyone()  # every rank's trajectories are on disk
        if not self.state.is_main_process or self.cotrainer is None:
            return
        others = []
        for rank in range(1, self.state.num_processes):
            others += _trajectories(self.rollouts.step_dir(result.step, rank))
        snapshots = getattr(self.predictor, "snapshots", None)  # (views of the tasks this rank never ran)
        if snapshots is not None:
            for tr in others:
                if tr.task_id in self.rollouts.tasks:
                    snapshots.remember(self.rollouts.tasks[tr.task_id])
        self.cotrainer.after_rollouts(dataclasses.replace(result, trajectories=result.trajectories + others))


def _trajectories(folder: str) -> list[Trajectory]:
    """The speculative pass's trajectories a rank wrote for its step (the ones that train)."""
    path = os.path.join(folder, "trajectories-speculative.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [Trajectory.from_dict(json.loads(line)) for line in f if line.strip()]
