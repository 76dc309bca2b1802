"""The episodes a kit build runs in real sandboxes (obsspec/models/kit.py): its edited reference
solutions (`kit.mistakes`), generated instances of the suite's families (`kit.world_model_tasks`,
`kit.policy_tasks`), the warm policy's own rollouts (`kit.rollouts`) and the workspaces' texts the
snapshots and hints are cut from. Each runs in an event loop of its own (`run_apart`): a kit is
also built from async code.

    rows = suite_mistakes(tasks_dir, cfg, sandbox, display)
    kept = generated_rows(tasks_dir, "world_model_tasks", cfg, sandbox, display, done, episodes)
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

from obsspec.env.sandbox import SandboxConfig
from obsspec.models.config import KitConfig
from obsspec.progress import Display
from obsspec.rollout.scheduler import Sampling

# Sandboxes a kit build runs at once (its policy's rollouts, world_model_tasks, mistakes): enough
# to keep 2 cores busy while the tiny policy generates; it changes the build's time, not its output.
SANDBOXES_AT_ONCE = 8
TRAIN_TASKS = "train.jsonl"


async def workspace_texts_of(tasks_dir: str, sandbox: SandboxConfig, workers: int,
                           tasks: list | None = None) -> dict[str, str]:
    """task_id -> workspace snapshot text for `tasks` (default: every task of the suite)."""
    from obsspec.env.suite import load_tasks
    from obsspec.worldmodel.snapshot import workspace_texts

    return await workspace_texts(load_tasks(tasks_dir) if tasks is None else tasks, sandbox, workers)




def suite_mistakes(tasks_dir: str, cfg: KitConfig, sandbox: SandboxConfig, display: Display) -> list[dict]:
    """`mistake_episodes` of the suite's train tasks."""
    from obsspec.env.suite import load_tasks

    return run_apart(mistake_episodes(load_tasks(os.path.join(tasks_dir, TRAIN_TASKS)), cfg, sandbox, display))


async def mistake_episodes(tasks: list, cfg: KitConfig, sandbox: SandboxConfig, display: Display) -> list[dict]:
    """`cfg.mistakes` episodes per task of its reference solution with one command edited
    (`with_mistake`, seeded by the kit's seed, the task and the episode's index), run in real
    sandboxes without the verifier: trajectories.jsonl-like rows, `reward` None. An episode the
    sandbox failed to run (`infra_error`) is left out; a task without a solution has none."""
    import random

    from obsspec.env.episode import run_scripted
    from obsspec.env.mistakes import with_mistake

    jobs = [(task, with_mistake(task.solution, random.Random(f"{cfg.seed}/kit.mistakes/{task.task_id}/{k}")))
            for task in tasks if task.solution for k in range(cfg.mistakes)]
    gate = asyncio.Semaphore(SANDBOXES_AT_ONCE)
    display.start(len(jobs), "reference solutions with a mistake, in the sandbox")

    async def one(task, commands):
        async with gate:
            record = await run_scripted(task, commands, sandbox, verify=False)
        display.advance(1)
        return task, record

    try:
        results = await asyncio.gather(*(one(t, c) for t, c in jobs))
    finally:
        display.finish()
    return [{**record.to_dict(), "family": task.family, "instruction": task.instruction, "split": "train"}
            for task, record in results if not record.infra_error]


def mistake_stats(rows: list[dict]) -> dict:
    steps = [s for r in rows for s in r["steps"]]
    return {"episodes": len(rows), "steps": len(steps),
            "failed_steps": sum(s.get("exit_code", 0) != 0 for s in steps)}


# ids of generated instances, never those of a suite task
GENERATED_PREFIX = {"world_model_tasks": "wm-", "policy_tasks": "pt-"}
WM_TASK_PREFIX = GENERATED_PREFIX["world_model_tasks"]


