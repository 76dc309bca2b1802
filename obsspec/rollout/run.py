"""`obsspec rollout`: a batch of episodes, sequential, speculative or both side by side.

    summary = run_rollout(recipe, out_dir="runs/rollout", mode="both", live="auto")

Writes under `out_dir`:
- `episodes.jsonl`                 the tasks in episode order (what --replay needs)
- `trajectories-<mode>.jsonl`      token ids, masks, logprobs, turns, reward per episode
- `trace-<mode>.jsonl`             every event; `trace.json` is the Chrome/Perfetto timeline
- `summary.json`                   the side-by-side table and whether the modes were token-identical
With `replay_dir`, tools are not executed: each episode answers from that run's recorded
observations and recorded tool latencies, to evaluate another predictor on the same episodes.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics

from obsspec.config import Recipe
from obsspec.env.suite import load_tasks, prepare_tasks, spread, suite_settings
from obsspec.env.task import Task
from obsspec.jsonl import read_jsonl
from obsspec.rollout.events import EventBus, JsonlTrace
from obsspec.rollout.metrics import SpecMetrics, export_chrome_trace
from obsspec.rollout.predictors import HistoryCache, NoPredictor, Oracle, WorldModelPredictor
from obsspec.rollout.config import sampling
from obsspec.rollout.scheduler import Scheduler
from obsspec.rollout.tools import EmulatedLatency, ReplayTool, SandboxTool
from obsspec.rollout.trajectory import Trajectory
from obsspec.ui.display import Display
from obsspec.worldmodel.adapters import resolve_adapter


class RolloutError(ValueError):
    """A problem with the user's inputs (missing replay run, oracle without a recording)."""


# ---------------------------------------------------------------------------------------------
# Inputs: tasks, models, engines


async def ensure_tasks(recipe: Recipe, display: Display) -> str:
    """The recipe's prepared task suite (rollout.tasks_dir or RUN_DIR/tasks), prepared if missing."""
    tasks_dir = recipe.rollout.tasks_dir or os.path.join(recipe.run_dir, "tasks")
    if not os.path.exists(os.path.join(tasks_dir, "trajectories.jsonl")):
        display.log(f"no prepared task suite at {tasks_dir}: preparing it now")
        await prepare_tasks(recipe, tasks_dir, display)
    elif not recipe.rollout.tasks_dir:
        # RUN_DIR/tasks is the recipe's own suite: one prepared from other tasks.* settings (another
        # recipe's, or before an override) would be used silently while recipe.json says otherwise
        manifest = os.path.join(tasks_dir, "manifest.json")
        built = None
        if os.path.exists(manifest):
            with open(manifest) as f:
                built = json.load(f).get("tasks")
        want = suite_settings(recipe.tasks)
        if built is not None and built != want:
            keys = sorted(k for k in set(built) | set(want) if built.get(k) != want.get(k))
            raise RolloutError(f"{tasks_dir} was prepared with other settings of tasks.{', tasks.'.join(keys)}: "
                               f"prepare it again (obsspec prepare-tasks RECIPE --out {tasks_dir}), or name a "
                               "suite with rollout.tasks_dir")
    return tasks_dir


async def episode_tasks(recipe: Recipe, display: Display) -> list[Task]:
    cfg = recipe.rollout
    tasks_dir = await ensure_tasks(recipe, display)
    tasks = load_tasks(os.path.join(tasks_dir, f"{cfg.split}.jsonl"))
    tasks = spread(tasks, min(cfg.num_tasks, len(tasks)))
    if not tasks:
        raise RolloutError(f"{tasks_dir}: the {cfg.split} split has no tasks "
                           f"(choose rollout.split=train, or prepare more instances)")
    return [t for t in tasks for _ in range(cfg.group_size)]


def model_paths(recipe: Recipe, display: Display) -> tuple[str, str]:
    """Policy and world-model locations; builds the tiny kit when either is 'tiny'."""
    policy, wm = recipe.policy.model, recipe.world_model.model
    for section, name in (("policy", policy), ("world_model", wm)):
        # a local folder that is not there fails now, not after minutes of kit build
        if name.startswith(("/", "./", "../", "~")) and not os.path.isdir(os.path.expanduser(name)):
            raise RolloutError(f"{section}.model: no model folder at {name}")
    if "tiny" in (policy, wm):
        from obsspec.models.kit import kit_for

        kit = kit_for(recipe, recipe.rollout.tasks_dir or os.path.join(recipe.run_dir, "tasks"), display)
        policy = kit.policy if policy == "tiny" else policy
        wm = kit.world_model if wm == "tiny" else wm
    return policy, wm


