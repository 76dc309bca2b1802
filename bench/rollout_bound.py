"""The bound on what speculation can hide, from a recorded `obsspec rollout --mode both` run.

    .venv/bin/python bench/rollout_bound.py RUN_DIR [--out result.json]

Reads RUN_DIR's trace-sequential.jsonl and trace-speculative.jsonl (the first pass of each mode)
and prints, as JSON with its command, commit and date: per turn followed by a generation, the
mean tool time T, next-generation time G (sequential), world-model draft time W and the share a
of those turns whose draft matched (skipped and missed ones count as misses), W by the draft's
source (the world model's own, a sibling's result, the history cache; none, or the tool won), the bound
`sum(a * max(0, min(G, T - W))) / sum(sequential episode latency)` (docs/ROLLOUT.md, "How much
speculation can save", as bench/rollout_speedup.py computes it), G / T, T / W, and the run's
measured reduction over its pairs (summary.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from provenance import emit, stamp
from rollout_speedup import Timings, bound

from obsspec.jsonl import read_jsonl
from obsspec.rollout.events import Event


def timings(path: str) -> tuple[Timings, dict[int, float]]:
    t, latency = Timings(), {}
    for row in read_jsonl(path):
        data = {k: v for k, v in row.items() if k not in ("kind", "t", "episode", "turn")}
        t(Event(row["kind"], row["t"], row["episode"], row["turn"], data))
        if row["kind"] == "episode_end":
            latency[row["episode"]] = row["latency_sec"]
    return t, latency


def draft_times(t: Timings) -> dict:
    """W by where each turn's draft came from: `world_model` (its own generation), `sibling` (a
    wait on another episode's tool), `history` (instant), ...; `no_draft` when the predictor had
    none; `outrun` when the tool finished before any draft arrived (W is then the tool's time)."""
    by: dict[str, list[float]] = {}
    for k, w in t.wm.items():
        by.setdefault(t.source[k], []).append(w)
    return {name: {"n": len(xs), "mean": round(statistics.fmean(xs), 4), "median": round(statistics.median(xs), 4)}
            for name, xs in sorted(by.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    seq, latency = timings(os.path.join(args.run_dir, "trace-sequential.jsonl"))
    spec, _ = timings(os.path.join(args.run_dir, "trace-speculative.jsonl"))
    b = bound(seq, spec, latency, set(latency))
    with open(os.path.join(args.run_dir, "summary.json")) as f:
        summary = json.load(f)
    result = {**stamp(), "run_dir": args.run_dir, **{k: round(v, 4) for k, v in b.items()},
              "G_over_T": round(b["G"] / b["T"], 3) if b["T"] else None,
              "T_over_W": round(b["T"] / b["W"], 2) if b["W"] else None,
              "W_by_source": draft_times(spec),
              "measured": {k: summary["comparison"].get(k) for k in (
                  "reduction_per_pair", "mean_latency_reduction", "reduction_ci95", "verdict", "token_identical")}}
    emit(result, args.out)


if __name__ == "__main__":
    main()
