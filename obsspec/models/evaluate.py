"""How well the models do their jobs, on a suite's val split: a policy's success on tasks, and a
world model's exact hits on the steps of reference solutions and of the policy's own episodes.

    results = asyncio.run(evaluate_val(recipe, "runs/tasks", policies=("untrained", "warm"),
                                       world_model="kit"))

Run from the command line: python bench/evaluate_models.py TASKS_DIR [key=value ...] (see there).

- Policy: episodes are ordinary sequential rollouts (`rollout_tasks`, obsspec/rollout/batch.py)
  with the recipe's `policy` section as the sampling settings (temperature, budgets, turn limit)
  and real sandboxes, no emulated latency. `success_metrics` turns the trajectories into success
  rates, per family, and the share of GRPO groups with mixed outcomes (the groups that carry a
  learning signal).
- World model: cases from obsspec/worldmodel/cases.py, drafts judged by
  obsspec/worldmodel/evaluate.py (the scheduler's own hit test).
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from collections.abc import Sequence

from obsspec.build import workspace_snapshots
from obsspec.commands import first_program
from obsspec.config import Recipe
from obsspec.engines.hf import fast_engine
from obsspec.env.suite import load_tasks, spread
from obsspec.env.task import Task
from obsspec.progress import Display, NullDisplay
from obsspec.rollout.batch import rollout_tasks
from obsspec.rollout.config import sampling
from obsspec.rollout.trajectory import Trajectory
from obsspec.tokens import ChatFormat
from obsspec.worldmodel.cases import reference_cases, trajectory_cases
from obsspec.worldmodel.evaluate import evaluate_world_model


def _frac(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


def success_metrics(tasks: list[Task], trajectories: list[Trajectory], group_size: int = 1) -> dict:
    """Success figures of episodes (tasks[i] <-> trajectories[i]); consecutive runs of
    `group_size` episodes are one GRPO group of the same task."""
    scored = [(t, tr) for t, tr in zip(tasks, trajectories) if tr.reward is not None]
    turns = [turn for _, tr in scored for turn in tr.turns]
    per_family: dict[str, list[float]] = defaultdict(list)
    first_same = first_program_same = 0
    for task, tr in scored:
        per_family[task.family].append(tr.reward)
        first = next((t.command for t in tr.turns if t.kind == "bash"), None)
        reference = task.solution[0] if task.solution else ""
        first_same += first == reference
        first_program_same += first is not None and first_program(first) == first_program(reference)
    groups = [trajectories[i:i + group_size] for i in range(0, len(trajectories), group_size)]
    groups = [g for g in groups if all(tr.reward is not None for tr in g)]
    mixed = sum(1 for g in groups if len({tr.reward == 1.0 for tr in g}) == 2)
    n = len(scored)
    return {
        "episodes": len(trajectories), "infra_errors": len(trajectories) - n,
        "success_frac": _frac(sum(tr.reward == 1.0 for _, tr in scored), n),
        "mean_reward": round(statistics.fmean(tr.reward for _, tr in scored), 4) if n else None,
        "per_family": {f: _frac(sum(r == 1.0 for r in rs), len(rs)) for f, rs in sorted(per_family.items())},
        "group_size": group_size, "groups": len(groups),
        "mixed_group_frac": _frac(mixed, len(groups)) if group_size > 1 else None,
        "actions": len(turns),
        "parse_valid_frac": _frac(sum(t.kind != "error" for t in turns), len(turns)),
        "done_called_frac": _frac(sum(any(t.kind == "done" for t in tr.turns) for _, tr in scored), n),
        "first_command_reference_frac": _frac(first_same, n),
        "first_program_reference_frac": _frac(first_program_same, n),
        "mean_turns": round(len(turns) / n, 2) if n else None,
    }


# ---------------------------------------------------------------------------------------------
# A whole evaluation


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.rsplit("/", 1)[-1] or name).strip("_")


def _policy(which: str, paths, kit_cfg):
    from obsspec.models import tiny

    if which == "warm":
        return tiny.load_pretrained(paths.policy)
    if which == "untrained":  # the same random initialisation the warm start began from
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(paths.tokenizer)
        return tiny.build_model(kit_cfg.policy, tokenizer, kit_cfg.max_length, kit_cfg.seed).eval(), tokenizer
    return tiny.load_pretrained(which)  # a folder or a hub name


async def evaluate_val(recipe: Recipe, tasks_dir: str, *, policies: Sequence[str] = ("warm",),
                       world_model: str = "", rollouts: Sequence[str] = (), max_draft_tokens: int = 0,
                       group_size: int = 4, limit: int = 0, workers: int = 8, out: str = "",
                       cache: str | None = None, display: Display | None = None, command: str = "",
                       paths=None) -> dict:
    """Evaluate on `tasks_dir`'s val split (`limit` tasks spread over it, 0 = all; `group_size`
    episodes each): every policy of `policies` ('untrained', 'warm' or a model folder / hub
    name), then, with `world_model` ('kit' or a model folder), its greedy drafts on the val
    reference steps, on the last policy's episodes and on those of each `rollouts` file
    (trajectories JSONL), capped at `max_draft_tokens` (0: world_model.max_tokens). `out`: a
    prefix for each policy's episodes (OUT.NAME.trajectories.jsonl, for a later `rollouts`).
    A missing `rollouts` file raises FileNotFoundError before any work. `paths`: the kit
    (KitPaths) to evaluate instead of the recipe's own."""
    from obsspec.build import kit_for
    from obsspec.models.kit import read_trajectories
    from obsspec.models.tiny import load_pretrained

    display = display or NullDisplay()
    for path in rollouts:  # before any work, not after an hour of it
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--rollouts {path}: no such file")
    tasks = load_tasks(f"{tasks_dir}/val.jsonl")
    tasks = spread(tasks, limit) if limit else tasks
    episodes = [t for t in tasks for _ in range(group_size)]
    names = [n for n in policies if n]
    settings = sampling(recipe.policy, recipe.rollout.seed)
    if paths is None and ({"untrained", "warm"} & set(names) or world_model == "kit"):
        paths = kit_for(recipe, tasks_dir, display, cache_dir=cache)
    results: dict = {"command": command, "kit": paths.root if paths else None, "sampling": settings.__dict__}
    trajectories: list[Trajectory] = []
    for which in names:
        model, tokenizer = _policy(which, paths, recipe.kit)
        async with fast_engine(model, tokenizer) as engine:
            trajectories = await rollout_tasks(engine, ChatFormat(tokenizer), episodes, recipe.sandbox,
                                               settings, concurrency=workers, display=display,
                                               label=f"policy {which}")
        results[which] = success_metrics(episodes, trajectories, group_size)
        display.log(f"{which}: " + json.dumps(results[which]))
        if out:  # the episodes themselves, for a later --rollouts
            with open(f"{out}.{_slug(which)}.trajectories.jsonl", "w") as f:
                f.writelines(json.dumps(tr.to_dict(), sort_keys=True) + "\n" for tr in trajectories)
    if world_model:
        rows = [r for r in read_trajectories(tasks_dir) if r.get("split") == "val"]
        rows = spread(rows, limit) if limit else rows
        model, tokenizer = load_pretrained(paths.world_model if world_model == "kit" else world_model)
        fmt = ChatFormat(tokenizer)
        recorded = {f"rollouts_{_slug(names[-1])}": trajectories} if trajectories else {}
        for path in rollouts:
            with open(path) as f:
                recorded[f"rollouts_{_slug(path)}"] = [Trajectory.from_dict(json.loads(line)) for line in f
                                                       if line.strip()]
        snapshots = None
        builder = workspace_snapshots(fmt, recipe.world_model, recipe.sandbox)
        if builder is not None:  # the prefix the rollout's drafts have, for the tasks judged only
            ids = {r["task_id"] for r in rows} | {tr.task_id for trs in recorded.values() for tr in trs}
            snapshots = await builder.table([t for t in load_tasks(tasks_dir) if t.task_id in ids])
        sources = {"reference": reference_cases(fmt, rows, snapshots),
                   **{name: trajectory_cases(fmt, trs, snapshots) for name, trs in recorded.items()}}
        async with fast_engine(model, tokenizer, **recipe.world_model.hf_options) as engine:
            for name, cases in sources.items():
                results[f"world_model_{name}"] = await evaluate_world_model(
                    engine, fmt, cases, recipe.sandbox.output_cap,
                    max_draft_tokens or recipe.world_model.max_tokens,
                    display=display, label=f"world model on {name}")
                display.log(f"world model on {name}: " + json.dumps(results[f"world_model_{name}"]))
    return results
