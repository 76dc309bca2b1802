"""Rollout speed-up: sequential vs speculative, interleaved in one run, against the bound.

    .venv/bin/python bench/rollout_speedup.py [--recipe recipes/tiny-cpu.yaml] [--episodes 32]
        [--latencies 0.3,1,3] [--predictors world_model,history,oracle] [--reps 3] [--warmup 1]
        [--threads 0]
        [--plot out.png] [--out result.json] [key=value ...]
    A predictor name may carry options: world_model:busy2 runs with rollout.busy_limit=2,
    oracle:nogate with the speculation gate off (rollout.gate=false).

For each EMULATED tool latency median (log-normal, on top of the real sandbox time) and each
repetition it runs the same episodes (tasks x seeds) as: sequential, every predictor's
speculative run, sequential again (ABA; odd repetitions run the predictors in reverse order, so a
slow drift of the machine cancels out). The predictors are the requested ones plus
`never_matches` (an oracle with every draft spoiled: the pure cost of speculating). Per run:
- measured latency reduction: 1 - sum(speculative latency) / sum(sequential latency), the
  sequential latency of an episode being the mean of the two sequential runs around it, over
  the episodes that came out token-identical in all three (an episode whose tool printed
  something else another time did other work);
- A/A: the second sequential run against the first, the noise every row carries;
- the bound (docs/ROLLOUT.md, "How much speculation can save") from the measured per-turn tool time T, world-model time W,
  next-generation time G and hit rate a:  saving per turn = a * max(0, min(G, T - W)).
Per (latency, predictor) it reports the mean over repetitions with a 95 % interval, the bound,
and measured / bound (target >= 0.8; never_matches: cost <= 2 %). Prints JSON lines as it goes and
the whole result at the end; `--plot` draws measured vs bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from collections import defaultdict

from provenance import stamp

from obsspec.config import load_recipe
from obsspec.rollout.predictors import Corrupting
from obsspec.rollout.config import make_gate, sampling as make_sampling
from obsspec.rollout.metrics import mean_interval as mean_ci
from obsspec.build import make_engine, model_paths, predictor_for, tool_factory
from obsspec.rollout.batch import run_episodes
from obsspec.rollout_run import compare, episode_tasks
from obsspec.tokens import ChatFormat
from obsspec.progress import PlainDisplay

class Timings:
    """Per-(episode, turn) tool time, generation time and world-model time, from events."""

    def __init__(self):
        self.start: dict = {}
        self.tool: dict = {}
        self.gen: dict = {}
        self.wm: dict = {}
        self.source: dict = {}  # (episode, turn) -> the draft's source, "no_draft" or "outrun" (the tool won)
        self.matched: set = set()

    def __call__(self, e) -> None:
        k = (e.episode, e.turn)
        if e.kind == "exec_done":
            self.tool[k] = e.data["seconds"]
        elif e.kind == "wm_start":
            self.start[e.data["request_id"]] = e.t
        elif e.kind == "policy_start" and not e.data.get("speculative"):
            self.start[("policy", k)] = e.t
        elif e.kind == "policy_done" and not e.data.get("speculative"):
            self.gen[k] = e.t - self.start.pop(("policy", k), e.t)
        elif e.kind == "match":
            self.matched.add(k)
        elif e.kind in ("wm_draft", "exec_won"):
            self.wm[k] = e.t - self.start.pop(e.data["request_id"], e.t)
            self.source[k] = "outrun" if e.kind == "exec_won" else e.data.get("source") or "no_draft"


def bound(seq: Timings, spec: Timings, seq_latency: dict[int, float], keep: set[int]) -> dict:
    """The section-7 bound over the episodes in `keep`, from one sequential run's T and G."""
    turns = [k for k in seq.tool if (k[0], k[1] + 1) in seq.gen and k[0] in keep]
    a = sum(1 for k in turns if k in spec.matched) / len(turns) if turns else 0.0
    w_mean = statistics.fmean(spec.wm.values()) if spec.wm else 0.0
    saving = sum(a * max(0.0, min(seq.gen[(e, t + 1)], seq.tool[(e, t)] - spec.wm.get((e, t), w_mean)))
                 for e, t in turns)
    total = sum(v for e, v in seq_latency.items() if e in keep)
    return {"a": a, "T": statistics.fmean(seq.tool[k] for k in turns) if turns else 0.0,
            "G": statistics.fmean(seq.gen[(e, t + 1)] for e, t in turns) if turns else 0.0,
            "W": w_mean, "bound": saving / total if total else 0.0}


