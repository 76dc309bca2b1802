"""Validate `obsspec simulate` against the measured rollout speed-ups (bench/rollout_speedup.py).

    .venv/bin/python bench/sim_validation.py [--plot bench/results/sim_validation.png] [--out bench/results/sim_validation.json]
        [--no-prefill]

For each recorded setting in bench/results/rollout_speedup*.json (emulated tool latency median,
concurrency, depth) and each predictor with a known hit rate (oracle: every draft right;
never_matches: every draft wrong), it builds the simulator's inputs from what the SEQUENTIAL runs
measured plus the predictor's hit rate, and predicts the speculative run:
- workload: the benchmark's 32 episodes (8 tasks x 4) of at most 4 turns (policy.max_turns=4),
  with the turn mix (bash calls, malformed calls, done()), action and prompt lengths that the
  sequential runs recorded (`shape`; a file recorded before the bench kept it takes the mean of
  those that have it);
- tool: log-normal(median, sigma 0.5) as emulated, plus the sandbox's own time, chosen so the
  mean equals the measured T;
- world model: the measured W;
- engine: the hf engine in batch-invariant mode: processor-sharing decode, each prompt prefilled
  alone and uninterrupted on admission, speculative requests admitted only while no committed
  one runs or waits and decoded only while no committed one decodes (obsspec/sim/engine.py).
  Prefill speed / decode speed is the ratio of the engine's own counters (prompt tokens per
  prefill second against decode steps per decode second) in the sequential runs; the overall
  speed is fitted (bisection) so that the simulated sequential G equals the measured G.
  `--no-prefill`: the earlier model (prefill folded into a preemptible decode).
Nothing is fitted on a speculative run. Prints JSON rows (simulated vs measured reduction, the
relative error, whether the measured 95 % interval contains the simulated value, and for
never_matches the speculative prefills and tokens the engine computed, measured and simulated).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import statistics

from provenance import stamp

from obsspec.sim.config import SimConfig
from obsspec.sim.simulate import replace, run_point
from obsspec.sim.workload import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = {"rollout_speedup.json": {}, "rollout_speedup_c2.json": {}, "rollout_speedup_c32.json": {},
           "rollout_speedup_depth2.json": {"depth": 2},
           "rollout_speedup_sat_c4.json": {}, "rollout_speedup_sat_c32.json": {},
           "rollout_speedup_c2_t1.json": {},
           # with the speculation gate (and the recipe's 3 turns); 32 at once is left out: there
           # the load check skipped 90-95 % of commands, which the simulator does not model
           "rollout_speedup_gate_c4.json": {"gate": True, "turns": 3}}
HIT = {"oracle": 1.0, "oracle:nogate": 1.0, "never_matches": 0.0}
MAX_TURNS = 4
# Log-normal spread of action lengths: the tiny kit's policy in its own 32 rollouts on train tasks
# (.cache/kit/kit-*/rollouts.jsonl, 94 actions: mean 26 tokens, sd of log length 0.48), for
# benchmark files that did not record it.
ACTION_SPREAD = 0.48
SEEDS = 6  # workload draws per setting (each with its own engine fit)


def load(name: str) -> dict | None:
    path = os.path.join(ROOT, "bench", "results", name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def measured_shape(rows: list[dict]) -> dict:
    """Mean workload shape and prefill/decode speed ratio over benchmark rows that recorded them."""
    rows = [r for r in rows if "shape" in r]
    kinds = {k: statistics.fmean(r["shape"]["turns_per_episode"].get(k, 0.0) for r in rows)
             for k in ("bash", "error", "done")}
    engines = [r[k] for r in rows for k in ("engine_seq", "engine_seq_b")]
    prefill_tok_s = sum(e["prefill_tokens"] for e in engines) / sum(e["prefill_sec"] for e in engines)
    decode_tok_s = sum(e["decode_steps"] for e in engines) / sum(e["decode_sec"] for e in engines)
    spreads = [r["shape"]["action_tokens_log_sd"] for r in rows if "action_tokens_log_sd" in r["shape"]]
    return {"turns_per_episode": kinds, **({"action_log_sd": statistics.fmean(spreads)} if spreads else {}),
            **{k: statistics.fmean(r["shape"][k] for r in rows)
               for k in ("action_tokens_mean", "prompt_tokens_mean", "prompt_tokens_first")},
            "prefill_over_decode": prefill_tok_s / decode_tok_s, "rows": len(rows)}


def shaped_workload(cfg: SimConfig, shape: dict, tool_mean: float | None = None, seed: int = 1,
                    max_turns: int = MAX_TURNS) -> list:
    """synthetic(cfg) (tools, hits, action lengths) cut to the measured turn mix: the measured
    share of episodes ends on done(), at lengths that keep the measured mean number of turns;
    the measured share of the other turns are malformed calls (no tool, never speculated); each
    prompt is the first prompt plus every action and observation before it. Stratified (shares
    exact up to rounding, order shuffled with `seed`), so 32 episodes carry the measured means;
    `tool_mean`: every tool latency is shifted so that their mean is the measured T exactly (a
    sample of ~90 log-normal draws is off by a few percent)."""
    k = shape["turns_per_episode"]
    n, done = k["bash"] + k["error"] + k["done"], min(1.0, k["done"])
    len_done = (n - (1 - done) * max_turns) / done if done > 0 else max_turns
    err = k["error"] / max(1e-9, k["bash"] + k["error"])
    obs = max(0.0, 2 * (shape["prompt_tokens_mean"] - shape["prompt_tokens_first"]) / max(1e-9, n - 1)
              - shape["action_tokens_mean"])
    wl, rng = synthetic(cfg), random.Random(seed)
    strata = lambda m: rng.sample([(i + 0.5) / m for i in range(m)], m)
    u_done, u_len = strata(len(wl)), strata(len(wl))
    lo = math.floor(len_done)
    u_err = iter(strata(len(wl) * max_turns))
    out = []
    for i, turns in enumerate(wl):
        ends_done = u_done[i] < done
        length = min(max_turns, max(1, lo + (u_len[i] < len_done - lo))) if ends_done else max_turns
        prompt, ep = shape["prompt_tokens_first"], []
        for j, t in enumerate(turns[:length]):
            kind = "done" if ends_done and j == length - 1 else ("error" if next(u_err) < err else "bash")
            ep.append(dataclasses.replace(t, kind=kind, tool_s=t.tool_s if kind == "bash" else 0.0,
                                          prompt_tokens=prompt))
            prompt += t.action_tokens + obs
        out.append(ep)
    tools = [t.tool_s for ep in out for t in ep if t.kind == "bash"]
    if tool_mean is not None and tools:
        shift = tool_mean - statistics.fmean(tools)
        out = [[dataclasses.replace(t, tool_s=max(0.0, t.tool_s + shift)) if t.kind == "bash" else t for t in ep]
               for ep in out]
    return out


def setting_config(row: dict, concurrency: int, depth: int, hit: float, shape: dict, tok_s: float,
                   prefill: bool, seed: int = 0, gate: bool = False, turns: int = MAX_TURNS) -> SimConfig:
    median, sigma = row["latency_median_s (emulated)"], 0.5
    overhead = max(0.0, row["T"] - median * math.exp(sigma * sigma / 2))
    return replace(SimConfig(),
                   engine={"single_tok_s": tok_s, "peak_tok_s": tok_s, "max_batch": 32, "spec_priority": "low",
                           "prefill_tok_s": shape["prefill_over_decode"] * tok_s if prefill else 0.0},
                   world_model={"overhead_s": row["W"], "obs_tokens": 0.0},
                   tool={"kind": "lognormal", "median_s": median, "sigma": sigma, "overhead_s": overhead},
                   workload={"episodes": 32, "concurrency": concurrency, "turns": turns,
                             "action_tokens": shape["action_tokens_mean"], "action_spread": shape.get("action_log_sd", ACTION_SPREAD), "seed": seed},
                   spec={"hit_rate": hit, "depth": depth, "breadth": 1, "gate": gate})


def calibrate(make, shape: dict, target_g: float, tool_mean: float, turns: int = MAX_TURNS) -> float:
    """Engine tokens/s at which the simulated sequential G equals the measured one."""
    lo, hi = 10.0, 5000.0
    for _ in range(14):  # log-bisection over 10..5,000 tok/s: 4e-4 relative
        mid = math.sqrt(lo * hi)
        cfg = make(mid)
        g = run_point(cfg, shaped_workload(cfg, shape, tool_mean, cfg.workload.seed, turns))["G_sequential_s"]
        lo, hi = (mid, hi) if g > target_g else (lo, mid)
    return math.sqrt(lo * hi)


def engine_extra(rows: list[dict]) -> dict | None:
    """Prefills (and their seconds) a speculative run computed beyond its sequential runs
    (never_matches: every one of them speculative, thrown away), mean over repetitions."""
    rows = [r for r in rows if "engine_spec" in r]
    if not rows:
        return None
    extra = lambda r, k: r["engine_spec"][k] - (r["engine_seq"][k] + r["engine_seq_b"][k]) / 2
    return {"spec_prefills": statistics.fmean(extra(r, "prefills") for r in rows),
            "spec_prefill_sec": statistics.fmean(extra(r, "prefill_sec") for r in rows)}


def validate(prefill: bool = True, seeds: int = SEEDS) -> list[dict]:
    results = {name: load(name) for name in SOURCES}
    recorded = [r for res in results.values() if res for r in res["rows"]]
    pooled = measured_shape(recorded)
    rows = []
    for name, extra in SOURCES.items():
        result = results[name]
        if result is None:
            continue
        own = [r for r in result["rows"] if "shape" in r]
        shape = measured_shape(own) if own else pooled
        for r in result["summary"]:
            if r["predictor"] not in HIT:
                continue
            sims, speeds = [], []
            gate = extra.get("gate", False) and not r["predictor"].endswith(":nogate")
            turns = extra.get("turns", MAX_TURNS)
            for seed in range(seeds):  # the mean over workload draws: the simulator's expectation
                make = lambda tok_s, r=r, seed=seed: setting_config(
                    r, result["concurrency"], extra.get("depth", 1), HIT[r["predictor"]], shape, tok_s, prefill, seed,
                    gate, turns)
                speeds.append(calibrate(make, shape, r["G"], r["T"], turns))
                cfg = make(speeds[-1])
                sims.append(run_point(cfg, shaped_workload(cfg, shape, r["T"], seed, turns)))
            # gated: the gated run's reduction is what was measured
            key = "reduction_gated" if gate else "reduction"
            for x in sims:
                x["reduction"] = x[key]
                if gate:  # (never_matches: every speculative token is wasted)
                    x["spec_requests_admitted"] = x["spec_requests_admitted_gated"]
                    x["spec_tokens_computed"] = x["policy_tokens_wasted_gated"]
            mean = lambda key: statistics.fmean(x[key] for x in sims)
            sim = {k: mean(k) for k in ("reduction", "bound", "G_sequential_s", "G_speculative_s",
                                        "engine_busy_frac_sequential", "spec_requests_admitted", "spec_tokens_computed")}
            tok_s = statistics.fmean(speeds)
            m = r["measured_reduction"]
            ci = m["ci95"] or 0.0
            rel = abs(sim["reduction"] - m["mean"]) / abs(m["mean"]) if abs(m["mean"]) > 1e-9 else None
            same = [x for x in result["rows"] if x["predictor"] == r["predictor"]
                    and x["latency_median_s"] == r["latency_median_s (emulated)"]]
            eng = engine_extra(same)
            rows.append({"source": name, "gate": gate, "latency_median_s": r["latency_median_s (emulated)"],
                         "concurrency": result["concurrency"], "depth": extra.get("depth", 1),
                         "reps": r["reps"], "torch_threads": result.get("torch_threads", "default"),
                         "predictor": r["predictor"], "measured": m["mean"], "measured_ci95": ci,
                         "simulated": sim["reduction"], "relative_error": rel,
                         "simulated_sd_over_draws": statistics.stdev(x["reduction"] for x in sims) if seeds > 1 else 0.0,
                         "within_20pct": rel is not None and rel <= 0.2,
                         "inside_measured_ci": abs(sim["reduction"] - m["mean"]) <= ci,
                         "bound_measured": r["bound_reduction"], "bound_simulated": sim["bound"],
                         "G_measured": r["G"], "G_simulated": sim["G_sequential_s"],
                         "G_spec_simulated": sim["G_speculative_s"],
                         "engine_tok_s_fitted": tok_s, "prefill_tok_s": tok_s * shape["prefill_over_decode"] if prefill else 0.0,
                         "shape_measured_here": bool(own),
                         "engine_busy_frac": sim["engine_busy_frac_sequential"],
                         "spec_prefills_measured": eng and eng["spec_prefills"],
                         # tokens of cancelled requests (never_matches: all speculative tokens); a
                         # prefill samples the first token, hence + one per admitted request
                         "spec_tokens_measured": statistics.fmean(x["policy_tokens_discarded"] for x in same),
                         "spec_prefills_simulated": sim["spec_requests_admitted"],
                         "spec_tokens_simulated": sim["spec_tokens_computed"] + sim["spec_requests_admitted"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def label(r: dict) -> str:
    new = " (new)" if r["shape_measured_here"] else ""
    gated = ", gated" if r.get("gate") else ""
    return f"{r['latency_median_s']:g} s, c{r['concurrency']}, depth {r['depth']}{gated}{new}"


def markdown(rows: list[dict], without_prefill: list[dict] | None = None) -> str:
    pct = lambda v: f"{100 * v:.1f} %"
    rel = lambda r: "-" if r["relative_error"] is None else f"{100 * r['relative_error']:.0f} %"
    other = {(r["source"], r["latency_median_s"], r["predictor"]): r for r in without_prefill or []}
    lines = ["| setting | predictor | reps | measured (95 % CI) | simulated | rel. error | without prefill (rel. error) "
             "| bound meas. / sim. | engine busy (sim.) | spec. prefills meas. / sim. | spec. tokens meas. / sim. |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o = other.get((r["source"], r["latency_median_s"], r["predictor"]))
        wo = f"{pct(o['simulated'])} ({rel(o)})" if o else "-"
        nm = r["predictor"] == "never_matches"
        pre = (f"{r['spec_prefills_measured']:.0f} / {r['spec_prefills_simulated']:.0f}"
               if nm and r["spec_prefills_measured"] is not None else "")
        tok = f"{r['spec_tokens_measured']:.0f} / {r['spec_tokens_simulated']:.0f}" if nm else ""
        lines.append(f"| {label(r)} | {r['predictor']} | {r['reps']} | {pct(r['measured'])} ± {100 * r['measured_ci95']:.1f} "
                     f"| {pct(r['simulated'])} | {rel(r)} | {wo} | {pct(r['bound_measured'])} / {pct(r['bound_simulated'])} "
                     f"| {pct(r['engine_busy_frac'])} | {pre} | {tok} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str, without_prefill: list[dict] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5.5))
    for pred, marker in (("oracle", "o"), ("never_matches", "x")):
        sel = [r for r in rows if r["predictor"] == pred]
        ax.errorbar([100 * r["measured"] for r in sel], [100 * r["simulated"] for r in sel],
                    xerr=[100 * r["measured_ci95"] for r in sel], fmt=marker, capsize=3, label=pred)
        for r in sel if pred == "oracle" else ():
            ax.annotate(label(r), (100 * r["measured"], 100 * r["simulated"]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    old = [r for r in without_prefill or [] if r["predictor"] == "oracle"]
    if old:
        ax.plot([100 * r["measured"] for r in old], [100 * r["simulated"] for r in old], "o", mfc="none",
                color="grey", label="oracle, engine model without prefill")
    lim = [-10, 35]
    ax.plot(lim, lim, color="grey", lw=0.8, label="simulated = measured")
    ax.fill_between(lim, [0.8 * x for x in lim], [1.2 * x for x in lim], color="grey", alpha=0.15, label="±20 %")
    ax.set_xlabel("measured latency reduction (%), 95% interval")
    ax.set_ylabel("simulated latency reduction (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-prefill", action="store_true", help="only the earlier engine model (no prefill)")
    ap.add_argument("--seeds", type=int, default=SEEDS, help="workload draws averaged per setting")
    ap.add_argument("--plot", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    provenance = stamp()  # before this run rewrites tracked results
    rows = validate(not args.no_prefill, args.seeds)
    # the same inputs on the engine model without prefill, side by side
    other = validate(False, args.seeds) if not args.no_prefill else None
    result = {**provenance, "rows": rows, "prefill": not args.no_prefill, "seeds": args.seeds, "rows_without_prefill": other}
    print(json.dumps(result, indent=2))
    print(markdown(rows, other))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        plot(rows, args.plot, other)


if __name__ == "__main__":
    main()