def make_engine(cfg, path: str, max_batch_size: int = 32, **hf_options):
    """(engine, tokenizer) for a policy or world-model section: the engine the recipe names
    (`hf_options`: the world model's `WorldModelConfig.hf_options`, for the hf engine)."""
    if cfg.engine == "vllm":
        from transformers import AutoTokenizer

        from obsspec.engines.vllm import VLLMEngine

        return VLLMEngine(cfg.server_url, path), AutoTokenizer.from_pretrained(path)
    from obsspec.engines.hf import HFEngine
    from obsspec.models.tiny import load_pretrained

    model, tokenizer = load_pretrained(path, device=cfg.device)
    return HFEngine(model, tokenizer, batch_invariant=cfg.batch_invariant,
                    max_batch_size=max_batch_size, device=cfg.device, **hf_options), tokenizer


def world_model_engine(recipe, wm_path: str, policy_tokenizer):
    """The world model's engine as the recipe says, checked against the policy's tokenizer."""
    wm = recipe.world_model
    engine, tokenizer = make_engine(wm, wm_path, **wm.hf_options)
    check_same_tokenizer(policy_tokenizer, tokenizer, wm_path)
    return engine


def check_same_tokenizer(policy_tokenizer, wm_tokenizer, wm_path: str) -> None:
    """Exact match compares token ids: the world model must share the policy's tokenizer."""
    if policy_tokenizer.get_vocab() != wm_tokenizer.get_vocab():
        raise RolloutError(f"the world model ({wm_path}) does not use the policy's tokenizer: "
                           "drafts are compared token for token, so both must share one vocabulary")


# ---------------------------------------------------------------------------------------------


async def _run(recipe: Recipe, out_dir: str, mode: str, replay_dir: str, live, display: Display) -> dict:
    from obsspec.tokens import ChatFormat

    cfg, pol = recipe.rollout, recipe.policy
    adapter = resolve_adapter(recipe.world_model.adapter)  # a bad one fails now, not after the kit
    if replay_dir:
        episodes, recorded = _load_replay(replay_dir)
    else:
        episodes, recorded = await episode_tasks(recipe, display), None
    policy_path, wm_path = model_paths(recipe, display)
    policy, tokenizer = make_engine(pol, policy_path, pol.max_batch_size)
    fmt = ChatFormat(tokenizer)
    wm_engine = None
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "episodes.jsonl"), "w") as f:
        for i, t in enumerate(episodes):
            f.write(json.dumps({"episode": i, "task": t.to_dict()}, sort_keys=True) + "\n")

    settings = sampling(pol, cfg.seed)
    modes = ["sequential", "speculative"] if mode == "both" else [mode]
    results: dict[str, list[Trajectory]] = {}
    summaries: dict[str, dict] = {}
    try:
        for m in modes:
            predictor = None
            if m == "speculative":
                if cfg.predictor == "world_model" and wm_engine is None:
                    wm_engine = world_model_engine(recipe, wm_path, tokenizer)
                    if adapter is not None:
                        await wm_engine.load_adapter(adapter.name, adapter.path)
                predictor = _predictor(recipe, fmt, wm_engine, results.get("sequential"), recorded, episodes,
                                       adapter.name if adapter else None)
            bus = EventBus()
            metrics = SpecMetrics()
            trace = JsonlTrace(os.path.join(out_dir, f"trace-{m}.jsonl"), m)
            bus.subscribe(metrics)
            bus.subscribe(trace)
            sched = Scheduler(policy, fmt, bus, settings, cap=recipe.sandbox.output_cap, predictor=predictor,
                              depth=recipe.rollout.depth, busy_limit=cfg.busy_limit)
            live.start(metrics, len(episodes), f"{m} rollout", speculative=m == "speculative")
            try:
                results[m] = await sched.run_batch(
                    episodes, tool_factory(recipe, recorded), speculative=(m == "speculative"),
                    concurrency=cfg.concurrency)
            finally:
                live.stop()
                trace.close()
            summaries[m] = {**metrics.summary(),
                            "predictor": predictor.name if predictor else None}
            with open(os.path.join(out_dir, f"trajectories-{m}.jsonl"), "w") as f:
                for tr in results[m]:
                    f.write(json.dumps(tr.to_dict(), sort_keys=True) + "\n")
    finally:
        policy.close()
        if wm_engine is not None:
            wm_engine.close()
    _merge_traces(out_dir, modes)
    summary = {"command": "rollout", "out_dir": out_dir, "episodes": len(episodes),
               "replay_of": replay_dir or None, "modes": summaries,
               "tool_latency": {"emulated": cfg.latency.kind != "none", "kind": cfg.latency.kind,
                                "median_s": cfg.latency.median_s}}
    if len(modes) == 2:
        summary["comparison"] = compare(results["sequential"], results["speculative"])
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    return summary


def _predictor(recipe: Recipe, fmt, wm_engine, sequential, recorded, episodes, adapter=None):
    kind = recipe.rollout.predictor
    if kind == "none":
        return NoPredictor()
    if kind == "history":
        return HistoryCache()
    if kind == "oracle":
        source = sequential or (recorded and [Trajectory.from_dict(r) for r in recorded])
        if not source:
            raise RolloutError("rollout.predictor=oracle needs recorded observations: use "
                               "--mode both (it records the sequential run) or --replay RUN_DIR")
        return Oracle([(task.content_hash(), [t.command for t in tr.turns if t.kind == "bash"],
                        [t.observation for t in tr.turns if t.kind == "bash"])
                       for task, tr in zip(episodes, source)])
    return world_model_predictor(recipe, fmt, wm_engine, adapter, recipe.rollout.seed)


def world_model_predictor(recipe: Recipe, fmt, wm_engine, adapter: str | None, seed: int):
    """The recipe's world model as a predictor (`adapter`: the loaded adapter's name, or None);
    with `world_model.workspace_snapshot`, it reads each task's snapshot ahead of the context
    (`predictor.snapshots.prefixes(trajectories)` gives co-training the same prefixes)."""
    wm = recipe.world_model
    return WorldModelPredictor(wm_engine, fmt, cap=recipe.sandbox.output_cap, max_tokens=wm.max_tokens,
                               breadth=recipe.rollout.breadth, temperature=wm.temperature,
                               adapter=adapter, seed=seed, snapshots=workspace_snapshots(fmt, recipe))


def workspace_snapshots(fmt, recipe: Recipe):
    """A snapshot builder (`WorkspaceSnapshots`: each task's built once) when the recipe's world
    model reads a workspace snapshot (`world_model.workspace_snapshot`), else None."""
    wm = recipe.world_model
    if not wm.workspace_snapshot:
        return None
    from obsspec.worldmodel.snapshot import WorkspaceSnapshots

    return WorkspaceSnapshots(fmt, wm.snapshot_tokens, recipe.sandbox)


def tool_factory(recipe: Recipe, recorded, latency: bool = True):
    """(task, episode) -> Tool: a replay of `recorded` episodes, else a real sandbox with the
    recipe's emulated latency (`latency=False`: without it)."""
    if recorded is not None:
        return lambda task, episode: ReplayTool(recorded[episode]["turns"], recorded[episode]["reward"])
    extra = recipe.rollout.latency if latency else EmulatedLatency()
    return lambda task, episode: SandboxTool(task, episode, recipe.sandbox, extra)


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
    by_tool, by_policy, same = [], [], []
    for a, b in zip(seq, spec):
        if a.tokens_equal(b) and a.reward == b.reward and \
                all(abs(x - y) <= 1e-4 for x, y in zip(a.logprobs, b.logprobs)):
            same.append((a, b))
            continue
        i = next((k for k, (x, y) in enumerate(zip(a.ids, b.ids)) if x != y), min(len(a.ids), len(b.ids)))
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
        "episodes_compared_for_latency": len(pairs),
        "latency_mean_sequential_sec": seq_mean, "latency_mean_speculative_sec": spec_mean,
        "mean_latency_reduction": (1 - spec_mean / seq_mean) if pairs and seq_mean else None,
        "mean_per_episode_reduction": statistics.fmean(1 - b / a for a, b in pairs) if pairs else None,
    }


def run_rollout(recipe: Recipe, out_dir: str, mode: str, replay_dir: str, live, display: Display) -> dict:
    return asyncio.run(_run(recipe, out_dir, mode, replay_dir, live, display))