def first_turn_gen(t: Timings, keep: set[int]) -> float:
    xs = [g for (e, turn), g in t.gen.items() if turn == 0 and e in keep]
    return statistics.fmean(xs) if xs else 0.0


def engine_counts(engine) -> dict:
    """The policy engine's counters (hf engine; empty for an engine without them)."""
    stats = getattr(engine, "stats", None)
    return {k: getattr(stats, k) for k in ("prefills", "prefill_tokens", "prefill_sec",
                                                 "decode_steps", "decode_sec", "tokens")} if stats else {}


def workload_shape(trajs, keep: set[int]) -> dict:
    """What the simulator needs to know of the episodes (one sequential run): turns by kind, the
    tokens of each action and the prompt it was generated on."""
    prompts, actions, kinds = [], [], defaultdict(int)
    for t in trajs:
        if t.episode not in keep:
            continue
        for i, m in enumerate(t.policy_mask):
            if m and (i == 0 or not t.policy_mask[i - 1]):
                prompts.append(i)
                actions.append(0)
            if m:
                actions[-1] += 1
        for turn in t.turns:
            kinds[turn.kind] += 1
    n = max(1, len(keep))
    return {"episodes": len(keep), "turns_per_episode": {k: v / n for k, v in sorted(kinds.items())},
            "action_tokens_mean": statistics.fmean(actions) if actions else 0.0,
            "action_tokens_log_sd": statistics.pstdev(math.log(n) for n in actions) if actions else 0.0,
            "prompt_tokens_mean": statistics.fmean(prompts) if prompts else 0.0,
            "prompt_tokens_first": statistics.fmean(t.prompt_len for t in trajs if t.episode in keep) if keep else 0.0}