def generated_tasks(tasks_dir: str, key: str, count: int, seed: int) -> tuple[list, list[str], int]:
    """`count` new instances of the train split's built-in families (`key`: world_model_tasks or
    policy_tasks), seeded apart from the suite by `seed` and `key`: (tasks, families, duplicates).
    An instance equal to a suite task (train or val: held-out tasks are never trained on) or to an
    earlier one is dropped and counted."""
    from obsspec.env.families import all_families
    from obsspec.env.suite import builtin_task, identity, instance_seed, load_tasks

    suite = load_tasks(tasks_dir)
    families = sorted({t.family for t in load_tasks(os.path.join(tasks_dir, TRAIN_TASKS))} & set(all_families()))
    if not families:
        raise ValueError(f"kit.{key}: {tasks_dir} has no train tasks of a built-in family "
                         "to generate more of (an imported suite has no generators): set it to 0")
    instances = instance_seed(seed, f"kit.{key}", 0)
    seen = {identity(t) for t in suite}
    tasks, duplicates = [], 0
    for i in range(count):
        task = builtin_task(families[i % len(families)], i // len(families), instances)
        ident = identity(task)
        if ident in seen:
            duplicates += 1
            continue
        seen.add(ident)
        tasks.append(dataclasses.replace(task, task_id=GENERATED_PREFIX[key] + task.task_id))
    return tasks, families, duplicates


def generated_rows(tasks_dir: str, key: str, cfg: KitConfig, sandbox: SandboxConfig, display: Display,
               done, episodes) -> list[tuple]:
    """`generated_tasks` of `cfg.<key>`, each run through its reference solution in a real
    sandbox: [(task, trajectories.jsonl-like row)] of those that scored 1 (one whose reference did
    not is dropped and counted). `episodes(name, run)` keeps the rows of a finished batch;
    `done(key, counts)` reports."""
    from obsspec.env.episode import run_scripted

    count = getattr(cfg, key)
    tasks, families, duplicates = generated_tasks(tasks_dir, key, count, cfg.seed)

    async def run() -> list[dict]:
        gate = asyncio.Semaphore(SANDBOXES_AT_ONCE)
        display.start(len(tasks), f"{key.replace('_', ' ')}: reference solutions in the sandbox")

        async def one(task):
            async with gate:
                record = await run_scripted(task, task.solution, sandbox)
            display.advance(1)
            return {**record.to_dict(), "family": task.family, "instruction": task.instruction, "split": "train"}

        try:
            return await asyncio.gather(*(one(t) for t in tasks))
        finally:
            display.finish()

    rows = {row["task_id"]: row for row in episodes(key, lambda: run_apart(run()))}
    kept = [(task, rows[task.task_id]) for task in tasks if rows[task.task_id].get("reward") == 1.0]
    done(key, {"generated": count, "duplicates": duplicates, "failed": len(tasks) - len(kept),
               "kept": len(kept), "families": families})
    return kept


def run_apart(coro):
    """Run `coro` to the end in an event loop of its own, in a thread of its own: ensure_kit is
    also called from async code."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def policy_rollouts(policy, tokenizer, fmt, tasks_dir: str, cfg: KitConfig, sandbox: SandboxConfig,
                     sampling: Sampling, display: Display):
    """`cfg.rollouts` sampled episodes of the warm-started policy on train tasks spread over the
    split, through the same episode loop as every rollout (the engine's fast batched mode: these
    are training data, not a losslessness check)."""
    from obsspec.engines.hf import fast_engine
    from obsspec.env.suite import load_tasks, spread
    from obsspec.rollout.batch import rollout_tasks

    picked = spread(load_tasks(os.path.join(tasks_dir, TRAIN_TASKS)), cfg.rollouts)

    async def run():
        async with fast_engine(policy, tokenizer) as engine:
            return await rollout_tasks(engine, fmt, picked, sandbox, sampling,
                                       concurrency=SANDBOXES_AT_ONCE, display=display,
                                       label="policy rollouts for the world model")

    return run_apart(run())
