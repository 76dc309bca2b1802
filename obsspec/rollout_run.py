"""`obsspec rollout`: a batch of episodes, sequential, speculative or both side by side.

    summary = run_rollout(recipe, out_dir="runs/rollout", mode="both", live="auto")

Each mode is one batch of obsspec/rollout/batch.py; its parts come from obsspec/build.py.
Writes under `out_dir`:
- `episodes.jsonl`                 the tasks in episode order (what --replay needs)
- `trajectories-<mode>.jsonl`      token ids, masks, logprobs, turns, reward per episode
- `trace-<mode>.jsonl`             every event; `trace.json` is the Chrome/Perfetto timeline
- `models.json`                    where the policy and the world model were loaded from
- `summary.json`                   the side-by-side table (the first pass of each mode), whether every
                                   pass was token-identical, and the reduction over `rollout.pairs`
                                   alternating pairs with its 95 % interval
With `replay_dir`, tools are not executed: each episode answers from that run's recorded
observations and recorded tool latencies, to evaluate another predictor on the same episodes.
A replay needs nothing but that directory: its tasks are in episodes.jsonl, and 'tiny' models
are the ones models.json names (the kit the recording used), while they are still there.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics

from obsspec.build import (RolloutError, ensure_tasks, launch_servers, make_engine, model_paths, predictor_for,
                           tool_factory, world_model_engine)
from obsspec.config import Recipe
from obsspec.engines.base import GenerationRequest
from obsspec.env.suite import load_tasks, spread
from obsspec.env.task import Task
from obsspec.jsonl import read_jsonl
from obsspec.progress import Display
from obsspec.rollout.batch import run_episodes, write_summary
from obsspec.rollout.config import make_gate, sampling
from obsspec.rollout.metrics import export_chrome_trace, mean_interval, verdict
from obsspec.rollout.trajectory import Trajectory
from obsspec.tokens import ChatFormat
from obsspec.worldmodel.adapters import resolve_adapter

MODELS = "models.json"


# ---------------------------------------------------------------------------------------------
# Inputs: the episodes


async def episode_tasks(recipe: Recipe, display: Display) -> list[Task]:
    """`rollout.num_tasks` tasks spread over the `rollout.split` split, each `train.group_size`
    times in a row (a GRPO group, as training runs them)."""
    cfg = recipe.rollout
    tasks_dir = await ensure_tasks(recipe, display)
    tasks = load_tasks(os.path.join(tasks_dir, f"{cfg.split}.jsonl"))
    tasks = spread(tasks, min(cfg.num_tasks, len(tasks)))
    if not tasks:
        raise RolloutError(f"{tasks_dir}: the {cfg.split} split has no tasks "
                           f"(choose rollout.split=train, or prepare more instances)")
    return [t for t in tasks for _ in range(recipe.train.group_size)]


# ---------------------------------------------------------------------------------------------


async def _run(recipe: Recipe, out_dir: str, mode: str, replay_dir: str, live, display: Display) -> dict:
    cfg, pol = recipe.rollout, recipe.policy
    adapter = resolve_adapter(recipe.world_model.adapter)  # a bad one fails now, not after the kit
    if replay_dir:
        episodes, recorded = _load_replay(replay_dir)
    else:
        episodes, recorded = await episode_tasks(recipe, display), None
    policy_path, wm_path = _recorded_models(recipe, replay_dir) or model_paths(recipe, display)
    servers = launch_servers(recipe, policy_path, wm_path, out_dir, display)
    try:
        return await _run_on(recipe, out_dir, mode, replay_dir, live, policy_path, wm_path, adapter,
                             episodes, recorded)
    finally:
        if servers is not None:
            servers.stop()


async def _run_on(recipe: Recipe, out_dir: str, mode: str, replay_dir: str, live, policy_path: str,
                  wm_path: str, adapter, episodes: list[Task], recorded) -> dict:
    cfg, pol = recipe.rollout, recipe.policy
    policy, tokenizer = make_engine(pol, policy_path, pol.max_batch_size)
    fmt = ChatFormat(tokenizer, **pol.chat_layout)
    wm_engine = None
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, MODELS), "w") as f:  # (folders absolute: a replay may run elsewhere)
        json.dump({section: os.path.abspath(p) if os.path.isdir(p) else p
                   for section, p in (("policy", policy_path), ("world_model", wm_path))}, f, indent=2)

    settings = sampling(pol, cfg.seed)
    runs: list[tuple[str, list[Trajectory]]] = []  # every pass, in the order run
    summaries: dict[str, dict] = {}
    try:
        if mode != "sequential" and cfg.predictor in ("world_model", "tiered"):
            wm_engine = world_model_engine(recipe.world_model, wm_path, tokenizer)
            if adapter is not None:
                await wm_engine.load_adapter(adapter.name, adapter.path)
        # before any pass is timed: no mode pays the first forward passes' warm-up alone
        for engine in (policy, wm_engine):
            if engine is not None:
                await warm_up(engine, fmt)
        # one gate for the run: what it learns of hit rates and costs carries from pass to pass,
        # sequential ones included (they are its cost model's samples with nothing speculative)
        gate = make_gate(cfg)
        for k, m in enumerate(passes(mode, cfg.pairs)):
            first = not any(mode_ == m for mode_, _ in runs)
            predictor = None
            if m == "speculative":
                # the oracle answers from the first sequential run, or from the replayed one
                source = next((t for mode_, t in runs if mode_ == "sequential"), None) or \
                    (recorded and [Trajectory.from_dict(r) for r in recorded]) if cfg.predictor == "oracle" else None
                predictor = predictor_for(recipe, fmt, wm_engine, episodes, source, adapter.name if adapter else None)
            # the first pass of each mode leaves the run's files; the later ones, their latencies
            batch = await run_episodes(
                policy, fmt, episodes, tool_factory(recipe.sandbox, cfg.latency, recorded), settings,
                cap=recipe.sandbox.output_cap,
                speculative=m == "speculative", predictor=predictor, depth=cfg.depth, busy_limit=cfg.busy_limit,
                gate=gate, concurrency=cfg.concurrency, out_dir=out_dir if first else "", live=live,
                title=f"{m} rollout" + (f" ({k // 2 + 1} of {cfg.pairs} pairs)" if mode == "both" else ""))
            runs.append((m, batch.trajectories))
            if first:
                summaries[m] = {**batch.metrics.summary(), "predictor": predictor.name if predictor else None}
    finally:
        policy.close()
        if wm_engine is not None:
            wm_engine.close()
    modes = list(summaries)
    _merge_traces(out_dir, modes)
    summary = {"command": "rollout", "out_dir": out_dir, "episodes": len(episodes),
               "replay_of": replay_dir or None, "modes": summaries,
               "tool_latency": {"emulated": cfg.latency.kind != "none", "kind": cfg.latency.kind,
                                "median_s": cfg.latency.median_s}}
    if len(modes) == 2:
        summary["comparison"] = compare_pairs(runs)
    write_summary(out_dir, summary)
    return summary


async def warm_up(engine, fmt: ChatFormat) -> None:
    """A few greedy tokens on a short prompt (the first passes allocate and load kernels)."""
    await engine.generate(GenerationRequest(fmt.prompt_ids("ls"), max_new_tokens=4, temperature=0))


def passes(mode: str, pairs: int) -> list[str]:
    """The batches a rollout runs: one mode once, or `pairs` pairs alternating which goes first
    (sequential, speculative, speculative, sequential, ...), so a drift of the machine over the
    run (warm-up, a neighbour's load) falls on both modes alike."""
    if mode != "both":
        return [mode]
    order = ("sequential", "speculative")
    return [m for k in range(pairs) for m in (order if k % 2 == 0 else order[::-1])]


def compare_pairs(runs: list[tuple[str, list[Trajectory]]]) -> dict:
    """`compare` of the first pair, token identity over every pass, and the reduction of each
    pair with its 95 % interval and a verdict ("not resolvable here" when it includes 0)."""
    seqs = [t for m, t in runs if m == "sequential"]
    specs = [t for m, t in runs if m == "speculative"]
    pairs = [compare(seq, spec) for seq, spec in zip(seqs, specs)]
    # each later speculative pass against the first sequential one too (the first pair is that)
    checks = pairs + [compare(seqs[0], spec) for spec in specs[1:]]
    out = dict(pairs[0])
    out["token_identical"] = all(c["token_identical"] for c in checks)
    out["episodes_differing"] = sorted({e for c in checks for e in c["episodes_differing"]})
    out["pairs"] = len(seqs)
    reductions = [p["mean_latency_reduction"] for p in pairs if p["mean_latency_reduction"] is not None]
    if reductions:
        interval = mean_interval(reductions)
        out["mean_latency_reduction"] = interval["mean"]
        out["reduction_ci95"] = interval["ci95"]
        out["reduction_per_pair"] = interval["runs"]
        out["verdict"] = verdict(interval)
    return out


def _recorded_models(recipe: Recipe, replay_dir: str) -> tuple[str, str] | None:
    """For a replay of a recipe with 'tiny' models: the kit the recording used (models.json),
    if it is still on this machine; None means build or find the models as usual."""
    path = os.path.join(replay_dir, MODELS) if replay_dir else ""
    if "tiny" not in (recipe.policy.model, recipe.world_model.model) or not os.path.exists(path):
        return None
    with open(path) as f:
        try:
            recorded = json.load(f)
        except ValueError:
            recorded = None
    if not isinstance(recorded, dict):
        raise RolloutError(f"{path}: not the models of a rollout run (a JSON object)")
    chosen = []
    for section, name in (("policy", recipe.policy.model), ("world_model", recipe.world_model.model)):
        if name == "tiny":
            name = recorded.get(section)
            if not isinstance(name, str) or not os.path.isdir(name):
                return None  # (another machine: the kit is built from the recipe's suite, as without a replay)
        chosen.append(name)
    return chosen[0], chosen[1]


def _load_replay(run_dir: str) -> tuple[list[Task], list[dict]]:
    eps = os.path.join(run_dir, "episodes.jsonl")
    for mode in ("sequential", "speculative"):
        path = os.path.join(run_dir, f"trajectories-{mode}.jsonl")
        if os.path.exists(path) and os.path.exists(eps):
            break
    else:
        raise RolloutError(f"{run_dir}: not a rollout run directory (no episodes.jsonl and "
                           "trajectories-*.jsonl)")
    rows = read_jsonl(eps, RolloutError)
    try:
        tasks = [Task.from_dict(row["task"]) for row in rows]
    except (KeyError, ValueError) as e:
        raise RolloutError(f"{eps}: not the episodes of a rollout run ({type(e).__name__}: {e})") from None
    return tasks, read_jsonl(path, RolloutError)


def _merge_traces(out_dir: str, modes: list[str]) -> None:
    merged = os.path.join(out_dir, "trace-all.jsonl")
    with open(merged, "w") as out:
        for m in modes:
            with open(os.path.join(out_dir, f"trace-{m}.jsonl")) as f:
                out.write(f.read())
    export_chrome_trace(merged, os.path.join(out_dir, "trace.json"))
    os.remove(merged)


def compare(seq: list[Trajectory], spec: list[Trajectory]) -> dict:
    """Token identity and latency reduction of speculative against sequential, per episode.

    An episode can differ for a reason speculation does not control: the tool printed something
    else the second time (e.g. two processes of a pipeline racing on stderr). Each differing
    episode is classified by its first differing token: inside an observation -> `tool`, inside
    an action -> `policy` (that one would be a losslessness bug, or batch effects in the
    engine's fast mode). Latency reduction is computed over token-identical episodes only, the
    only ones where the two runs did the same work.
    """
    by_tool, by_policy, same, tokens = [], [], [], 0
    for a, b in zip(seq, spec):
        if a.tokens_equal(b) and a.reward == b.reward and \
                all(abs(x - y) <= 1e-4 for x, y in zip(a.logprobs, b.logprobs)):
            same.append((a, b))
            continue
        i = next((k for k, (x, y) in enumerate(zip(a.ids, b.ids)) if x != y), min(len(a.ids), len(b.ids)))
        tokens += max(len(a.ids), len(b.ids)) - i  # from the first difference on
        in_action = i < len(a.policy_mask) and a.policy_mask[i] == 1
        (by_policy if in_action else by_tool).append(a.episode)
    pairs = [(a.latency_sec, b.latency_sec) for a, b in same
             if not a.infra_error and not b.infra_error and a.latency_sec > 0]
    seq_mean = statistics.fmean(p[0] for p in pairs) if pairs else None
    spec_mean = statistics.fmean(p[1] for p in pairs) if pairs else None
    return {
        "token_identical": not by_tool and not by_policy,
        "episodes_differing": sorted(by_tool + by_policy),
        "differing_first_in_observation": by_tool, "differing_first_in_action": by_policy,
        "tokens_differing": tokens,
        "episodes_compared_for_latency": len(pairs),
        "latency_mean_sequential_sec": seq_mean, "latency_mean_speculative_sec": spec_mean,
        "mean_latency_reduction": (1 - spec_mean / seq_mean) if pairs and seq_mean else None,
        "mean_per_episode_reduction": statistics.fmean(1 - b / a for a, b in pairs) if pairs else None,
    }


def run_rollout(recipe: Recipe, out_dir: str, mode: str, replay_dir: str, live, display: Display) -> dict:
    return asyncio.run(_run(recipe, out_dir, mode, replay_dir, live, display))
