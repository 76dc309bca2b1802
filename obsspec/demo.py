"""`obsspec demo` (what `make demo` runs): the main job on the embedded default, end to end.

1. prepare the built-in task suite in the sandbox (every instance validated);
2. play one task's reference solution turn by turn, each tool call and observation exactly as the
   agent sees it, and the verifier's reward;
3. train: `obsspec train` on the recipe (its pretrained tiny bases, or the kit built on first
   use) — GRPO steps with speculative rollouts in real sandboxes and world-model co-training,
   with the live display (hit rate, time hidden by speculation), then val success before and
   after per family and a table of the run. Tool latency includes an EMULATED remote-sandbox
   delay, as the table says;
4. measure: `obsspec rollout --mode both` on val tasks (DEMO_ROLLOUT: how many at once, how many
   alternating sequential/speculative pairs): the net latency reduction with its 95 % interval.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import time

from obsspec import chat
from obsspec.config import Recipe
from obsspec.env.episode import run_scripted
from obsspec.env.suite import load_tasks, prepare_tasks
from obsspec.progress import Display


async def _demo(recipe: Recipe, out_dir: str, display: Display, emit) -> dict:
    tasks_dir = os.path.join(out_dir, "tasks")
    prep = await prepare_tasks(recipe.tasks, recipe.sandbox, tasks_dir, display)
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
    return {"command": "demo", "tasks": prep, "sample_task": task.task_id,
            "sample_turns": len(record.steps), "sample_reward": record.reward, "idle_reward": idle.reward}


# The demo's training: a curriculum of the nine train tasks of the default suite that the shipped
# policy half solves (19-50 % each over 8-48 measured episodes), so every GRPO group has mixed
# outcomes and the training reward climbs within minutes; at this rate over all ten families the
# 3.75M policy unlearns (docs/TRAINING.md, "What to expect").
DEMO_TRAIN = {"task_ids": ("bulk-rename-00044", "count-lines-00000", "count-lines-00009", "count-lines-00018",
                           "count-lines-00025", "dedupe-lines-00027", "find-by-size-00038",
                           "organize-files-00013", "organize-files-00036"),
              "steps": 12, "learning_rate": 3e-4, "warmup_steps": 0, "save_steps": 6}

# 16 episodes per pass, 8 at once, 6 alternating pairs: enough for the interval of a real gain to
# exclude 0, in about two minutes
DEMO_ROLLOUT = {"concurrency": 8, "num_tasks": 4, "pairs": 6}
DEMO_MARK = ".obsspec-demo"  # in a training run the demo started, which the next demo may replace


def fresh_train_dir(train_dir: str, emit) -> str:
    """An empty `train_dir` for the demo's run: an earlier demo's run there is replaced; anything
    else (a run of `obsspec train --out`) is moved aside, never deleted."""
    if os.path.exists(os.path.join(train_dir, DEMO_MARK)):
        shutil.rmtree(train_dir)
    elif os.path.lexists(train_dir):
        kept = f"{train_dir}.kept-{time.strftime('%Y%m%d-%H%M%S')}"
        os.rename(train_dir, kept)
        emit(f"{train_dir} was not a demo's run: moved to {kept}", "yellow")
    os.makedirs(train_dir)
    open(os.path.join(train_dir, DEMO_MARK), "w").close()
    return train_dir


def _overrides(values: dict) -> list[str]:
    def text(v):
        return "[" + ",".join(v) + "]" if isinstance(v, tuple) else f"{v:g}" if isinstance(v, float) else str(v)
    return [f"train.{k}={text(v)}" for k, v in values.items()]


def demo_training(train_ids: set[str], overrides: list[str]) -> dict:
    """DEMO_TRAIN's settings, less those the command line sets itself; none when the suite is not
    the one the curriculum was measured on (its tasks missing)."""
    if not set(DEMO_TRAIN["task_ids"]) <= train_ids:
        return {}
    given = {o.split("=", 1)[0] for o in overrides}
    return {k: v for k, v in DEMO_TRAIN.items() if f"train.{k}" not in given}


def run_demo(recipe: Recipe, out_dir: str, display: Display, recipe_path: str = "",
             overrides: list[str] = ()) -> dict:
    from rich.console import Console
    from rich.markup import escape

    console = Console()

    def emit(text: str, style: str | None = None) -> None:
        console.print(escape(text), style=style, highlight=False)

    summary = asyncio.run(_demo(recipe, out_dir, display, emit))
    tasks_dir = os.path.join(out_dir, "tasks")
    curriculum = demo_training({t.task_id for t in load_tasks(os.path.join(tasks_dir, "train.jsonl"))},
                               list(overrides))
    train_cfg = dataclasses.replace(recipe.train, **curriculum)
    measured = ", each step also run sequentially on the same seeds" if train_cfg.measure_speculation else ""
    emit("\ntraining: GRPO with speculative rollouts and world-model co-training "
         f"({train_cfg.steps} steps of {train_cfg.tasks_per_step} tasks x {train_cfg.group_size} episodes"
         f"{measured})", "bold")
    if curriculum:
        emit(f"on the {len(train_cfg.task_ids)} train tasks the shipped policy half solves; the same as\n"
             f"  obsspec train {recipe_path or 'RECIPE'} {' '.join([*overrides, *_overrides(curriculum)])}")
    from obsspec.training.grpo import run_training
    from obsspec.ui.live import make_live
    from obsspec.ui.tables import print_training_table

    train_recipe = dataclasses.replace(recipe, train=train_cfg,
                                       rollout=dataclasses.replace(recipe.rollout, tasks_dir=tasks_dir))
    live_kind = "rich" if getattr(display, "console", None) is not None else "plain"
    train_dir = fresh_train_dir(os.path.join(out_dir, "train"), emit)
    summary["train"] = run_training(train_recipe, train_dir, False, make_live(live_kind, "training"), display)
    print_training_table(summary["train"], recipe.rollout.latency)

    from obsspec.rollout_run import run_rollout
    from obsspec.ui.tables import print_rollout_table

    measure = dataclasses.replace(train_recipe, rollout=dataclasses.replace(train_recipe.rollout, **DEMO_ROLLOUT))
    emit(f"\nspeculation, measured: {measure.rollout.pairs} pairs of sequential and speculative rollouts "
         f"of {measure.rollout.num_tasks} val tasks x {recipe.train.group_size} episodes, "
         f"{measure.rollout.concurrency} at once, same seeds, alternating order", "bold")
    summary["rollout"] = run_rollout(measure, os.path.join(out_dir, "rollout"), "both", "",
                                     make_live(live_kind, "rollout"), display)
    print_rollout_table(summary["rollout"])
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    return summary
