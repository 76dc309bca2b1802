"""Validate `obsspec simulate` against the measured rollout speed-ups (bench/rollout_speedup.py).

    .venv/bin/python bench/sim_validation.py [--done-frac 0] [--plot docs/sim_validation.png]
        [--out docs/sim_validation.json]

For each recorded setting in docs/rollout_speedup*.json (emulated tool latency median,
concurrency, depth) and each predictor with a known hit rate (oracle: every draft right;
never_matches: every draft wrong), it builds the simulator's inputs from what the SEQUENTIAL runs
measured plus the predictor's hit rate, and predicts the speculative run:
- workload: the benchmark's 32 episodes (8 tasks x 4), 4 turns (policy.max_turns=4), every turn
  a bash call (`--done-frac`: share of episodes whose 4th turn is done() instead), 30 tokens per
  action (log-normal spread 0.3; with a processor-sharing engine only the time per action matters);
- tool: log-normal(median, sigma 0.5) as emulated, plus the sandbox's own time, chosen so the
  mean equals the measured T;
- world model: the measured W;
- engine: the hf engine in batch-invariant mode, i.e. processor sharing (aggregate throughput
  independent of the batch), speculative requests served only when no committed one runs; its
  speed is fitted (bisection) so that the simulated sequential G equals the measured G.
Nothing is fitted on a speculative run. Prints JSON rows (simulated vs measured reduction, the
relative error, and whether the measured 95 % interval contains the simulated value).
"""

from __future__ import annotations

import argparse
import json
import math
import os

from obsspec.sim.config import SimConfig
from obsspec.sim.simulate import replace, run_point
from obsspec.sim.workload import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = {"rollout_speedup.json": {}, "rollout_speedup_c2.json": {}, "rollout_speedup_c32.json": {},
           "rollout_speedup_depth2.json": {"depth": 2}}
HIT = {"oracle": 1.0, "never_matches": 0.0}


def setting_config(row: dict, concurrency: int, depth: int, hit: float, done_frac: float, tok_s: float) -> SimConfig:
    median, sigma = row["latency_median_s (emulated)"], 0.5
    overhead = max(0.0, row["T"] - median * math.exp(sigma * sigma / 2))
    return replace(SimConfig(),
                   engine={"single_tok_s": tok_s, "peak_tok_s": tok_s, "max_batch": 32, "spec_priority": "low"},
                   world_model={"overhead_s": row["W"], "obs_tokens": 0.0},
                   tool={"kind": "lognormal", "median_s": median, "sigma": sigma, "overhead_s": overhead},
                   workload={"episodes": 32, "concurrency": concurrency, "turns": 4, "done_frac": done_frac,
                             "action_tokens": 30.0, "action_spread": 0.3, "seed": 0},
                   spec={"hit_rate": hit, "depth": depth, "breadth": 1})


def calibrate(make, target_g: float) -> float:
    """Engine tokens/s at which the simulated sequential G equals the measured one."""
    lo, hi = 1.0, 10000.0
    for _ in range(22):  # log-bisection over 1..10^4 tok/s: 1e-5 relative
        mid = math.sqrt(lo * hi)
        cfg = make(mid)
        g = run_point(cfg, synthetic(cfg))["G_sequential_s"]
        lo, hi = (mid, hi) if g > target_g else (lo, mid)
    return math.sqrt(lo * hi)


def validate(done_frac: float) -> list[dict]:
    rows = []
    for name, extra in SOURCES.items():
        with open(os.path.join(ROOT, "docs", name)) as f:
            result = json.load(f)
        for r in result["summary"]:
            if r["predictor"] not in HIT:
                continue
            make = lambda tok_s, r=r: setting_config(r, result["concurrency"], extra.get("depth", 1),
                                                     HIT[r["predictor"]], done_frac, tok_s)
            tok_s = calibrate(make, r["G"])
            cfg = make(tok_s)
            sim = run_point(cfg, synthetic(cfg))
            m = r["measured_reduction"]
            ci = m["ci95"] or 0.0
            rel = abs(sim["reduction"] - m["mean"]) / abs(m["mean"]) if abs(m["mean"]) > 1e-9 else None
            rows.append({"source": name, "latency_median_s": r["latency_median_s (emulated)"],
                         "concurrency": result["concurrency"], "depth": extra.get("depth", 1),
                         "predictor": r["predictor"], "measured": m["mean"], "measured_ci95": ci,
                         "simulated": sim["reduction"], "relative_error": rel,
                         "within_20pct": rel is not None and rel <= 0.2,
                         "inside_measured_ci": abs(sim["reduction"] - m["mean"]) <= ci,
                         "bound_measured": r["bound_reduction"], "bound_simulated": sim["bound"],
                         "G_measured": r["G"], "G_simulated": sim["G_sequential_s"],
                         "G_spec_simulated": sim["G_speculative_s"],
                         "engine_tok_s_fitted": tok_s, "engine_busy_frac": sim["engine_busy_frac_sequential"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    pct = lambda v: f"{100 * v:.1f} %"
    lines = ["| setting | predictor | measured (95 % CI) | simulated | rel. error | bound meas. / sim. | engine busy |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        rel = "-" if r["relative_error"] is None else f"{100 * r['relative_error']:.0f} %"
        lines.append(f"| {r['latency_median_s']:g} s, c{r['concurrency']}, depth {r['depth']} | {r['predictor']} | "
                     f"{pct(r['measured'])} ± {100 * r['measured_ci95']:.1f} | {pct(r['simulated'])} | {rel} | "
                     f"{pct(r['bound_measured'])} / {pct(r['bound_simulated'])} | {pct(r['engine_busy_frac'])} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for pred, marker in (("oracle", "o"), ("never_matches", "x")):
        sel = [r for r in rows if r["predictor"] == pred]
        ax.errorbar([100 * r["measured"] for r in sel], [100 * r["simulated"] for r in sel],
                    xerr=[100 * r["measured_ci95"] for r in sel], fmt=marker, capsize=3, label=pred)
        for r in sel if pred == "oracle" else ():
            ax.annotate(f"{r['latency_median_s']:g}s c{r['concurrency']} d{r['depth']}",
                        (100 * r["measured"], 100 * r["simulated"]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
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
    ap.add_argument("--done-frac", type=float, default=0.0)
    ap.add_argument("--plot", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = validate(args.done_frac)
    print(json.dumps({"rows": rows, "done_frac": args.done_frac}, indent=2))
    print(markdown(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "done_frac": args.done_frac}, f, indent=2)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
