"""One batch of episodes through the scheduler, and the run directory it leaves behind.

    batch = await run_episodes(policy, fmt, tasks, make_tool, sampling, cap=2048, speculative=True,
                               predictor=predictor, out_dir="runs/rollout", live=live)
    batch.trajectories, batch.metrics.summary()

Every batch of the project runs here: each mode of `obsspec rollout`, each training step and val
evaluation (obsspec/training/rollouts.py), and the sequential episodes of the kit and of
evaluations (`rollout_tasks`). With `out_dir`, the batch writes there what `obsspec report` and
`obsspec rollout --replay` read:
- `episodes.jsonl`              the tasks in episode order
- `trajectories-<mode>.jsonl`   token ids, masks, logprobs, turns, reward per episode
- `trace-<mode>.jsonl`          every event of the batch
- `atif/<mode>/<task>__e<N>/`   each episode as a Harbor trial folder (ATIF; obsspec/rollout/atif_out.py)
(`write_summary` adds `summary.json`, whose content is the caller's.)
"""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from obsspec.env.sandbox import SandboxConfig, SandboxUnavailable
from obsspec.env.task import Task
from obsspec.progress import Display, NullDisplay
from obsspec.rollout.atif_out import AtifRecorder, write_trials
from obsspec.rollout.events import Event, EventBus, JsonlTrace
from obsspec.rollout.metrics import SpecMetrics
from obsspec.rollout.scheduler import Sampling, Scheduler
from obsspec.rollout.tools import EmulatedLatency, SandboxTool
from obsspec.rollout.trajectory import Trajectory


class Live(Protocol):
    """A live view of a running batch (obsspec/ui/live.py): it reads the batch's metrics."""

    def start(self, metrics: SpecMetrics, total: int, title: str = "", speculative: bool = True) -> None: ...
    def stop(self) -> None: ...


@dataclass
class Batch:
    """What a batch produced: one trajectory per task, and the metrics of its events."""

    trajectories: list[Trajectory]
    metrics: SpecMetrics
    mode: str                      # "sequential" or "speculative"


def mode_name(speculative: bool) -> str:
    return "speculative" if speculative else "sequential"


async def run_episodes(policy, fmt, tasks: list[Task], make_tool, sampling: Sampling, *, cap: int,
                       speculative: bool, predictor=None, depth: int = 1, busy_limit: int = 0, gate=None,
                       concurrency: int = 0, first_episode: int = 0, adapter: str | None = None,
                       out_dir: str = "", live: Live | None = None, title: str = "",
                       listeners: Iterable[Callable[[Event], None]] = ()) -> Batch:
    """Episodes `first_episode + i` on tasks[i] (`make_tool(task, episode)` -> Tool), all at once
    or `concurrency` at a time; `predictor` only serves a speculative batch. `listeners` get every
    event; `live` shows the batch as it runs; `out_dir` (existing) receives the run files."""
    mode = mode_name(speculative)
    allow_open_files(concurrency or len(tasks))
    bus, metrics = EventBus(), SpecMetrics()
    bus.subscribe(metrics)
    trace = recorder = None
    if out_dir:
        write_episodes(out_dir, tasks, first_episode)
        trace = JsonlTrace(os.path.join(out_dir, f"trace-{mode}.jsonl"), mode)
        bus.subscribe(trace)
        recorder = AtifRecorder()
        bus.subscribe(recorder)
    for listener in listeners:
        bus.subscribe(listener)
    scheduler = Scheduler(policy, fmt, bus, sampling, cap=cap, predictor=predictor if speculative else None,
                          depth=depth, adapter=adapter, busy_limit=busy_limit, gate=gate)
    if live is not None:
        live.start(metrics, len(tasks), title or f"{mode} rollout", speculative=speculative)
    before = policy.scheduling_stats()
    try:
        trajectories = await scheduler.run_batch(tasks, make_tool, speculative=speculative,
                                                 concurrency=concurrency, first_episode=first_episode)
        metrics.delay = policy.scheduling_stats() - before
    finally:
        if live is not None:
            live.stop()
        if trace is not None:
            trace.close()
    if out_dir:
        write_trajectories(out_dir, mode, trajectories)
        write_trials(os.path.join(out_dir, "atif", mode), tasks, trajectories, recorder, mode,
                     first_episode=first_episode)
    return Batch(trajectories, metrics, mode)


# What one episode in flight holds open here: its sandbox's three pipes and uid lock, the
# engine's connections, with room to spare (256 episodes held 2,566 at once in bench/scale.py).
FILES_PER_EPISODE = 16


def allow_open_files(episodes: int) -> None:
    """Raise this process's open-file limit to what `episodes` at once need (up to the hard
    limit: many systems start processes at 1,024, which ~100 episodes exhaust, and every
    episode after that failed with "Too many open files"). One line when it cannot."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 256 + FILES_PER_EPISODE * episodes
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    want = need if hard == resource.RLIM_INFINITY else min(need, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < need:
        raise SandboxUnavailable(f"{episodes} episodes at once need about {need} open files, and this process "
                                 f"may open {hard} (its hard limit, `ulimit -Hn`): raise it, or set "
                                 "rollout.concurrency lower")


async def rollout_tasks(engine, fmt, tasks: list[Task], sandbox: SandboxConfig, sampling: Sampling, *,
                        concurrency: int = 4, display: Display | None = None,
                        label: str = "episodes") -> list[Trajectory]:
    """Sequential episodes of `tasks` (episode i = tasks[i]) in real sandboxes without emulated
    latency, with progress on `display`: the kit's rollouts and the policy evaluations."""
    display = display or NullDisplay()
    display.start(len(tasks), label)
    try:
        batch = await run_episodes(
            engine, fmt, tasks, lambda task, episode: SandboxTool(task, episode, sandbox, EmulatedLatency()),
            sampling, cap=sandbox.output_cap, speculative=False, concurrency=concurrency,
            listeners=[lambda e: display.advance(1) if e.kind == "episode_end" else None])
        return batch.trajectories
    finally:
        display.finish()


# ---------------------------------------------------------------------------------------------
# The run directory


def write_episodes(out_dir: str, tasks: list[Task], first_episode: int = 0) -> None:
    with open(os.path.join(out_dir, "episodes.jsonl"), "w") as f:
        for i, t in enumerate(tasks):
            f.write(json.dumps({"episode": first_episode + i, "task": t.to_dict()}, sort_keys=True) + "\n")


def write_trajectories(out_dir: str, mode: str, trajectories: list[Trajectory]) -> None:
    with open(os.path.join(out_dir, f"trajectories-{mode}.jsonl"), "w") as f:
        for tr in trajectories:
            f.write(json.dumps(tr.to_dict(), sort_keys=True) + "\n")


def write_summary(out_dir: str, summary: dict) -> None:
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
