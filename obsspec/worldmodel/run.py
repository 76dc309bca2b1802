"""`obsspec train-worldmodel`: fine-tune a LoRA adapter on recorded episodes, publish it as a new
version, and evaluate it against its base on held-out task instances.

    summary = run_train_worldmodel(recipe, out_dir="runs/world_model", data=["runs/tasks"])
    summary = run_train_worldmodel(recipe, out_dir, data=[...], eval_only="runs/world_model")

Writes under `out_dir`:
- `adapters/v000001/ ...`, `adapters/latest`   published versions (obsspec/worldmodel/adapters.py)
- `summary.json`                             data counts, training stats, evaluation figures
A crash mid-training leaves only `.training/`, removed by the next run, which starts that
version over; a version is visible only once whole (`AdapterStore.publish`). `wm_train.init_adapter`
continues from an earlier version instead of a fresh adapter. With `world_model.workspace_snapshot`,
every row and every evaluation case has its task's workspace snapshot ahead of it, as the
rollout's drafts do (the tasks come from the sources: a suite's train/val.jsonl, a run's episodes.jsonl).
"""

from __future__ import annotations

import json
import os
import shutil
import time

from obsspec.config import Recipe, to_dict
from obsspec.progress import Display, NullDisplay
from obsspec.rollout.config import WorldModelConfig
from obsspec.worldmodel import data
from obsspec.worldmodel.adapters import AdapterStore, resolve_adapter
from obsspec.worldmodel.config import WorldModelTrainConfig
from obsspec.worldmodel.evaluate import evaluate_models, gain

# Most held-out steps the evaluation drafts, spread over them: drafting is the slow part on a CPU,
# and 200 steps already give its rates to a few points; no recipe has set another.
EVAL_STEPS = 200


def base_model_path(recipe: Recipe, display: Display, data_paths: list[str] = ()) -> str:
    """The recipe's world model: the kit's base for 'tiny' (built on first use), else a folder
    or hub name (any causal LM sharing the policy's tokenizer). The kit's suite: rollout.tasks_dir,
    else a task suite among `data_paths`, else RUN/tasks; with no suite at all (Harbor jobs only),
    the pretrained bases as shipped."""
    if recipe.world_model.model != "tiny":
        return recipe.world_model.model
    from obsspec.build import kit_for

    suites = [p for p in data_paths if os.path.isfile(os.path.join(p, "trajectories.jsonl"))
              and os.path.isfile(os.path.join(p, "manifest.json"))]
    tasks_dir = recipe.rollout.tasks_dir or (suites[0] if suites else os.path.join(recipe.run_dir, "tasks"))
    if not os.path.isdir(tasks_dir) and recipe.kit.bases:
        from obsspec.models.bases import bases_dir
        from obsspec.models.kit import KitPaths

        display.log(f"no task suite among the data: the pretrained bases at {bases_dir(recipe.kit.bases)} as shipped")
        return KitPaths.under(bases_dir(recipe.kit.bases)).world_model
    return kit_for(recipe, tasks_dir, display).world_model


def snapshot_table(snapshots, tasks: dict | None, episodes: list) -> dict | None:
    """task_id -> workspace snapshot ids for `episodes` (None without a snapshot builder);
    `tasks`: `data.source_tasks` of the episodes' sources."""
    if snapshots is None:
        return None
    return data.snapshot_table(episodes, tasks or {}, snapshots)


