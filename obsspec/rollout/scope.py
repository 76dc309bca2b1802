"""Structured concurrency for one episode: every task it starts, and every request not yet ended.

The scheduler spawns each task of an episode (tool execution, world-model branches, speculative
generations) through its `EpisodeScope`; when the episode ends, however it ends, the scheduler
ends every open speculation with a reason and awaits every task in the scope, inside
`run_to_the_end`, which a second cancellation cannot cut short.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class EpisodeScope:
    """What one episode has started: every task, and every speculation not yet ended."""

    max_turns: int
    tasks: set[asyncio.Task] = field(default_factory=set)
    open: set[Any] = field(default_factory=set)  # the scheduler's speculations not yet ended

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task


async def run_to_the_end(coro):
    """Run `coro` to completion even if we are cancelled meanwhile (then re-raise the cancel)."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()
