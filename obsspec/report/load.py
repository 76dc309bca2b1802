"""What a report reads: a rollout run directory, or a training run directory.

    run = load_run("runs/rollout")      # -> RunData
    run.breakdown("speculative")        # per-episode latency parts, from the trace

A **rollout run** is what `obsspec rollout` writes (obsspec/rollout_run.py): `summary.json`,
`trace-<mode>.jsonl` (every event) and `trajectories-<mode>.jsonl`. Everything the report
shows is derived from those events and turns; nothing else is read.

A **training run** has `metrics.jsonl`, one JSON object per optimisation step (the format is
in docs/REPORT.md; `step` and `spec/exact_frac` are required, `spec/class_hits` maps a command
class to `[matches, drafts compared]`), and optionally rollout run directories under
`rollouts/` (the last one, in name order, feeds the per-trajectory plots).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from obsspec.jsonl import read_jsonl
from obsspec.commands import command_class


class ReportError(ValueError):
    """The run directory is missing or not a run (one line, no traceback)."""


@dataclass
class Parts:
    """One episode's latency, split: `generation + tool + blocked + other = latency` (the
    critical path); `world_model` and `overlap` ran alongside the tool (hidden work)."""

    episode: int
    latency: float = 0.0
    generation: float = 0.0   # committed generations the episode waited for
    tool: float = 0.0
    blocked: float = 0.0      # waiting for a matched speculative generation to finish
    world_model: float = 0.0
    overlap: float = 0.0      # kept speculative generation that ran while the tool ran
    other: float = 0.0


@dataclass
class RunData:
    run_dir: str
    kind: str                                   # rollout | training
    summary: dict = field(default_factory=dict)
    traces: dict[str, list[dict]] = field(default_factory=dict)
    trajectories: dict[str, list[dict]] = field(default_factory=dict)
    steps: list[dict] = field(default_factory=list)   # training metrics, by step
    rollout: "RunData | None" = None            # training: the last rollout directory

    @property
    def modes(self) -> list[str]:
        return [m for m in ("sequential", "speculative") if m in self.traces]

    @property
    def main_mode(self) -> str:
        return "speculative" if "speculative" in self.traces else (self.modes or ["sequential"])[0]

    # -- derived from the event stream ------------------------------------------------------------
    def breakdown(self, mode: str) -> list[Parts]:
        parts: dict[int, Parts] = {}
        open_: dict = {}
        exec_done: dict = {}
        spec_start: dict = {}
        spec_done: dict = {}
        for ev in self.traces.get(mode, []):
            k, e, t = ev["kind"], ev["episode"], ev["t"]
            if e < 0:
                continue  # (the batch's own events, such as gate_state)
            p = parts.setdefault(e, Parts(e))
            rid = ev.get("request_id", "")
            if k == "policy_start" and not ev.get("speculative"):
                open_[("gen", rid)] = t
            elif k == "policy_done" and not ev.get("speculative") and ("gen", rid) in open_:
                p.generation += t - open_.pop(("gen", rid))
            elif k == "exec_done":
                p.tool += ev.get("seconds", 0.0)
                exec_done[(e, ev["turn"])] = t
            elif k == "wm_start":
                open_[("wm", rid)] = t
            elif k in ("wm_draft", "exec_won") and ("wm", rid) in open_:
                p.world_model += t - open_.pop(("wm", rid))
            elif k == "spec_start":
                spec_start[rid] = (t, e, ev["turn"] - 1)
            elif k == "policy_done" and ev.get("speculative"):
                spec_done[rid] = t
            elif k == "request_end" and ev.get("role") == "policy" and ev.get("outcome") == "committed":
                if rid in spec_start:  # as SpecMetrics times spec/overlap_sec and spec/block_sec
                    t0, ep, turn = spec_start[rid]
                    done, tool_end = spec_done.get(rid, t), exec_done.get((ep, turn), t)
                    p.overlap += max(0.0, min(done, tool_end) - t0)
                    p.blocked += max(0.0, done - tool_end)
            elif k == "episode_end":
                p.latency = ev.get("latency_sec", 0.0)
        for p in parts.values():
            p.other = max(0.0, p.latency - p.generation - p.tool - p.blocked)
        return [parts[e] for e in sorted(parts)]

    def timeline(self, mode: str, episodes: list[int]) -> dict[int, list[tuple]]:
        """episode -> spans (lane, start, end, outcome) and instants (lane='event', t, t, kind).
        A speculative generation that finished before its fate was decided gets a second span,
        outcome '<outcome> (waiting)', from then until it was kept or dropped."""
        want, out, open_ = set(episodes), {e: [] for e in episodes}, {}
        outcome: dict = {}
        for ev in self.traces.get(mode, []):
            e = ev["episode"]
            if e not in want:
                continue
            k, t, rid = ev["kind"], ev["t"], ev.get("request_id", "")
            if k == "policy_start" and not ev.get("speculative"):
                open_[rid] = ("policy", t)
            elif k == "policy_done" and not ev.get("speculative") and rid in open_:
                lane, t0 = open_.pop(rid)
                out[e].append((lane, t0, t, "committed"))
            elif k == "exec_start":
                open_[("tool", e, ev["turn"])] = ("tool", t)
            elif k == "exec_done" and ("tool", e, ev["turn"]) in open_:
                lane, t0 = open_.pop(("tool", e, ev["turn"]))
                out[e].append((lane, t0, t, ""))
            elif k == "wm_start":
                open_[rid] = ("world model", t)
            elif k == "request_end" and ev.get("role") == "wm" and rid in open_:
                lane, t0 = open_.pop(rid)
                out[e].append((lane, t0, t, ev.get("outcome", "")))
            elif k == "spec_start":
                open_[rid] = ("speculative", t)
            elif k == "policy_done" and ev.get("speculative"):
                outcome[rid] = t  # computed; it may wait for its tool to be kept or dropped
            elif k == "request_end" and ev.get("role") == "policy" and rid in open_:
                lane, t0 = open_.pop(rid)
                done = min(outcome.pop(rid, t), t)
                out[e].append((lane, t0, done, ev.get("outcome", "")))
                if done < t:
                    out[e].append((lane, done, t, ev.get("outcome", "") + " (waiting)"))
            elif k in ("match", "rollback", "exec_won"):
                out[e].append(("event", t, t, k))
        return out

    def wasted_tokens(self, mode: str) -> dict[int, dict[str, int]]:
        """episode -> cancellation reason -> speculative policy tokens thrown away."""
        out: dict[int, dict[str, int]] = {}
        for ev in self.traces.get(mode, []):
            if ev["kind"] == "request_end" and ev.get("role") == "policy" and ev.get("outcome") == "cancelled":
                d = out.setdefault(ev["episode"], {})
                d[ev.get("reason") or "cancelled"] = d.get(ev.get("reason") or "cancelled", 0) + ev.get("tokens", 0)
        return out

    def wm_tokens_unmatched(self, mode: str) -> dict[int, int]:
        """episode -> world-model tokens generated for drafts that were not kept."""
        out: dict[int, int] = {}
        for ev in self.traces.get(mode, []):
            if ev["kind"] == "wm_draft":
                out[ev["episode"]] = out.get(ev["episode"], 0) + ev.get("tokens", 0)
            elif ev["kind"] == "match":
                out[ev["episode"]] = out.get(ev["episode"], 0) - ev.get("draft_tokens", 0)
        return out

    def hits_over_time(self, mode: str) -> list[tuple[float, str, bool]]:
        """(time, command class, matched) for every draft compared with the real observation."""
        steps = {(t["episode"], k): (turn.get("command", ""), turn.get("observation", ""))
                 for t in self.trajectories.get(mode, []) for k, turn in enumerate(t["turns"])}
        return [(ev["t"], command_class(*steps.get((ev["episode"], ev["turn"]), ("", ""))), ev["kind"] == "match")
                for ev in self.traces.get(mode, []) if ev["kind"] in ("match", "rollback")]

    def latencies(self, mode: str) -> dict[int, float]:
        return {t["episode"]: t["latency_sec"] for t in self.trajectories.get(mode, []) if not t.get("infra_error")}


def _load_rollout(run_dir: str) -> RunData:
    run = RunData(run_dir, "rollout")
    for mode in ("sequential", "speculative"):
        tp, jp = os.path.join(run_dir, f"trace-{mode}.jsonl"), os.path.join(run_dir, f"trajectories-{mode}.jsonl")
        if os.path.exists(tp):
            run.traces[mode] = read_jsonl(tp, ReportError)
        if os.path.exists(jp):
            run.trajectories[mode] = read_jsonl(jp, ReportError)
    if os.path.exists(os.path.join(run_dir, "summary.json")):
        with open(os.path.join(run_dir, "summary.json")) as f:
            run.summary = json.load(f)
    return run


def load_run(run_dir: str) -> RunData:
    if not os.path.isdir(run_dir):
        raise ReportError(f"{run_dir}: no such run directory")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(metrics):
        steps = sorted(read_jsonl(metrics, ReportError), key=lambda r: r.get("step", 0))
        run = RunData(run_dir, "training", steps=steps)
        bad = [r for r in run.steps if "step" not in r or "spec/exact_frac" not in r]
        if bad or not run.steps:
            raise ReportError(f"{metrics}: every line needs 'step' and 'spec/exact_frac' (see docs/REPORT.md)")
        rollouts = os.path.join(run_dir, "rollouts")
        dirs = sorted(d for d in os.listdir(rollouts)) if os.path.isdir(rollouts) else []
        dirs = [os.path.join(rollouts, d) for d in dirs if os.path.isdir(os.path.join(rollouts, d))]
        if dirs:
            run.rollout = _load_rollout(dirs[-1])
        if os.path.exists(os.path.join(run_dir, "summary.json")):
            with open(os.path.join(run_dir, "summary.json")) as f:
                run.summary = json.load(f)
        return run
    run = _load_rollout(run_dir)
    if not run.traces:
        raise ReportError(f"{run_dir}: not a run directory (no trace-*.jsonl of a rollout, "
                          "no metrics.jsonl of a training run)")
    return run
