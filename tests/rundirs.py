"""Real-format run directories for report and simulator tests, made in about a second.

`rollout_dir(path)` runs the real batch driver (obsspec/rollout/batch.py) (sequential, then speculative with an oracle whose
every other draft is spoiled, so there are matches and rollbacks) with the scripted policy of
tests/fakes.py and a fake tool (fixed latency, no sandbox), and writes what obsspec/rollout_run.py
writes: episodes.jsonl, trajectories-<mode>.jsonl, trace-<mode>.jsonl and summary.json.
`training_dir(path)` writes a training run's metrics.jsonl (docs/REPORT.md) plus one rollout
directory under rollouts/.
"""

from __future__ import annotations

import asyncio
import json
import os

from fakes import ByteTokenizer, ScriptedPolicy
from obsspec.config import TasksConfig
from obsspec.env.suite import generate_builtin
from obsspec.rollout.batch import run_episodes, write_summary
from obsspec.rollout.predictors import Corrupting, Oracle
from obsspec.rollout.scheduler import Sampling
from obsspec.rollout_run import compare
from obsspec.rollout.tools import ToolResult
from obsspec.tokens import ChatFormat

COMMANDS = ["ls", "pwd", "cat notes-{h}.txt", "grep -c x data-{h}.csv", "echo {h}"]
SAMPLING = Sampling(max_turns=5, max_new_tokens=400, max_context=6000, seed=3)


class FakeTool:
    """Answers every command with a fixed text after `seconds` (never runs anything)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    async def start(self):
        pass

    async def run(self, command: str, turn: int, timeout: float | None = None) -> ToolResult:
        await asyncio.sleep(self.seconds)
        return ToolResult(f"output of {command}\n(exit_code=0)", 0, self.seconds)

    async def reward(self):
        return 0.0

    async def close(self):
        pass


def rollout_dir(path: str, episodes: int = 4, tool_s: float = 0.05, rollback_every: int = 2,
                token_delay: float = 0.0004) -> str:
    os.makedirs(path, exist_ok=True)
    tasks = generate_builtin(TasksConfig(num_instances=episodes, families=("count-lines", "find-by-name")))[0]
    tasks = (tasks * episodes)[:episodes]
    tok = ByteTokenizer()
    fmt = ChatFormat(tok)
    results, summaries = {}, {}
    for mode in ("sequential", "speculative"):
        predictor = None
        if mode == "speculative":
            seq = results["sequential"]
            oracle = Oracle([(task.content_hash(), [t.command for t in tr.turns if t.kind == "bash"],
                              [t.observation for t in tr.turns if t.kind == "bash"]) for task, tr in zip(tasks, seq)])
            predictor = Corrupting(oracle, every=rollback_every) if rollback_every else oracle
        batch = asyncio.run(run_episodes(
            ScriptedPolicy(tok, COMMANDS, token_delay=token_delay), fmt, tasks, lambda task, e: FakeTool(tool_s),
            SAMPLING, cap=512, speculative=mode == "speculative", predictor=predictor, out_dir=path))
        results[mode] = batch.trajectories
        summaries[mode] = {**batch.metrics.summary(), "predictor": predictor.name if predictor else None}
    summary = {"command": "rollout", "out_dir": path, "episodes": len(tasks), "replay_of": None,
               "modes": summaries, "tool_latency": {"emulated": True, "kind": "fixed", "median_s": tool_s},
               "comparison": compare(results["sequential"], results["speculative"])}
    write_summary(path, summary)
    return path


def training_dir(path: str, steps: int = 5) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for s in range(steps):
            a = 0.3 + 0.1 * s
            f.write(json.dumps({"step": s, "spec/exact_frac": a, "spec/exec_won_frac": 0.1,
                                "spec/rollback_frac": 1 - a, "spec/policy_tokens_discarded": 100 * (steps - s),
                                "latency_mean_sec": 10 - s, "latency_reduction": 0.02 * s,
                                "spec/class_hits": {"ls": [8 + s, 10], "cat": [2 + s, 10]},
                                "reward": a, "success_by_kind": {"fam/x": [s, 4], "fam/y": [1, 4]}}) + "\n")
    rollout_dir(os.path.join(path, "rollouts", f"step-{steps - 1:06d}"))
    return path
