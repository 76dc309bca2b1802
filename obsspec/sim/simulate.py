"""`obsspec simulate`: where observation speculation helps, is neutral, or hurts.

    result = simulate(SimConfig(), grid={"tool.median_s": [1, 3, 10], "spec.hit_rate": [0.4, 0.8]},
                      from_run="runs/rollout", out_dir="runs/simulate")

Each grid point simulates the same batch (same workload: same tool latencies, action lengths,
draft outcomes and confidences) on one shared engine sequentially, with every draft speculated,
and, with `spec.gate`, behind the speculation gate; it reports the latency reduction
`1 - sum(speculative latency) / sum(sequential latency)` of both (`reduction`,
`reduction_gated`; as the rollout benchmark measures it), the bound of docs/ROLLOUT.md from the
simulated sequential run, hits, rollbacks, exec_won, wasted tokens, the gate's skips by reason,
what speculation cost committed work (`delay_per_spec_s`) and the gate's final D, seconds of committed delay per speculative generation
(`gate_cost_gated`). A point is `helps` above +threshold, `hurts` below -threshold, `neutral` between
(`regime`, `regime_gated`). Writes simulate.json, simulate.png and summary.json under `out_dir`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os

from obsspec.sim.config import SimConfig, SimError, apply_overrides, to_dict
from obsspec.sim.episodes import BatchResult, SimTurn, simulate_batch
from obsspec.sim.workload import RecordedRun, synthetic


def bound(workload: list[list[SimTurn]], seq: BatchResult) -> float:
    """The bound of docs/ROLLOUT.md ("How much speculation can save") from the simulated sequential run: per bash turn followed by an
    action, hit * max(0, min(G_next, T - W)), over the total sequential latency."""
    saving = 0.0
    for turns, ep in zip(workload, seq.episodes):
        for k, t in enumerate(turns[:-1]):
            if t.kind == "bash" and t.hit:
                saving += max(0.0, min(ep.gen_sec.get(k + 1, 0.0), t.tool_s - t.wm_s))
    return saving / seq.total_latency if seq.total_latency else 0.0


def run_point(cfg: SimConfig, workload: list[list[SimTurn]]) -> dict:
    """Sequential, ungated speculative and (with `spec.gate`) gated speculative runs of one
    workload: the ungated run's numbers, and the gated run's under `*_gated` keys (None without
    the gate)."""
    seq = simulate_batch(cfg, workload, speculative=False)
    spec = simulate_batch(replace(cfg, spec={"gate": False}), workload, speculative=True)
    reduce = lambda r: 1 - r.total_latency / seq.total_latency if seq.total_latency else 0.0
    gated = simulate_batch(cfg, workload, speculative=True) if cfg.spec.gate else None
    c = spec.counts()
    in_time = c.get("match", 0) + c.get("rollback", 0)
    predicted = in_time + c.get("exec_won", 0)
    gc = gated.counts() if gated else {}
    return {
        "reduction": reduce(spec),
        "reduction_gated": reduce(gated) if gated else None,
        "bound": bound(workload, seq),
        "latency_mean_sequential_s": seq.total_latency / len(workload),
        "latency_mean_speculative_s": spec.total_latency / len(workload),
        "G_sequential_s": seq.next_gen_mean(), "G_speculative_s": spec.next_gen_mean(),
        "exact_frac": c.get("match", 0) / in_time if in_time else None,
        "exec_won_frac": c.get("exec_won", 0) / predicted if predicted else None,
        "rollbacks": c.get("rollback", 0), "matches": c.get("match", 0),
        "policy_tokens_wasted": round(spec.wasted_tokens, 1),
        "spec_tokens_computed": round(spec.spec_tokens, 1),
        "spec_requests_admitted": spec.spec_admitted,
        "wasted_frac_of_compute": spec.wasted_tokens / (spec.committed_tokens + spec.spec_tokens)
        if spec.committed_tokens else 0.0,
        "engine_busy_frac_sequential": seq.engine_busy_sec / seq.makespan if seq.makespan else 0.0,
        "blocked_s": sum(e.blocked_sec for e in spec.episodes),
        # the gated run: what started, what it skipped and why, what it threw away
        "latency_mean_gated_s": gated.total_latency / len(workload) if gated else None,
        "drafts_gated": gated.drafts if gated else None,
        "skips_gated": gated.skips if gated else None,
        "matches_gated": gc.get("match", 0) if gated else None,
        "rollbacks_gated": gc.get("rollback", 0) if gated else None,
        "spec_requests_admitted_gated": gated.spec_admitted if gated else None,
        "policy_tokens_wasted_gated": round(gated.wasted_tokens, 1) if gated else None,
        # what speculation cost committed work (the engine's SchedulingStats) and the gate's
        # cost share at the end of the run, ungated and gated
        "delay_per_spec_s": spec.committed_delay_sec / spec.speculative_compute_sec
        if spec.speculative_compute_sec else None,
        "gate_cost_gated": gated.gate_cost if gated else None,
    }


def regime(reduction: float | None, threshold: float) -> str | None:
    if reduction is None:
        return None
    return "helps" if reduction > threshold else "hurts" if reduction < -threshold else "neutral"


def _sections(keys) -> set[str]:
    """Which recorded inputs a set of override keys replaces."""
    out = set()
    for k in keys:
        if k.startswith("tool."):
            out.add("tool")
        elif k.startswith("world_model."):
            out.add("world_model")
        elif k in ("spec.hit_rate", "spec.class_hit_rates", "spec.class_mix"):
            out.add("hits")
    return out


def simulate(cfg: SimConfig, grid: dict[str, list] | None = None, from_run: str = "",
             out_dir: str = "", overrides: list[str] = (), threshold: float = 0.02,
             plot: bool = True) -> dict:
    """Simulate every point of `grid` (dot-path -> values) on `cfg` (or on a recorded run)."""
    grid = dict(grid or {})
    recorded = RecordedRun.load(from_run) if from_run else None
    base = apply_overrides(recorded.config(cfg) if recorded else cfg, list(overrides))
    rows = []
    for values in itertools.product(*grid.values()) if grid else [()]:
        point = dict(zip(grid, values))
        items = [f"{k}={v}" for k, v in point.items()]
        if "spec.hit_rate" in point and "spec.class_hit_rates" not in point:
            items.insert(0, "spec.class_hit_rates=")  # one overall rate, as asked
        pcfg = apply_overrides(base, items)
        if recorded:
            workload = recorded.workload(pcfg, _sections([*grid, *(o.split("=")[0] for o in overrides)]))
        else:
            workload = synthetic(pcfg)
        r = run_point(pcfg, workload)
        rows.append({**point, **r, "regime": regime(r["reduction"], threshold),
                     "regime_gated": regime(r["reduction_gated"], threshold)})
    result = {"command": "simulate", "grid": grid, "from_run": from_run or None, "threshold": threshold,
              "base": to_dict(base), "rows": rows}
    if recorded:
        result["measured_reduction"] = recorded.measured_reduction()
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "simulate.json"), "w") as f:
            json.dump(result, f, indent=2)
        if plot and grid:
            from obsspec.sim.plot import plot_grid

            plot_grid(result, os.path.join(out_dir, "simulate.png"))
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            count = lambda key: {g: sum(r[key] == g for r in rows) for g in ("helps", "neutral", "hurts")}
            json.dump({"command": "simulate", "points": len(rows), "out_dir": out_dir,
                       "regimes": count("regime"), "regimes_gated": count("regime_gated") if base.spec.gate else None},
                      f, indent=2)
    return result


def parse_grid(items: list[str]) -> dict[str, list]:
    """['tool.median_s=1,3,10', ...] -> {'tool.median_s': [1, 3, 10]} (values checked later)."""
    import yaml

    grid = {}
    for item in items:
        key, sep, raw = item.partition("=")
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not sep or not values:
            raise SimError(f"--grid {item!r}: write key=v1,v2,... (e.g. tool.median_s=1,3,10)")
        grid[key.strip()] = [yaml.safe_load(v) for v in values]
    for key, values in grid.items():  # fail before simulating anything
        apply_overrides(SimConfig(), [f"{key}={values[0]}"])
    return grid


def table(result: dict) -> str:
    """The rows as a markdown table."""
    keys = list(result["grid"])
    head = keys + ["reduction", "bound", "hit rate", "exec_won", "wasted tok", "regime",
                   "gated", "skipped", "wasted tok gated", "gate cost", "regime gated"]
    pct = lambda v: "-" if v is None else f"{100 * v:.1f} %"
    num = lambda v: "-" if v is None else f"{v:.0f}"
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result["rows"]:
        skipped = None if r["drafts_gated"] is None else sum(r["skips_gated"].values()) / max(1, r["drafts_gated"])
        lines.append("| " + " | ".join([*(f"{r[k]:g}" if isinstance(r[k], (int, float)) else str(r[k]) for k in keys),
                                        pct(r["reduction"]), pct(r["bound"]), pct(r["exact_frac"]),
                                        pct(r["exec_won_frac"]), num(r["policy_tokens_wasted"]), r["regime"],
                                        pct(r["reduction_gated"]), pct(skipped), num(r["policy_tokens_wasted_gated"]),
                                        "-" if r["gate_cost_gated"] is None else f"{r['gate_cost_gated']:.2f}",
                                        r["regime_gated"] or "-"]) + " |")
    return "\n".join(lines)


def replace(cfg: SimConfig, **sections) -> SimConfig:
    """`replace(cfg, engine={"peak_tok_s": 9000})`: a copy with some fields of some sections changed."""
    return dataclasses.replace(cfg, **{k: dataclasses.replace(getattr(cfg, k), **v) for k, v in sections.items()})