def run_train_worldmodel(recipe: Recipe, out_dir: str, data_paths: list[str] | None = None,
                         eval_only: str = "", eval_on: list[str] | None = None,
                         display: Display | None = None) -> dict:
    from obsspec.models.tiny import load_pretrained
    from obsspec.build import workspace_snapshots
    from obsspec.tokens import ChatFormat

    display = display or NullDisplay()
    cfg = recipe.wm_train
    t0 = time.monotonic()
    sources = list(data_paths or [])
    eval_sources = list(eval_on or []) or sources
    # Every input is checked before minutes of work: sources, adapters.
    evaluated = None if eval_only in ("", "base") else resolve_adapter(eval_only)
    init = resolve_adapter(cfg.init_adapter) if cfg.init_adapter and not eval_only else None
    skipped: list = []
    episodes = data.load_episodes(sources, skipped) if not eval_only else []
    eval_episodes = data.load_episodes(eval_sources, skipped if eval_only else None)
    # The sources' tasks (their workspaces), read before the kit: a task id naming two tasks is refused now.
    snapshot_on = recipe.world_model.reads_workspace
    train_tasks = data.source_tasks(sources) if snapshot_on and not eval_only else None
    eval_tasks = data.source_tasks(eval_sources) if snapshot_on else None

    model, tokenizer = load_pretrained(base_model_path(recipe, display, [*sources, *eval_sources]),
                                       device=recipe.world_model.device)
    fmt = ChatFormat(tokenizer, **recipe.policy.chat_layout)
    snapshots = workspace_snapshots(fmt, recipe.world_model, recipe.sandbox)  # one builder: rows and cases share its snapshots
    summary: dict = {"command": "train-worldmodel", "out_dir": out_dir, "data": sources,
                     "eval_on": eval_sources, "wm_train": to_dict(cfg),
                     "skipped_trials": [{"trial": p, "why": w} for p, w in skipped]}
    for p, w in skipped[:20]:
        display.log(f"skipped {p}: {w}")
    os.makedirs(out_dir, exist_ok=True)
    adapters: dict[str, str | None] = {"base": None}
    if eval_only:
        if evaluated is not None:
            adapters[evaluated.name] = evaluated.path
            summary["adapter"] = {"version": evaluated.version, "path": evaluated.path}
    else:
        from obsspec.worldmodel.train import train_adapter

        train_eps, held_eps = data.split_by_task(episodes, cfg.eval_fraction, cfg.seed)
        table = snapshot_table(snapshots, train_tasks, episodes)
        rows, counts = data.examples(fmt, train_eps, cfg.max_length, table)
        held_rows, _ = data.examples(fmt, held_eps, cfg.max_length, table)
        summary["train_data"] = {**counts, "tasks": len({e.task_id for e in train_eps}),
                                 "held_out_tasks": len({e.task_id for e in held_eps})}
        display.log(f"world-model adapter: {counts['examples']} examples from "
                    f"{summary['train_data']['tasks']} tasks ({counts['duplicates']} duplicates, "
                    f"{counts['cut']} episodes cut into windows, {counts['too_long']} observations too long)")
        staging = os.path.join(out_dir, ".training")
        shutil.rmtree(staging, ignore_errors=True)  # a crashed run's half adapter: start over
        stats = train_adapter(model, tokenizer, rows, cfg, staging, init.path if init else None,
                              display, eval_rows=held_rows)
        version = AdapterStore(os.path.join(out_dir, "adapters")).publish(staging, meta={"train": stats})
        shutil.rmtree(staging, ignore_errors=True)
        summary["train"] = stats
        summary["adapter"] = {"version": version.version, "name": version.name, "path": version.path}
        adapters[version.name] = version.path
    summary["eval"] = evaluate(fmt, model, tokenizer, cfg, recipe.world_model, recipe.sandbox.output_cap,
                               eval_sources, eval_episodes, adapters, display, snapshots, eval_tasks)
    summary["sec"] = round(time.monotonic() - t0, 1)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    return summary


def evaluate(fmt, model, tokenizer, cfg: WorldModelTrainConfig, wm: WorldModelConfig, cap: int, sources: list[str],
             episodes: list, adapters: dict[str, str | None], display: Display, snapshots=None,
             tasks: dict | None = None) -> dict:
    """Figures for the base and each adapter on the held-out steps of `episodes` (`cfg`: the
    wm_train section, which holds them out; `wm`: the world_model section, which drafts; `cap`:
    `sandbox.output_cap`; `snapshots`: the run's snapshot builder,
    `obsspec.build.workspace_snapshots`, or None; `tasks`: the sources' tasks,
    `data.source_tasks(sources)`, which the snapshots are taken from)."""
    from obsspec.env.suite import spread

    _, held = data.split_by_task(episodes, cfg.eval_fraction, cfg.seed)
    cases, duplicates = data.eval_cases(fmt, held, snapshot_table(snapshots, tasks, held))
    cases = spread(cases, min(EVAL_STEPS, len(cases)))
    results = evaluate_models(model, tokenizer, cases, adapters, cap=cap,
                              max_tokens=cfg.eval_max_tokens or wm.max_tokens,
                              display=display, hf_options=wm.hf_options) if cases else {}
    out = {"held_out_tasks": len({e.task_id for e in held}), "steps": len(cases),
           "duplicate_steps_removed": duplicates,
           "determinism_ceiling": data.determinism_ceiling(sources, held), "models": results}
    names = [n for n in adapters if n != "base"]
    if results and names:
        out["gain"] = gain(results["base"], results[names[-1]])
    return out
