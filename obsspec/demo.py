"""`obsspec demo` (what `make demo` runs): the main job on the embedded default, end to end.

Today that is: prepare a small built-in task suite in the sandbox, then play one validation
task's reference solution turn by turn, showing each tool call and the observation exactly as
the agent sees it, and the verifier's reward. Later commands (rollout with speculation) extend it.
"""

from __future__ import annotations

import asyncio
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
    summary = {"command": "demo", "tasks": prep, "sample_task": task.task_id,
               "sample_turns": len(record.steps), "sample_reward": record.reward,
               "idle_reward": idle.reward}
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
