"""`obsspec report RUN_DIR`: what speculation did to a run, as one HTML page, PNG plots and a trace.

    summary = write_report("runs/rollout", out_dir="runs/rollout/report", episodes=4)

Writes under `out_dir` (default RUN_DIR/report): `report.html` (self-contained: open it offline),
`hit_rate.png`, `latency_breakdown.png`, `timeline.png`, `wasted_tokens.png`, `spec_vs_seq.png`
(each only when the run has data for it), `trace.json` (Chrome / Perfetto timeline of every
event) and `summary.json`. A training run (metrics.jsonl) gets its hit rate per step; the
per-trajectory plots then come from its last rollout directory, if it kept one.
"""

from __future__ import annotations

import json
import os
import statistics

from obsspec.report import page, plots
from obsspec.report.load import RunData, load_run
from obsspec.rollout.metrics import chrome_trace
from obsspec.ui.tables import ROWS, cell, headline  # the rollout table's rows and cells, same labels


def _summary_section(run: RunData) -> str:
    modes = run.summary.get("modes") or {}
    if not modes:
        return "<p>No summary.json in this run.</p>"
    head = [""] + list(modes)
    rows = [[label, *(cell(modes[m].get(key), pct) for m in modes)] for label, key, pct in ROWS]
    out = page.table(head, rows)
    comp = run.summary.get("comparison")
    if comp:
        out += (f"<p><b>{page.esc(headline(comp))}</b>; token-identical: "
                f"<b>{cell(comp.get('token_identical'))}</b>.</p>")
    lat = run.summary.get("tool_latency") or {}
    if lat.get("emulated"):
        out += (f'<p class="note">Tool latency includes EMULATED remote latency ({page.esc(lat.get("kind"))}, '
                f'median {page.esc(lat.get("median_s"))} s).</p>')
    if run.summary.get("replay_of"):
        out += f'<p class="note">Replay of {page.esc(run.summary["replay_of"])}: recorded observations and latencies.</p>'
    return out


def _training_section(run: RunData) -> str:
    keys = ["spec/exact_frac", "spec/exec_won_frac", "spec/rollback_frac", "spec/policy_tokens_discarded",
            "latency_mean_sec", "latency_reduction"]
    keys = [k for k in keys if any(k in r for r in run.steps)]
    rows = [[r["step"], *(cell(r.get(k), k.endswith("_frac") or k == "latency_reduction") for k in keys)]
            for r in run.steps]
    return page.table(["step", *keys], rows)


def _breakdown_section(run: RunData, mode: str) -> str:
    parts = run.breakdown(mode)
    if not parts:
        return "<p>No episodes in the trace.</p>"
    names = ["latency", "generation", "tool", "blocked", "other", "world_model", "overlap"]
    mean = lambda n: statistics.fmean(getattr(p, n) for p in parts)
    rows = [["mean", *(f"{mean(n):.3f}" for n in names)]]
    rows += [[p.episode, *(f"{getattr(p, n):.3f}" for n in names)] for p in parts]
    return page.table(["episode", *(f"{n} (s)" for n in names)], rows)


def write_report(run_dir: str, out_dir: str = "", episodes: int = 4) -> dict:
    run = load_run(run_dir)
    out_dir = out_dir or os.path.join(run_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    per_traj = run.rollout if run.kind == "training" else run
    drawn: dict[str, str] = {}

    def draw(name, fn, source, **kw):
        if source is None:
            return
        path = os.path.join(out_dir, f"{name}.png")
        caption = fn(source, path, **kw)
        if caption:
            drawn[path] = caption

    draw("hit_rate", plots.hit_rate, run)
    draw("reward", plots.reward, run)
    draw("latency_breakdown", plots.latency_breakdown, per_traj)
    draw("timeline", plots.timeline, per_traj, n=episodes)
    draw("wasted_tokens", plots.wasted_tokens, per_traj)
    draw("spec_vs_seq", plots.spec_vs_seq, per_traj)
    draw("calibration", plots.calibration, per_traj)

    sections = []
    if run.kind == "training":
        sections.append(("Training steps (metrics.jsonl)", _training_section(run)))
    if per_traj is not None:
        sections.append(("Rollout summary" + (f" ({per_traj.run_dir})" if per_traj is not run else ""),
                         _summary_section(per_traj)))
    sections += [("Plots", "\n".join(page.figure(p, c) for p, c in drawn.items()) or "<p>No plots: the run has no data.</p>")]
    if per_traj is not None:
        sections.append((f"Latency breakdown per trajectory ({per_traj.main_mode})",
                         _breakdown_section(per_traj, per_traj.main_mode)))
    trace_path = ""
    if per_traj is not None and per_traj.traces:
        trace_path = os.path.join(out_dir, "trace.json")
        events = [ev for m in per_traj.modes for ev in per_traj.traces[m]]
        with open(trace_path, "w") as f:
            json.dump(chrome_trace(events), f)
        sections.append(("Trace", "<p><code>trace.json</code> (next to this page) opens in "
                                  "ui.perfetto.dev or chrome://tracing: one row per episode, sequential and "
                                  "speculative as two processes.</p>"))
    html_path = os.path.join(out_dir, "report.html")
    with open(html_path, "w") as f:
        f.write(page.render(f"obsspec report: {os.path.basename(os.path.abspath(run_dir))} ({run.kind} run)", sections))
    summary = {"command": "report", "run_dir": run_dir, "kind": run.kind, "out_dir": out_dir,
               "html": html_path, "plots": [os.path.basename(p) for p in drawn], "trace": trace_path or None}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary
