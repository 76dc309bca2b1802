"""Rollout speed-up: sequential vs speculative, side by side in one run, against the bound.

    .venv/bin/python bench/rollout_speedup.py [--recipe recipes/tiny-cpu.yaml] [--episodes 32]
        [--latencies 0.3,1,3] [--predictors world_model,history,oracle] [--plot out.png] [key=value ...]

For each EMULATED tool latency median (log-normal, on top of the real sandbox time) it runs the
same episodes (tasks x seeds) once sequentially and once speculatively per predictor, plus a
predictor that never matches (an oracle with every draft spoiled), and reports per run:
- measured mean latency reduction (speculative vs sequential, over the episodes that came out
  token-identical: an episode whose tool printed something else the second time did other work);
- the bound of DESIGN.md section 7 from the measured per-turn tool time T, world-model time W,
  next-generation time G and hit rate a:  saving per turn = a * max(0, min(G, T - W));
- measured / bound (target >= 0.8), and whether the trajectories were token-identical.
Prints JSON; `--plot` draws measured vs bound per latency and predictor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from collections import defaultdict

from obsspec.config import load_recipe
from obsspec.rollout.events import EventBus
from obsspec.rollout.metrics import SpecMetrics
from obsspec.rollout.predictors import Corrupting
from obsspec.rollout.run import _predictor, _tool_factory, compare, episode_tasks, hf_engine, model_paths
from obsspec.rollout.scheduler import Sampling, Scheduler
from obsspec.tokens import ChatFormat
from obsspec.ui.display import PlainDisplay


class Timings:
    """Per-(episode, turn) tool time, generation time and world-model time, from events."""

    def __init__(self):
        self.start: dict = {}
        self.tool: dict = {}
        self.gen: dict = {}
        self.wm: dict = {}
        self.matched: set = set()

    def __call__(self, e) -> None:
        k = (e.episode, e.turn)
        if e.kind == "exec_done":
            self.tool[k] = e.data["seconds"]
        elif e.kind in ("policy_start", "wm_start") and not e.data.get("speculative"):
            self.start[(e.kind, k)] = e.t
        elif e.kind == "policy_done" and not e.data.get("speculative"):
            self.gen[k] = e.t - self.start.pop(("policy_start", k), e.t)
        elif e.kind == "match":
            self.matched.add(k)
        elif e.kind in ("wm_draft", "exec_won"):
            self.wm[k] = e.t - self.start.pop(("wm_start", k), e.t)


def bound(seq: Timings, spec: Timings, seq_latencies: dict[int, float], keep: set[int]) -> dict:
    """The section-7 bound over the episodes in `keep` (those that were token-identical)."""
    turns = [k for k in seq.tool if (k[0], k[1] + 1) in seq.gen and k[0] in keep]
    a = sum(1 for k in turns if k in spec.matched) / len(turns) if turns else 0.0
    w_mean = statistics.fmean(spec.wm.values()) if spec.wm else 0.0
    saving = sum(a * max(0.0, min(seq.gen[(e, t + 1)], seq.tool[(e, t)] - spec.wm.get((e, t), w_mean)))
                 for e, t in turns)
    total = sum(v for e, v in seq_latencies.items() if e in keep)
    return {"hit_rate_a": a, "T_mean": statistics.fmean(seq.tool[k] for k in turns) if turns else None,
            "G_mean": statistics.fmean(seq.gen[(e, t + 1)] for e, t in turns) if turns else None,
            "W_mean": w_mean, "bound_reduction": saving / total if total else None}


async def run_mode(recipe, episodes, policy, fmt, speculative, predictor, sampling):
    bus = EventBus()
    metrics, timings = SpecMetrics(), Timings()
    bus.subscribe(metrics)
    bus.subscribe(timings)
    sched = Scheduler(policy, fmt, bus, sampling, cap=recipe.sandbox.output_cap, predictor=predictor)
    trajs = await sched.run_batch(episodes, _tool_factory(recipe, None), speculative,
                                  concurrency=recipe.rollout.concurrency)
    return trajs, metrics, timings


async def main_async(args) -> dict:
    base = load_recipe(args.recipe, args.overrides)
    display = PlainDisplay()
    n_tasks = max(1, args.episodes // base.rollout.group_size)
    base = load_recipe(args.recipe, [*args.overrides, f"rollout.num_tasks={n_tasks}"])
    episodes = await episode_tasks(base, display)
    policy_path, wm_path = model_paths(base, display)
    policy, tokenizer = hf_engine(policy_path, base.policy.batch_invariant, base.policy.device)
    fmt = ChatFormat(tokenizer)
    wm_engine = None
    if "world_model" in args.predictors:
        wm_engine, _ = hf_engine(wm_path, base.world_model.batch_invariant, base.world_model.device)
    p = base.policy
    sampling = Sampling(p.max_turns, p.max_new_tokens, p.max_context, p.temperature, p.top_p, base.rollout.seed)
    rows = []
    try:
        # Warm-up, discarded: the first pass over new shapes is slower (kernel/primitive caches),
        # which would otherwise flatter every run after the first sequential baseline.
        await run_mode(base, episodes, policy, fmt, False, None, sampling)
        for median in args.latencies:
            recipe = load_recipe(args.recipe, [*args.overrides, f"rollout.num_tasks={n_tasks}",
                                               "rollout.latency.kind=lognormal",
                                               f"rollout.latency.median_s={median}"])
            seq, seq_metrics, seq_t = await run_mode(recipe, episodes, policy, fmt, False, None, sampling)
            seq_lat = {t.episode: t.latency_sec for t in seq}
            # A/A: the same sequential run again. Its "reduction" is the noise and order effect
            # every other row carries (it should be ~0; if not, read the rows relative to it).
            again, _, _ = await run_mode(recipe, episodes, policy, fmt, False, None, sampling)
            aa = compare(seq, again)
            rows.append({"latency_median_s (emulated)": median, "predictor": "A/A sequential again",
                         "episodes": len(episodes), "measured_reduction": aa["mean_latency_reduction"],
                         "episodes_identical": aa["episodes_compared_for_latency"]})
            print(json.dumps(rows[-1]), flush=True)
            for name in [*args.predictors, "never_matches"]:
                kind = "oracle" if name == "never_matches" else name
                r = load_recipe(args.recipe, [*args.overrides, f"rollout.predictor={kind}"])
                predictor = _predictor(r, fmt, wm_engine, seq, None, episodes)
                if name == "never_matches":
                    predictor = Corrupting(predictor, every=1)
                spec, m, spec_t = await run_mode(recipe, episodes, policy, fmt, True, predictor, sampling)
                comp = compare(seq, spec)
                keep = {t.episode for t in seq} - set(comp["episodes_differing"])
                b = bound(seq_t, spec_t, seq_lat, keep)
                row = {"latency_median_s (emulated)": median, "predictor": name, "episodes": len(episodes),
                       "measured_reduction": comp["mean_latency_reduction"], **b,
                       "measured_over_bound": (comp["mean_latency_reduction"] / b["bound_reduction"]
                                               if b["bound_reduction"] else None),
                       "token_identical": comp["token_identical"],
                       "episodes_identical": len(keep),
                       "differing_first_in_observation": len(comp["differing_first_in_observation"]),
                       "differing_first_in_action": len(comp["differing_first_in_action"]),
                       "spec/exact_frac": m.summary()["spec/exact_frac"],
                       "spec/exec_won_frac": m.summary()["spec/exec_won_frac"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        policy.close()
        if wm_engine is not None:
            wm_engine.close()
    return {"rows": rows, "recipe": args.recipe, "overrides": args.overrides}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_pred = defaultdict(list)
    for r in result["rows"]:
        by_pred[r["predictor"]].append(r)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in by_pred.items():
        xs = [r["latency_median_s (emulated)"] for r in rows]
        line = ax.plot(xs, [100 * (r["measured_reduction"] or 0) for r in rows], marker="o", label=f"{name} measured")
        ax.plot(xs, [100 * (r["bound_reduction"] or 0) for r in rows], ls="--", color=line[0].get_color(),
                label=f"{name} bound")
    ax.set_xscale("log")
    ax.set_xlabel("emulated tool latency median (s)")
    ax.set_ylabel("mean latency reduction (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="recipes/tiny-cpu.yaml")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--latencies", default="0.3,1,3")
    ap.add_argument("--predictors", default="world_model,history,oracle")
    ap.add_argument("--plot", default="")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    args.latencies = [float(x) for x in args.latencies.split(",")]
    args.predictors = [p for p in args.predictors.split(",") if p]
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2))
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
