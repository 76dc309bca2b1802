"""`simulate --from` checked against obsspec itself: a rollout's own episodes, written as Harbor
trials (ATIF), read back as if they were a team's job, predict the reduction the same rollout
measured.

    .venv/bin/python bench/atif_selfcheck.py --concurrency 4 [--concurrency 8] [--pairs 6]
        [--run-root runs/selfcheck] [--reuse] [--out bench/results/atif_selfcheck.json]

For each concurrency C it runs (or, with --reuse, reads)
`obsspec rollout recipes/tiny-cpu.yaml --mode both rollout.num_tasks=4 rollout.pairs=P
rollout.concurrency=C`, then gives `simulate_job` what a team with only the trials would have:
- the workload: `atif/sequential` (the sequential pass's trials: generation and tool times,
  turns, the model-free tiers' hits as `simulate --from` counts them);
- the world model: its hit rate and latency as this run measured them (`atif/speculative`'s
  `extra.obsspec`: matches over matches and rollbacks of world-model drafts; summary.json's
  `spec/wm_sec_mean`), which is what "a hit rate measured on held-out steps" stands for here;
- the engine: the `cpu-tiny` preset (the hf engine on 2 cores), at C at once, with the trials'
  own single-stream speed (obsspec/sim/job.py `RecordedJob.config`).
It prints the predicted reduction of episode latency with its interval over the draws, the
measured one over the run's alternating pairs, their difference, and whether the prediction lies
inside the measurement's 95 % interval. Nothing is fitted on the speculative pass's latencies.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter

from provenance import emit, stamp

from obsspec.sim.job import simulate_job
from obsspec.sim.presets import preset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rollout(run: str, concurrency: int, pairs: int) -> None:
    cmd = [os.path.join(ROOT, ".venv/bin/obsspec"), "rollout", "recipes/tiny-cpu.yaml", "--mode", "both",
           "rollout.num_tasks=4", f"rollout.pairs={pairs}", f"rollout.concurrency={concurrency}", "--out", run]
    print("running:", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def speculative_outcomes(folder: str) -> Counter:
    """(draft source, outcome) over every agent step of the speculative pass's trials."""
    out = Counter()
    for trial in sorted(os.listdir(folder)):
        with open(os.path.join(folder, trial, "agent", "trajectory.json")) as f:
            doc = json.load(f)
        for step in doc["steps"]:
            ours = (step.get("extra") or {}).get("obsspec")
            if ours and ours.get("kind") == "bash":
                out[(ours.get("draft_source") or "-", ours.get("speculation") or "-")] += 1
    return out


def check(run: str, concurrency: int, seeds: int) -> dict:
    with open(os.path.join(run, "summary.json")) as f:
        summary = json.load(f)
    measured = summary["comparison"]
    outcomes = speculative_outcomes(os.path.join(run, "atif", "speculative"))
    wm_hits, wm_misses = outcomes[("world_model", "match")], outcomes[("world_model", "rollback")]
    hit_rate = wm_hits / (wm_hits + wm_misses) if wm_hits + wm_misses else 0.0
    wm_s = summary["modes"]["speculative"].get("spec/wm_sec_mean") or 0.0
    cfg = preset("cpu-tiny")
    overrides = [f"workload.concurrency={concurrency}", f"spec.hit_rate={hit_rate:.4f}",
                 f"world_model.overhead_s={wm_s:.4f}", "world_model.tok_s=1e9"]
    sim = simulate_job(cfg, [os.path.join(run, "atif", "sequential")], overrides=overrides, seeds=seeds)
    predicted = sim["rows"][0]["episode_latency_reduction"]
    m, ci = measured["mean_latency_reduction"], measured["reduction_ci95"]
    return {"run": os.path.relpath(run, ROOT), "concurrency": concurrency, "pairs": measured["pairs"],
            "measured": {"reduction": round(m, 4), "ci95": round(ci, 4), "verdict": measured["verdict"]},
            "predicted": {"reduction": round(predicted["mean"], 4), "ci95": round(predicted["ci95"], 4)},
            "difference_points": round(100 * (predicted["mean"] - m), 2),
            "inside_measured_interval": abs(predicted["mean"] - m) <= ci,
            "inputs": {"world_model_hit_rate": round(hit_rate, 4), "world_model_drafts": wm_hits + wm_misses,
                       "world_model_sec": round(wm_s, 4), "overrides": overrides,
                       "speculative_outcomes": {f"{s}/{o}": n for (s, o), n in sorted(outcomes.items())},
                       "job_measured": {k: sim["measured"][k] for k in
                                        ("trials", "steps", "turns_per_episode", "generation_s", "tool_s",
                                         "tokens_per_s", "model_free_hits", "model_free_share")}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, action="append", default=[])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--run-root", default=os.path.join(ROOT, "runs", "selfcheck"))
    ap.add_argument("--reuse", action="store_true", help="read the runs already under --run-root")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = []
    for c in args.concurrency or [4]:
        run = os.path.join(args.run_root, f"c{c}")
        if not args.reuse:
            rollout(run, c, args.pairs)
        rows.append(check(run, c, args.seeds))
    emit({**stamp(), "rows": rows}, args.out)


if __name__ == "__main__":
    main()
