"""How well the models do their jobs: a policy's success on tasks, a world model's exact hits.

Run: python -m obsspec.models.evaluate TASKS_DIR [key=value ...] [--recipe recipes/tiny-cpu.yaml]
     [--policies untrained,warm] [--world-model kit] [--rollouts FILE] [--max-draft-tokens N]
     [--group-size 4] [--limit N] [--out eval.json]

- Policy: episodes are ordinary sequential rollouts through the rollout scheduler (the one
  episode loop of rollouts, evaluation and training), with the recipe's `policy` section as the
  sampling settings (temperature, budgets, turn limit) and real sandboxes, no emulated latency.
  `success_metrics` turns the trajectories into success rates, per family, and the share of
  GRPO groups with mixed outcomes (the groups that carry a learning signal).
- World model: every step of some trajectories (reference solutions, or a policy's own
  rollouts) becomes a case "context -> real observation body"; the draft comes from the same
  `WorldModelPredictor` the rollout uses and is judged exactly as the scheduler judges it (the
  normalised draft's body token ids equal the real body's). Figures overall and per command
  class (obsspec/commands.py), with the unusable-draft rate and draft latency.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from obsspec import chat
from obsspec.commands import command_class, first_program
from obsspec.env.sandbox import SandboxConfig
from obsspec.env.task import Task
from obsspec.rollout.events import EventBus
from obsspec.rollout.predictors import PredictRequest, WorldModelPredictor
from obsspec.rollout.scheduler import Sampling, Scheduler
from obsspec.rollout.tools import EmulatedLatency, SandboxTool
from obsspec.rollout.trajectory import Trajectory
from obsspec.tokens import ChatFormat, wm_context
from obsspec.ui.display import Display, NullDisplay


def _frac(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


# ---------------------------------------------------------------------------------------------
# Policy


async def rollout_tasks(engine, fmt: ChatFormat, tasks: list[Task], sandbox: SandboxConfig,
                        sampling: Sampling, *, concurrency: int = 4, display: Display | None = None,
                        label: str = "episodes") -> list[Trajectory]:
    """Sequential rollouts of `tasks` (episode i = tasks[i]) in real sandboxes, with progress."""
    display = display or NullDisplay()
    bus = EventBus()
    bus.subscribe(lambda e: display.advance(1) if e.kind == "episode_end" else None)
    scheduler = Scheduler(engine, fmt, bus, sampling, cap=sandbox.output_cap)
    display.start(len(tasks), label)
    try:
        return await scheduler.run_batch(
            tasks, lambda task, episode: SandboxTool(task, episode, sandbox, EmulatedLatency()),
            speculative=False, concurrency=concurrency)
    finally:
        display.finish()


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
# World model


@dataclass(frozen=True)
class WMCase:
    """One step: what the world model sees, and what the tool really printed."""

    prompt_ids: tuple[int, ...]   # history + action + observation opening (DESIGN.md section 2)
    body: str                     # the real observation body
    command: str
    tool_sec: float = 0.0         # the tool's latency for this step, when recorded


def reference_cases(fmt: ChatFormat, rows: list[dict],
                    snapshots: Mapping[str, Sequence[int]] | None = None) -> list[WMCase]:
    """Cases from reference trajectories (rows of a suite's trajectories.jsonl); `snapshots`:
    task_id -> workspace snapshot ids ahead of each prompt (`wm_context`)."""
    cases = []
    for row in rows:
        snapshot = snapshots[row["task_id"]] if snapshots is not None else ()
        history = fmt.prompt_ids(row["instruction"])
        for step in row["steps"]:
            action = fmt.action_ids(chat.render_bash(step["command"]))
            cases.append(WMCase(tuple(fmt.wm_prompt_ids(history, action, snapshot)), step["observation"],
                                step["command"]))
            history = history + action + fmt.observation_ids(step["observation"])[0]
    return cases


def trajectory_cases(fmt: ChatFormat, trajectories: list[Trajectory],
                     snapshots: Mapping[str, Sequence[int]] | None = None) -> list[WMCase]:
    """Cases from rollouts: each executed command's observation, with everything before it.

    The observation body starts where a run of `wm_mask` begins (error observations of malformed
    calls are not targets and carry no mask), so the prompt is exactly the rollout's context
    (after the task's workspace snapshot, with `snapshots`: task_id -> ids)."""
    cases = []
    for tr in trajectories:
        snapshot = snapshots[tr.task_id] if snapshots is not None else ()
        starts = [i for i, m in enumerate(tr.wm_mask) if m and (i == 0 or not tr.wm_mask[i - 1])]
        bash = [t for t in tr.turns if t.kind == "bash"]
        for start, turn in zip(starts, bash):
            cases.append(WMCase(tuple(wm_context(snapshot, tr.ids[:start])), turn.observation,
                                turn.command, turn.tool_sec))
    return cases


def is_hit(fmt: ChatFormat, draft_body: str | None, real_body: str, cap: int) -> bool:
    """The scheduler's test: the draft, normalised and encoded as a real observation, has the
    real observation's body token ids."""
    if draft_body is None:
        return False
    draft_ids, span = fmt.observation_ids(chat.normalize_draft(draft_body, cap=cap))
    real_ids, real_span = fmt.observation_ids(real_body)
    return draft_ids[span] == real_ids[real_span]


async def evaluate_world_model(engine, fmt: ChatFormat, cases: list[WMCase], cap: int,
                               max_tokens: int, *, concurrency: int = 4,
                               display: Display | None = None, label: str = "world model drafts",
                               adapter: str | None = None) -> dict:
    """Greedy drafts for `cases` (with LoRA adapter `adapter` loaded on the engine, or the base);
    exact-hit and unusable rates overall and per command class."""
    display = display or NullDisplay()
    predictor = WorldModelPredictor(engine, fmt, cap=cap, max_tokens=max_tokens, adapter=adapter)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, case: WMCase) -> tuple[bool, bool, float]:
        async with gate:
            t0 = time.monotonic()
            (draft,) = await predictor.predict(PredictRequest("", "", i, 0, (case.command,), case.prompt_ids))
            sec = time.monotonic() - t0
        display.advance(1)
        return draft.body is None, is_hit(fmt, draft.body, case.body, cap), sec

    display.start(len(cases), label)
    try:
        results = await asyncio.gather(*(one(i, c) for i, c in enumerate(cases)))
    finally:
        display.finish()
    by_class: dict[str, list[bool]] = defaultdict(list)
    sec_by_class: dict[str, list[float]] = defaultdict(list)
    for case, (_, hit, sec) in zip(cases, results):
        by_class[command_class(case.command, case.body)].append(hit)
        sec_by_class[command_class(case.command, case.body)].append(sec)
    tool = [c.tool_sec for c in cases if c.tool_sec > 0]
    draft_sec = statistics.fmean(r[2] for r in results) if results else None
    return {
        "steps": len(cases), "exact_frac": _frac(sum(r[1] for r in results), len(results)),
        "unusable_frac": _frac(sum(r[0] for r in results), len(results)),
        "per_class": {k: {"steps": len(v), "exact_frac": _frac(sum(v), len(v))}
                      for k, v in sorted(by_class.items())},
        "per_class_draft_sec_mean": {k: round(statistics.fmean(v), 4) for k, v in sorted(sec_by_class.items())},
        "classes_with_output_hit": sorted(k for k, v in by_class.items()
                                          if k not in ("no_output",) and any(v)),
        "draft_sec_mean": round(draft_sec, 4) if draft_sec is not None else None,
        "draft_concurrency": concurrency,
        "tool_sec_mean": round(statistics.fmean(tool), 4) if tool else None,
    }


# ---------------------------------------------------------------------------------------------


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


async def _main_async(args) -> dict:
    from obsspec.config import load_recipe
    from obsspec.engines.hf import HFEngine
    from obsspec.env.suite import load_tasks, spread
    from obsspec.models.kit import kit_for, read_trajectories
    from obsspec.models.tiny import load_pretrained
    from obsspec.rollout.config import sampling
    from obsspec.rollout.run import workspace_snapshots
    from obsspec.ui.display import make_display

    display = make_display(args.display)
    recipe = load_recipe(args.recipe, args.overrides)
    for path in args.rollouts:  # before any work, not after an hour of it
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--rollouts {path}: no such file")
    tasks = load_tasks(f"{args.tasks_dir}/val.jsonl")
    tasks = spread(tasks, args.limit) if args.limit else tasks
    episodes = [t for t in tasks for _ in range(args.group_size)]
    names = [n for n in args.policies.split(",") if n]
    settings = sampling(recipe.policy, recipe.rollout.seed)
    paths = kit_for(recipe, args.tasks_dir, display, cache_dir=args.cache) \
        if {"untrained", "warm"} & set(names) or args.world_model == "kit" else None
    results: dict = {"command": " ".join(["python -m obsspec.models.evaluate", *args.argv]),
                     "kit": paths.root if paths else None, "sampling": settings.__dict__}
    trajectories: list[Trajectory] = []
    for which in names:
        model, tokenizer = _policy(which, paths, recipe.kit)
        async with HFEngine(model, tokenizer, batch_invariant=False) as engine:
            trajectories = await rollout_tasks(engine, ChatFormat(tokenizer), episodes, recipe.sandbox,
                                               settings, concurrency=args.workers, display=display,
                                               label=f"policy {which}")
        results[which] = success_metrics(episodes, trajectories, args.group_size)
        display.log(f"{which}: " + json.dumps(results[which]))
        if args.out:  # the episodes themselves, for a later --rollouts
            with open(f"{args.out}.{_slug(which)}.trajectories.jsonl", "w") as f:
                f.writelines(json.dumps(tr.to_dict(), sort_keys=True) + "\n" for tr in trajectories)
    if args.world_model:
        rows = [r for r in read_trajectories(args.tasks_dir) if r.get("split") == "val"]
        rows = spread(rows, args.limit) if args.limit else rows
        model, tokenizer = load_pretrained(paths.world_model if args.world_model == "kit" else args.world_model)
        fmt = ChatFormat(tokenizer)
        recorded = {f"rollouts_{_slug(names[-1])}": trajectories} if trajectories else {}
        for path in args.rollouts:
            with open(path) as f:
                recorded[f"rollouts_{_slug(path)}"] = [Trajectory.from_dict(json.loads(line)) for line in f
                                                       if line.strip()]
        snapshots = None
        builder = workspace_snapshots(fmt, recipe)
        if builder is not None:  # the prefix the rollout's drafts have, for the tasks judged only
            ids = {r["task_id"] for r in rows} | {tr.task_id for trs in recorded.values() for tr in trs}
            snapshots = await builder.table([t for t in load_tasks(args.tasks_dir) if t.task_id in ids])
        sources = {"reference": reference_cases(fmt, rows, snapshots),
                   **{name: trajectory_cases(fmt, trs, snapshots) for name, trs in recorded.items()}}
        async with HFEngine(model, tokenizer, batch_invariant=False,
                            **recipe.world_model.hf_options) as engine:
            for name, cases in sources.items():
                results[f"world_model_{name}"] = await evaluate_world_model(
                    engine, fmt, cases, recipe.sandbox.output_cap,
                    args.max_draft_tokens or recipe.world_model.max_tokens,
                    display=display, label=f"world model on {name}")
                display.log(f"world model on {name}: " + json.dumps(results[f"world_model_{name}"]))
    return results


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m obsspec.models.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("tasks_dir", help="a prepared task suite; its val split is evaluated")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. policy.temperature=0.7")
    p.add_argument("--recipe", default="recipes/tiny-cpu.yaml", help="recipe (sampling, sandbox, kit)")
    p.add_argument("--cache", default=None, help="kit cache (default: the recipe's rollout.kit_cache)")
    p.add_argument("--policies", default="warm",
                   help="comma-separated: untrained, warm, or a model folder / hub name")
    p.add_argument("--world-model", default="", help="also score a world model's greedy drafts on the "
                   "val reference steps and on the last policy's rollouts: 'kit' or a model folder")
    p.add_argument("--rollouts", action="append", default=[], metavar="FILE",
                   help="also score the world model on the steps of recorded episodes (a "
                        "trajectories JSONL of a rollout run or of an earlier --out); repeatable")
    p.add_argument("--max-draft-tokens", type=int, default=0,
                   help="cap world-model drafts here instead of world_model.max_tokens (faster; a "
                        "draft that needs more counts as unusable)")
    p.add_argument("--group-size", type=int, default=4, help="episodes per task (a GRPO group)")
    p.add_argument("--limit", type=int, default=0, help="evaluate N val tasks spread over the split (0 = all)")
    p.add_argument("--workers", type=int, default=8, help="concurrent episodes")
    p.add_argument("--out", default="", help="write the results as JSON here")
    p.add_argument("--display", default="auto", choices=["auto", "rich", "plain", "none"])
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    from obsspec.config import ConfigError
    from obsspec.env.suite import SuiteError

    try:
        results = asyncio.run(_main_async(args))
    except (ConfigError, SuiteError, FileNotFoundError) as e:  # the user's inputs: one line
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
