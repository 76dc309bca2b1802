"""Each task's `tokens.WorldView`: what the world model reads besides the rollout's ids, built
from the task's initial workspace (its snapshot ahead, obsspec/worldmodel/snapshot.py; its hints
after each call, obsspec/worldmodel/hints.py).

    snapshots = WorkspaceSnapshots(fmt, 512, sandbox, hint_tokens=0)  # per-task cache: a GRPO group shares one
    view = await snapshots.prefix(task)                                 # view.prefix: the snapshot's ids
"""

from __future__ import annotations

import asyncio
from typing import Iterable

from obsspec.env.sandbox import SandboxConfig
from obsspec.env.task import Task
from obsspec.tokens import WorldView
from obsspec.worldmodel.hints import command_hints
from obsspec.worldmodel.snapshot import by_task, snapshot_ids, workspace_text


class WorkspaceSnapshots:
    """Each task's `WorldView` (its workspace snapshot ahead, its hints after each call), built
    once per task (content hash): every episode of a task, and so every member of a GRPO group,
    gets the same view. `budget`: the snapshot's tokens (0: no snapshot); `hint_tokens`: each
    hint's (0: no hints, obsspec/worldmodel/hints.py). Tasks seen are remembered by id, so that
    training rows of their trajectories (`prefixes`) get the view the drafts had."""

    def __init__(self, fmt, budget: int, sandbox: SandboxConfig, hint_tokens: int = 0):
        self.fmt, self.budget, self.sandbox, self.hint_tokens = fmt, budget, sandbox, hint_tokens
        self._views: dict[str, WorldView] = {}
        self._building: dict[str, asyncio.Future] = {}
        self._tasks: dict[str, Task] = {}

    async def prefix(self, task: Task) -> WorldView:
        key = task.content_hash()
        self._tasks[task.task_id] = task
        if key in self._views:
            return self._views[key]
        fut = self._building.get(key)
        if fut is None or fut.get_loop() is not asyncio.get_running_loop():
            # concurrent episodes of one task wait for one build (which a cancelled draft
            # leaves running for the others)
            fut = self._building[key] = asyncio.ensure_future(workspace_text(task, self.sandbox))
        try:
            text = await asyncio.shield(fut)
        except BaseException:
            if fut.done():  # failed: the next request tries again
                self._building.pop(key, None)
            raise
        self._views[key] = view = world_view(self.fmt, text, self.budget, self.hint_tokens)
        self._building.pop(key, None)
        return view

    def remember(self, task: Task) -> None:
        self._tasks.setdefault(task.task_id, task)

    def prefixes(self, trajectories: Iterable) -> list[WorldView]:
        """The view of each trajectory's task (by `task_id`), building the missing ones; for
        `warmstart.trajectory_examples(..., prefixes=...)`. Call it outside an event loop."""
        trajectories = list(trajectories)
        # (an episode that never ran a command was never seen, and has no target either)
        missing = [tr.task_id for tr in trajectories if tr.task_id not in self._tasks and any(tr.wm_mask)]
        if missing:
            raise KeyError(f"no task known for trajectory task_id {missing[0]!r}")
        table = asyncio.run(self.table([self._tasks[tr.task_id] for tr in trajectories
                                        if tr.task_id in self._tasks]))
        return [table.get(tr.task_id, WorldView()) for tr in trajectories]

    async def table(self, tasks: Iterable[Task]) -> dict[str, WorldView]:
        """task_id -> view for `tasks` (built a few at a time)."""
        return await by_task(tasks, 4, self.prefix)


def world_view(fmt, text: str, budget: int, hint_tokens: int) -> WorldView:
    """The `WorldView` of a task whose rendered snapshot is `text`: the snapshot ahead when
    `budget` > 0, hints of `hint_tokens` each when > 0."""
    return WorldView(tuple(snapshot_ids(fmt, text, budget)) if budget else (), fmt,
                     command_hints(fmt, text, hint_tokens) if hint_tokens else None)