class Bench:
    def __init__(self, args):
        self.args = args

    def recipe(self, *extra):
        return load_recipe(self.args.recipe, [*self.args.overrides, f"rollout.num_tasks={self.n_tasks}", *extra])

    async def setup(self) -> None:
        base = load_recipe(self.args.recipe, self.args.overrides)
        self.n_tasks = max(1, self.args.episodes // base.train.group_size)
        base = self.recipe()
        display = PlainDisplay()
        self.episodes = await episode_tasks(base, display)
        policy_path, wm_path = model_paths(base, display)
        self.policy, tokenizer = make_engine(base.policy, policy_path)
        self.fmt = ChatFormat(tokenizer)
        self.wm_engine = None
        if any(split_name(n)[0] in ("world_model", "tiered") for n in self.args.predictors):
            self.wm_engine, _ = make_engine(base.world_model, wm_path, **base.world_model.hf_options)
        p = base.policy
        self.sampling = make_sampling(p, base.rollout.seed)
        self.base = base
        self.gates: dict = {}

    def close(self) -> None:
        self.policy.close()
        if self.wm_engine is not None:
            self.wm_engine.close()

    async def run(self, recipe, predictor=None, busy_limit: int | None = None, gate: bool = True, name: str = ""):
        timings = Timings()
        busy = recipe.rollout.busy_limit if busy_limit is None else busy_limit
        # one gate per predictor for the whole benchmark, as one serves a whole `obsspec rollout`
        # run: what it learns of hit rates and costs carries from repetition to repetition
        gating = self.gates.setdefault((name, recipe.rollout.latency.median_s), make_gate(recipe.rollout))
        gating.enabled = gate and recipe.rollout.gate
        before = engine_counts(self.policy)
        batch = await run_episodes(self.policy, self.fmt, self.episodes, tool_factory(recipe.sandbox, recipe.rollout.latency), self.sampling,
                                   cap=recipe.sandbox.output_cap, speculative=predictor is not None,
                                   predictor=predictor, depth=recipe.rollout.depth, busy_limit=busy, gate=gating,
                                   concurrency=recipe.rollout.concurrency, listeners=[timings])
        after = engine_counts(self.policy)
        return batch.trajectories, batch.metrics, timings, {k: after[k] - before[k] for k in after}

    def predictor(self, name: str, recorded):
        kind = "oracle" if name == "never_matches" else split_name(name)[0]
        r = self.recipe(f"rollout.predictor={kind}")
        p = predictor_for(r, self.fmt, self.wm_engine, self.episodes, recorded)
        return Corrupting(p, every=1) if name == "never_matches" else p

    async def repetition(self, median: float, rep: int, names: list[str], recorded) -> list[dict]:
        recipe = self.recipe("rollout.latency.kind=lognormal", f"rollout.latency.median_s={median}")
        seq_a = await self.run(recipe)
        specs = {}
        for name in (names if rep % 2 == 0 else names[::-1]):
            _, busy, gate = split_name(name)
            specs[name] = await self.run(recipe, self.predictor(name, recorded or seq_a[0]), busy, gate, name)
        seq_b = await self.run(recipe)
        aa = compare(seq_a[0], seq_b[0])
        all_eps = {t.episode for t in seq_a[0]}
        rows = [{"latency_median_s": median, "rep": rep, "predictor": "A/A",
                 "reduction": aa["mean_latency_reduction"] or 0.0,
                 "identical": aa["episodes_compared_for_latency"],
                 "G0_seq": first_turn_gen(seq_a[2], all_eps), "G0_spec": first_turn_gen(seq_b[2], all_eps)}]
        for name, (trajs, m, timings, _) in specs.items():
            ca, cb = compare(seq_a[0], trajs), compare(seq_b[0], trajs)
            differing = set(ca["episodes_differing"]) | set(cb["episodes_differing"]) | set(aa["episodes_differing"])
            keep = {t.episode for t in trajs if not t.infra_error} - differing
            base = sum((a.latency_sec + b.latency_sec) / 2 for a, b in zip(seq_a[0], seq_b[0]) if a.episode in keep)
            spec = sum(t.latency_sec for t in trajs if t.episode in keep)
            bounds = [bound(s[2], timings, {t.episode: t.latency_sec for t in s[0]}, keep) for s in (seq_a, seq_b)]
            summary = m.summary()
            rows.append({"latency_median_s": median, "rep": rep, "predictor": name,
                         "reduction": 1 - spec / base if base else 0.0,
                         **{k: statistics.fmean(b[k] for b in bounds) for k in ("bound", "a", "T", "G", "W")},
                         "identical": len(keep),
                         "differing_first_in_action": sorted(set(ca["differing_first_in_action"])
                                                             | set(cb["differing_first_in_action"])),
                         # Turn 0 is never speculated: its generation time in each run shows how
                         # much the engine's load changed (hidden work also relieves it).
                         "G0_seq": first_turn_gen(seq_a[2], keep), "G0_spec": first_turn_gen(timings, keep),
                         "exact_frac": summary["spec/exact_frac"], "exec_won_frac": summary["spec/exec_won_frac"],
                         "skipped_frac": summary["spec/skipped_frac"] or 0.0,
                         "skip_reasons": summary["spec/skip_reasons"],
                         "committed_delay_frac": summary["committed_delay_frac"],
                         "policy_tokens_discarded": summary["spec/policy_tokens_discarded"],
                         # for the simulator: what the episodes were, and what the engine computed
                         "latency_mean_seq_s": base / len(keep) if keep else 0.0,
                         "latency_mean_spec_s": spec / len(keep) if keep else 0.0,
                         "shape": workload_shape(seq_a[0], keep),
                         "engine_seq": seq_a[3], "engine_spec": specs[name][3], "engine_seq_b": seq_b[3]})
        return rows


def split_name(name: str) -> tuple[str, int | None, bool]:
    """'world_model:busy2:nogate' -> ('world_model', 2, False); without options the recipe's
    busy_limit and gate hold."""
    kind, *options = name.split(":")
    busy, gate = None, True
    for o in options:
        if o == "nogate":
            gate = False
        elif o.startswith("busy") and o[4:].isdigit():
            busy = int(o[4:])
        else:
            raise SystemExit(f"unknown predictor option {o!r} in {name!r} (busyN, e.g. busy2, or nogate)")
    return kind, busy, gate


def aggregate(rows: list[dict]) -> list[dict]:
    groups = defaultdict(list)
    for r in rows:
        groups[(r["latency_median_s"], r["predictor"])].append(r)
    out = []
    for (median, name), rs in groups.items():
        red = mean_ci([r["reduction"] for r in rs])
        row = {"latency_median_s (emulated)": median, "predictor": name, "reps": len(rs),
               "measured_reduction": red, "episodes_identical_min": min(r["identical"] for r in rs)}
        if name != "A/A":
            b = statistics.fmean(r["bound"] for r in rs)
            row.update({"bound_reduction": b, "measured_over_bound": red["mean"] / b if b > 1e-3 else None,
                        **{k: statistics.fmean(r.get(k, 0.0) for r in rs) for k in ("a", "T", "G", "W", "G0_seq", "G0_spec")},
                        "exec_won_frac": statistics.fmean(r["exec_won_frac"] or 0.0 for r in rs),
                        "skipped_frac": statistics.fmean(r.get("skipped_frac", 0.0) for r in rs),
                        "committed_delay_frac": max((r.get("committed_delay_frac") or 0.0) for r in rs),
                        "differing_first_in_action": sum(len(r["differing_first_in_action"]) for r in rs)})
        out.append(row)
    return out


async def main_async(args) -> dict:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # 1: no intra-op threads fighting over 2 shared cores
    provenance = stamp()
    bench = Bench(args)
    await bench.setup()
    names = [*args.predictors, "never_matches"]
    rows, t0 = [], time.monotonic()
    try:
        # Warm-up, discarded: the first passes over new shapes are slower (allocator, kernel
        # caches); at saturation runs keep speeding up for several passes (docs/BENCHMARKS.md).
        for _ in range(args.warmup):
            await bench.run(bench.recipe())
        for median in args.latencies:
            for rep in range(args.reps):
                for row in await bench.repetition(median, rep, names, None):
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        bench.close()
    return {**provenance, "summary": aggregate(rows), "rows": rows, "episodes": len(bench.episodes),
            "concurrency": bench.base.rollout.concurrency or len(bench.episodes),
            "batch_invariant": bench.base.policy.batch_invariant, "torch_threads": args.threads or "default",
            "argv": sys.argv[1:], "wall_sec": time.monotonic() - t0,
            "recipe": args.recipe, "overrides": args.overrides}


def markdown(result: dict) -> str:
    """The summary as the table docs/BENCHMARKS.md shows."""
    pct = lambda x: "-" if x is None else f"{100 * x:.1f} %"
    lines = ["| latency median (emulated) | predictor | measured reduction (95 % interval) | bound | "
             "measured / bound | a | T (s) | G (s) | W (s) | exec_won | skipped | committed_delay_frac (max) |",
             "|" + "---|" * 12]
    for r in result["summary"]:
        m = r["measured_reduction"]
        ci = f" ± {100 * m['ci95']:.1f}" if m["ci95"] is not None else ""
        ratio = r.get("measured_over_bound")
        lines.append(f"| {r['latency_median_s (emulated)']:g} s | {r['predictor']} | {100 * m['mean']:.1f}{ci} % | "
                     + (" | ".join([pct(r["bound_reduction"]), "-" if ratio is None else f"{ratio:.2f}",
                                    f"{r['a']:.2f}", f"{r['T']:.2f}", f"{r['G']:.2f}", f"{r['W']:.3f}",
                                    pct(r["exec_won_frac"]), pct(r["skipped_frac"]),
                                    pct(r["committed_delay_frac"])]) if "bound_reduction" in r else "| | | | | | | |")
                     + " |")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_pred = defaultdict(list)
    for r in result["summary"]:
        by_pred[r["predictor"]].append(r)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in by_pred.items():
        rows.sort(key=lambda r: r["latency_median_s (emulated)"])
        xs = [r["latency_median_s (emulated)"] for r in rows]
        ys = [100 * r["measured_reduction"]["mean"] for r in rows]
        err = [100 * (r["measured_reduction"]["ci95"] or 0) for r in rows]
        line = ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{name} measured")
        if name != "A/A" and any(r["bound_reduction"] > 1e-3 for r in rows):
            ax.plot(xs, [100 * r["bound_reduction"] for r in rows], ls="--",
                    color=line[0].get_color(), label=f"{name} bound")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xscale("log")
    ticks = sorted({r["latency_median_s (emulated)"] for r in result["summary"]})
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("emulated tool latency median (s)")
    ax.set_ylabel("mean latency reduction (%), 95% interval")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="recipes/tiny-cpu.yaml")
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--latencies", default="0.3,1,3")
    ap.add_argument("--predictors", default="world_model,tiered,oracle,oracle:nogate")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="discarded passes before measuring")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--plot", default="")
    ap.add_argument("--out", default="", help="also write the result JSON here")
    ap.add_argument("--from-json", default="", help="only re-print (and --plot) a saved --out result")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    args.latencies = [float(x) for x in args.latencies.split(",")]
    args.predictors = [p for p in args.predictors.split(",") if p]
    if args.from_json:
        with open(args.from_json) as f:
            result = json.load(f)
    else:
        result = asyncio.run(main_async(args))
    print(json.dumps(result["summary"], indent=2))
    print(markdown(result))
    if args.out and not args.from_json:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
