"""`obsspec demo` (what `make demo` runs): the main job on the embedded default, end to end.

1. prepare a small built-in task suite in the sandbox (every instance validated);
2. play one task's reference solution turn by turn, each tool call and observation exactly as the
   agent sees it, and the verifier's reward;
3. build (or reuse) the tiny model kit: tokenizer, warm-started policy, world-model base;
4. roll out a few GRPO groups sequentially and with observation speculation, on the same tasks and
   seeds, with the live display, and print the side-by-side table (tool latency includes an
   EMULATED remote-sandbox delay, as the table says);
5. replay those episodes (recorded observations and latencies, no tools) with the oracle
   predictor: the upper bound a perfect world model would reach on them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os

from obsspec import chat
from obsspec.config import Recipe
from obsspec.env.episode import run_scripted
from obsspec.env.suite import load_tasks, prepare_tasks
from obsspec.ui.display import Display


async def _demo(recipe: Recipe, out_dir: str, display: Display, emit) -> dict:
    tasks_dir = os.path.join(out_dir, "tasks")
    prep = await prepare_tasks(recipe, tasks_dir, display)
    emit(f"prepare-tasks: {prep['train']} train / {prep['val']} val instances over "
         f"{prep['families']} families, {prep['dropped']} dropped, determinism "
         f"{prep['determinism_identical_fraction']:.3f} ({prep['total_sec']:.1f}s)\n", "bold")
    task = load_tasks(os.path.join(tasks_dir, "val.jsonl"))[0]
    emit(f"sample episode: {task.task_id} (reference solution)", "bold")
    emit(task.instruction + "\n", "italic")
    record = await run_scripted(task, task.solution, recipe.sandbox)
    for step in record.steps:
        emit(chat.render_bash(step.command), "cyan")
        emit(chat.wrap_observation(step.observation))
    idle = await run_scripted(task, [], recipe.sandbox)
    emit(f"verifier reward: reference solution {record.reward:g}, doing nothing {idle.reward:g}",
         "bold green")
    rollout_recipe = dataclasses.replace(recipe, rollout=dataclasses.replace(
        recipe.rollout, tasks_dir=tasks_dir, mode="both", split="val", num_tasks=4, group_size=2))
    emit("rollout on held-out (val) tasks: sequential, then speculative (world model), same tasks "
         "and seeds", "bold")
    from obsspec.rollout.run import _run
    from obsspec.ui.live import make_live
    from obsspec.ui.tables import print_rollout_table

    live_kind = "rich" if getattr(display, "console", None) is not None else "plain"
    rollout = await _run(rollout_recipe, os.path.join(out_dir, "rollout"), "both", "",
                         make_live(live_kind), display)
    print_rollout_table(rollout)
    emit("\nreplay: the same episodes again, tools answered from the recording (recorded latencies), "
         "with the oracle predictor — the hit rate and saving a perfect world model would reach", "bold")
    oracle_recipe = dataclasses.replace(rollout_recipe, rollout=dataclasses.replace(
        rollout_recipe.rollout, predictor="oracle"))
    bound = await _run(oracle_recipe, os.path.join(out_dir, "rollout-oracle"), "both",
                       os.path.join(out_dir, "rollout"), make_live(live_kind), display)
    print_rollout_table(bound)
    summary = {"command": "demo", "tasks": prep, "sample_task": task.task_id,
               "sample_turns": len(record.steps), "sample_reward": record.reward,
               "idle_reward": idle.reward, "rollout": rollout.get("comparison"),
               "oracle_replay": bound.get("comparison")}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    return summary


def run_demo(recipe: Recipe, out_dir: str, display: Display) -> dict:
    from rich.console import Console
    from rich.markup import escape

    console = Console()

    def emit(text: str, style: str | None = None) -> None:
        console.print(escape(text), style=style, highlight=False)

    return asyncio.run(_demo(recipe, out_dir, display, emit))
