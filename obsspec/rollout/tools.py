"""The tool side of an episode: a real sandbox (plus emulated remote latency) or a replay.

    tool = SandboxTool(task, episode, sandbox_config, latency)
    await tool.start(); result = await tool.run("ls", turn=0); reward = await tool.reward()

`EmulatedLatency` adds a seeded delay per (episode, turn) on top of what the sandbox really
takes, to stand in for a remote sandbox; every table and plot labels it as emulated.
`ReplayTool` answers from a recorded trajectory with its recorded latencies and never executes.
With `sandbox.placement: ray` the sandbox runs on a Ray worker (obsspec/env/ray_sandbox.py):
each result then says what the hop there cost (`hop`), and a tool whose worker was lost says so
(`lost`), so that the scheduler can run its episode again (`retries`, sandbox.ray.retries).
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass
from typing import Protocol

from obsspec.fields import doc
from obsspec.env.episode import observation, start_sandbox, verify_task
from obsspec.env.ray_sandbox import SandboxLost
from obsspec.env.sandbox import Sandbox, SandboxConfig, SandboxError
from obsspec.env.task import Task


@dataclass(frozen=True)
class EmulatedLatency:
    kind: str = doc("none", "none | fixed | lognormal: extra latency added to every command.")
    median_s: float = doc(0.0, "Median of the added latency, seconds.")
    sigma: float = doc(0.5, "Log-normal shape (spread) of the added latency.")

    def __post_init__(self) -> None:
        if self.kind not in ("none", "fixed", "lognormal"):
            raise ValueError("rollout.latency.kind must be none, fixed or lognormal")
        if self.median_s < 0 or self.sigma < 0:
            raise ValueError("rollout.latency.median_s and sigma must be >= 0")

    def sample(self, episode: int, turn: int) -> float:
        if self.kind == "none" or self.median_s == 0:
            return 0.0
        if self.kind == "fixed":
            return self.median_s
        rng = random.Random(f"latency/{episode}/{turn}")
        return self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))


@dataclass(frozen=True)
class ToolResult:
    body: str        # the observation body, exactly as the agent sees it
    exit_code: int
    seconds: float   # real + emulated
    hop: float = 0.0  # of `seconds`, what reaching a sandbox on another machine took


class Tool(Protocol):
    # optional: `lost` (its sandbox's machine went away) and `retries` (how often its episode may
    # then run again); a tool without them is never retried
    async def start(self) -> None: ...
    async def run(self, command: str, turn: int, timeout: float | None = None) -> ToolResult:
        """`timeout`: the tool call's own limit in seconds (None: the configured one)."""
    async def reward(self) -> float | None: ...
    async def close(self) -> None: ...


class SandboxTool:
    def __init__(self, task: Task, episode: int, config: SandboxConfig, latency: EmulatedLatency):
        self.task, self.episode, self.config, self.latency = task, episode, config, latency
        self.sandbox: Sandbox | None = None
        self.lost = False
        self.retries = config.ray.retries if config.placement == "ray" else 0

    async def start(self) -> None:
        self.sandbox = await self._watch(start_sandbox(self.task, self.config))

    async def run(self, command: str, turn: int, timeout: float | None = None) -> ToolResult:
        # (the timeout is clamped to config.timeout_s by the sandbox)
        result = await self._watch(self.sandbox.run(command, timeout_s=timeout))
        extra = self.latency.sample(self.episode, turn)
        if extra:
            await asyncio.sleep(extra)
        return ToolResult(observation(result, self.config), result.exit_code, result.seconds + extra, result.hop_s)

    async def reward(self) -> float | None:
        return await self._watch(verify_task(self.sandbox, self.task))

    async def _watch(self, call):
        try:
            return await call
        except SandboxError as e:
            self.lost = self.lost or isinstance(e, SandboxLost)
            raise

    async def close(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.close()
            self.sandbox = None


class ReplayDiverged(RuntimeError):
    """The policy issued a command the recording does not have (a different policy or seed)."""


class ReplayTool:
    def __init__(self, recorded_turns: list[dict], reward: float | None):
        self.turns = recorded_turns  # one per policy turn, as `Trajectory.turns` records them
        self._reward = reward

    async def start(self) -> None:
        pass

    async def run(self, command: str, turn: int, timeout: float | None = None) -> ToolResult:
        rec = self.turns[turn] if turn < len(self.turns) else None
        if rec is None or rec["kind"] != "bash" or rec["command"] != command:
            raise ReplayDiverged(f"turn {turn}: the recording has no command {command!r} here")
        await asyncio.sleep(rec["tool_sec"])
        return ToolResult(rec["observation"], rec["exit_code"], rec["tool_sec"])

    async def reward(self) -> float | None:
        return self._reward

    async def close(self) -> None:
        pass
