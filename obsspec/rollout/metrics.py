"""Metrics from the event stream (names as the published method's; docs/ROLLOUT.md, "Reading the output"), and a Chrome-trace export.

    metrics = SpecMetrics(); bus.subscribe(metrics); ...; metrics.summary()

- spec/exact_frac               matches / predictions that arrived before the tool, counting
                                an arrival whose drafts were all unusable as a miss (so a world
                                model that never closes an observation shows 0 %, not "-")
- spec/exact_frac_wm, spec/exact_frac_cache, spec/exact_frac_sibling, spec/hits_*
                                the same split by who made the draft: the world model's own
                                generations, the history cache / oracle replay (instant; in
                                training a GRPO group's members repeat each other's commands), or a
                                sibling episode's result for the same command, so those hits
                                cannot hide a world model that predicts nothing
- committed_delay_frac          the engine's own account: time committed generations waited
                                because speculative work held the engine / committed generation
                                time (obsspec/engines/base.py SchedulingStats; None when the
                                engine cannot measure it, e.g. a vLLM server)
- spec/exec_won_frac            world-model requests the tool beat / world-model requests
- spec/rollback_frac            rollbacks / predictions that arrived before the tool
- spec/skipped_frac             speculations skipped / speculations considered: commands not
                                speculated on because the engine was busy (rollout.busy_limit),
                                plus drafts the gate stopped (rollout.gate) over commands and
                                drafts considered
- spec/skip_reasons             skips by reason: busy (load), low_gain (expected gain <= 0),
                                no_time (the tool was expected to be done), wm_cost (the world
                                model not asked: its draft's compute would cost more than it hides)
- spec/gate_passed              drafts whose speculative action the gate let start
- gate                          per source/class, the gate's decisions (go, explore, or the
                                reason it held back), and what it learned (gate_state: hit
                                rates, tool and world-model times, the measured cost rates)
- calibration                   per predicted-hit-probability bin: [predicted mean, observed hit
                                rate, drafts] of the drafts compared with the real output
- spec/unusable_frac            arrivals with only unusable drafts / arrivals before the tool
- spec/wm_sec_mean, tool_sec_mean, spec/wm_tool_ratio
                                mean draft time (start -> drafts), mean tool time, their ratio
- tool_hop_sec_mean, tool_hop_frac
                                with sandbox.placement ray: the mean time a command spent on the
                                hop to its sandbox's worker (round trip minus the sandbox's own
                                time) and its share of the tool time; None with local sandboxes
- infra_retried                 episodes run again because their sandbox's worker was lost
- spec/overlap_sec              speculative policy time that ran while the tool was running
- spec/block_sec                time a committed speculative generation was still running
                                after the tool finished (the turn waited on it)
- spec/policy_tokens_discarded  tokens of cancelled speculative policy generations
- spec/wm_tokens_total, spec/wm_tokens_matched
- spec/wm_drafts_unusable       world-model generations that never closed the observation
- spec/wm_prompt_too_long       world-model prompts longer than its positions (history, snapshot
                                and hints): no draft, never a miss
- calls/xml, calls/json          committed turns whose tool call parsed, by the form it was
                                written in (either is taken, whichever the prompt teaches)
- calls/malformed, calls/malformed_frac
                                committed turns that were no valid call (no call, malformed,
                                unknown tool, bad parameters) and their share of all turns
- latency_saved_sec, latency_saved_frac
                                the time speculation hid (= spec/overlap_sec: generation that ran
                                while the tool ran, which a sequential rollout waits for) and its
                                share of the estimated sequential time (rollout time + hidden);
                                an estimate, live: `obsspec rollout --mode both` measures it
plus per-trajectory latency (p50/p95, mean) and request accounting.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter

from obsspec.rollout.events import Event
from obsspec.rollout.gate import SKIP_REASONS


# Two-sided 95 % Student t quantiles by degrees of freedom (n - 1); 1.96 beyond the table.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
       15: 2.13, 20: 2.09, 30: 2.04}


def mean_interval(xs: list[float]) -> dict:
    """Mean of repeated measurements with the half-width of its 95 % interval (None for one)."""
    m = statistics.fmean(xs)
    df = len(xs) - 1
    t = T95.get(df) or next((v for k, v in sorted(T95.items()) if k >= df), 1.96)
    half = t * statistics.stdev(xs) / len(xs) ** 0.5 if df >= 1 else None
    return {"mean": m, "ci95": half, "runs": [round(x, 4) for x in xs]}


def verdict(interval: dict) -> str:
    """'gain' / 'loss' when the 95 % interval excludes 0, else 'not resolvable here'."""
    if interval["ci95"] is None:
        return "one pair: no interval (more pairs give one)"
    if interval["mean"] - interval["ci95"] > 0:
        return "gain"
    if interval["mean"] + interval["ci95"] < 0:
        return "loss"
    return "not resolvable here"


CALIBRATION_BINS = 5  # predicted-probability bins of the calibration table and plot
P_UNIT = 1e-4         # draft_verdict events carry p rounded to 4 decimals


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


class SpecMetrics:
    def __init__(self):
        self.counts = Counter()
        self.outcomes = Counter()             # (role, outcome) -> n
        self.latencies: dict[int, float] = {}
        self.rewards: dict[int, float | None] = {}
        self.policy_tokens_discarded = 0
        self.wm_tokens_total = 0
        self.wm_tokens_matched = 0
        self.wm_drafts_unusable = 0
        self.wm_prompt_too_long = 0          # draft requests the engine refused as too long
        self.arrived_unusable = 0            # predictions that arrived with nothing usable
        self.in_time_by_source = Counter()   # draft source -> arrivals before the tool (as drafts_in_time)
        self.matches_by_source = Counter()
        self.wm_sec: list[float] = []
        self.tool_sec: list[float] = []
        self.hop_sec: list[float] = []        # one per command run on a remote sandbox
        self._wm_started: dict[str, float] = {}
        self.overlap_sec = 0.0
        self.block_sec = 0.0
        self._exec_done: dict[tuple[int, int], float] = {}
        self._spec_started: dict[str, tuple[float, int, int]] = {}
        self._spec_done: dict[str, float] = {}
        self.running: dict[int, dict] = {}    # episode -> {turn, phase} for live displays
        self.skip_reasons = Counter()         # reason -> skips (busy before drafting, the gate's after)
        self.gate_decisions = 0
        self.gate_passed = 0
        self.gate_by_class = Counter()        # (source/class, go | explore | reason) -> decisions
        self.gate_state: dict | None = None   # what the gate learned (its last gate_state event)
        # (bin, "n" | "hits" | "p") -> count, or sum of p in units of P_UNIT (integers: merged
        # processes add up to exactly the same sums in any order)
        self.calibration = Counter()
        self.wm_verdicts = Counter()          # (command class, "n" | "hits") of the world model's own drafts
        self.delay = None                     # the policy engine's SchedulingStats over the batch
        self.calls = Counter()                # committed turns: "xml" | "json" (valid) | "malformed"

    def merge(self, other: "SpecMetrics") -> None:
        """Add another process's finished rollouts (episode numbers differ between processes)."""
        for name, mine in vars(self).items():
            if name.startswith("_") or name in ("running", "delay"):
                continue  # in-flight bookkeeping, empty once a batch is over
            if name == "gate_state":  # (each process's gate learns on its own: the first one's is shown)
                self.gate_state = mine or other.gate_state
                continue
            theirs = getattr(other, name)
            if isinstance(mine, dict):   # Counters add; per-episode dicts are disjoint
                mine.update(theirs)
            elif isinstance(mine, list):
                mine.extend(theirs)
            else:
                setattr(self, name, mine + theirs)

    def __call__(self, e: Event) -> None:
        self.counts[e.kind] += 1
        d = e.data
        if e.kind == "episode_start":
            self.running[e.episode] = {"turn": 0, "phase": "start", "task_id": d.get("task_id", "")}
        elif e.kind == "episode_end":
            self.running.pop(e.episode, None)
            self.latencies[e.episode] = d["latency_sec"]
            self.rewards[e.episode] = d["reward"]
        if e.kind == "wm_start":
            self._wm_started[d["request_id"]] = e.t
        if e.kind in ("policy_start", "exec_start", "wm_start"):
            if e.episode in self.running and not d.get("speculative"):
                self.running[e.episode].update(turn=e.turn, phase={
                    "policy_start": "generating", "exec_start": "tool", "wm_start": "tool+wm"}[e.kind])
        elif e.kind == "exec_done":
            self._exec_done[(e.episode, e.turn)] = e.t
            self.tool_sec.append(d["seconds"])
            if d.get("hop_sec"):
                self.hop_sec.append(d["hop_sec"])
        elif e.kind == "spec_start":
            self._spec_started[d["request_id"]] = (e.t, e.episode, e.turn - 1)
        elif e.kind == "policy_done" and d.get("speculative"):
            self._spec_done[d["request_id"]] = e.t
        elif e.kind == "wm_draft":
            self.wm_tokens_total += d["tokens"]
            self.wm_drafts_unusable += d.get("unusable", 0)
            self.wm_prompt_too_long += d.get("too_long", 0)
            if d["drafts"] == 0 and d.get("unusable", 0):
                self.arrived_unusable += 1
                self.in_time_by_source[_source(d)] += 1
            if d["request_id"] in self._wm_started:
                self.wm_sec.append(e.t - self._wm_started.pop(d["request_id"]))
        elif e.kind == "match":
            self.wm_tokens_matched += d.get("draft_tokens", 0)
            self.matches_by_source[_source(d)] += 1
            self.in_time_by_source[_source(d)] += 1
        elif e.kind == "rollback":
            self.in_time_by_source[_source(d)] += 1
        elif e.kind == "spec_skipped":
            self.skip_reasons[d.get("reason", "busy")] += 1
        elif e.kind == "gate":
            self.gate_decisions += 1
            self.gate_passed += bool(d["go"])
            if not d["go"]:
                self.skip_reasons[d["reason"]] += 1
            verdict = "explore" if d.get("explore") else "go" if d["go"] else d["reason"]
            self.gate_by_class[(f"{_source(d)}/{d['cls']}", verdict)] += 1
        elif e.kind == "gate_state":
            self.gate_state = d
        elif e.kind == "draft_verdict":
            b = min(int(d["p"] * CALIBRATION_BINS), CALIBRATION_BINS - 1)
            self.calibration[(b, "n")] += 1
            self.calibration[(b, "hits")] += bool(d["hit"])
            self.calibration[(b, "p")] += round(d["p"] / P_UNIT)
            if _source(d) == "world_model":
                self.wm_verdicts[(d["cls"], "n")] += 1
                self.wm_verdicts[(d["cls"], "hits")] += bool(d["hit"])
        elif e.kind == "action":
            self.calls["malformed" if d["parsed"] == "error" else d["form"]] += 1
        elif e.kind == "request_end":
            self.outcomes[(d["role"], d["outcome"])] += 1
            if d["role"] == "policy" and d["outcome"] == "cancelled":
                self.policy_tokens_discarded += d["tokens"]
            if d["role"] == "policy" and d["request_id"] in self._spec_started:
                self._time_speculation(d["request_id"], e.t, d["outcome"] == "committed")

    def _time_speculation(self, request_id: str, t_end: float, committed: bool) -> None:
        start, episode, turn = self._spec_started.pop(request_id)
        exec_done = self._exec_done.get((episode, turn), t_end)
        done = self._spec_done.pop(request_id, t_end)
        if committed:
            self.overlap_sec += max(0.0, min(done, exec_done) - start)
            self.block_sec += max(0.0, done - exec_done)

    # -- summaries ----------------------------------------------------------------------------------
    @property
    def drafts_in_time(self) -> int:
        return self.counts["match"] + self.counts["rollback"] + self.arrived_unusable

    def calibration_table(self) -> list[list]:
        """[predicted mean, observed hit rate, drafts] per non-empty bin of predicted probability."""
        c = self.calibration
        return [[c[(b, "p")] * P_UNIT / c[(b, "n")], c[(b, "hits")] / c[(b, "n")], c[(b, "n")]]
                for b in range(CALIBRATION_BINS) if c[(b, "n")]]

    def _by_source(self) -> dict:
        out = {}
        for key, sources in (("wm", ("world_model",)), ("cache", ("history", "oracle")), ("sibling", ("sibling",))):
            hits = sum(self.matches_by_source[s] for s in sources)
            in_time = sum(self.in_time_by_source[s] for s in sources)
            out[f"spec/exact_frac_{key}"] = hits / in_time if in_time else None
            out[f"spec/hits_{key}"] = hits
        return out

    def summary(self) -> dict:
        c = self.counts
        wm = c["wm_start"]
        in_time = self.drafts_in_time
        lat = list(self.latencies.values())
        rewards = [r for r in self.rewards.values() if r is not None]
        wm_mean = statistics.fmean(self.wm_sec) if self.wm_sec else None
        tool_mean = statistics.fmean(self.tool_sec) if self.tool_sec else None
        turns = sum(self.calls.values())
        return {
            "episodes": len(self.latencies),
            "latency_p50_sec": percentile(lat, 0.5), "latency_p95_sec": percentile(lat, 0.95),
            "latency_mean_sec": statistics.fmean(lat) if lat else None,
            "reward_mean": statistics.fmean(rewards) if rewards else None,
            "infra_failures": sum(1 for r in self.rewards.values() if r is None),
            "infra_retried": c["episode_retry"],
            "spec/exact_frac": c["match"] / in_time if in_time else None,
            **self._by_source(),
            "spec/exec_won_frac": c["exec_won"] / wm if wm else None,
            "spec/rollback_frac": c["rollback"] / in_time if in_time else None,
            "spec/skipped_frac": (sum(self.skip_reasons.values()) / (c["spec_skipped"] + self.gate_decisions)
                                  if c["spec_skipped"] + self.gate_decisions else None),
            "spec/skip_reasons": dict(sorted(self.skip_reasons.items())),
            **{f"spec/skipped_{r}": self.skip_reasons[r] for r in SKIP_REASONS},
            "spec/gate_passed": self.gate_passed,
            # why the gate speculated or held back, per draft source and command class, and what
            # it learned (hit rates, tool and world-model times, measured cost rates)
            "gate": {"decisions": {k: {v: n for (k2, v), n in sorted(self.gate_by_class.items()) if k2 == k}
                                   for k in sorted({k for k, _ in self.gate_by_class})},
                     "learned": self.gate_state},
            "calibration": self.calibration_table(),
            # the world model's own drafts compared with the real output, per command class
            "spec/wm_class_hits": {cls: [self.wm_verdicts[(cls, "hits")], n]
                                   for (cls, kind), n in sorted(self.wm_verdicts.items()) if kind == "n"},
            "committed_delay_frac": self.delay.delay_frac if self.delay is not None else None,
            "spec/unusable_frac": self.arrived_unusable / in_time if in_time else None,
            "spec/no_draft": max(0, c["wm_draft"] - in_time),
            "spec/wm_sec_mean": wm_mean, "tool_sec_mean": tool_mean,
            "tool_hop_sec_mean": statistics.fmean(self.hop_sec) if self.hop_sec else None,
            "tool_hop_frac": sum(self.hop_sec) / sum(self.tool_sec) if self.hop_sec and sum(self.tool_sec) else None,
            "spec/wm_tool_ratio": tool_mean / wm_mean if wm_mean and tool_mean is not None else None,
            "spec/overlap_sec": self.overlap_sec, "spec/block_sec": self.block_sec,
            "latency_saved_sec": self.overlap_sec,
            "latency_saved_frac": self.overlap_sec / (sum(lat) + self.overlap_sec) if sum(lat) > 0 else None,
            "spec/policy_tokens_discarded": self.policy_tokens_discarded,
            "spec/wm_tokens_total": self.wm_tokens_total,
            "spec/wm_tokens_matched": self.wm_tokens_matched,
            "spec/wm_drafts_unusable": self.wm_drafts_unusable,
            "spec/wm_prompt_too_long": self.wm_prompt_too_long,
            "spec/requests": {f"{role}/{outcome}": n for (role, outcome), n in sorted(self.outcomes.items())},
            **{f"calls/{k}": self.calls[k] for k in ("xml", "json", "malformed")},
            "calls/malformed_frac": self.calls["malformed"] / turns if turns else None,
        }


def skips_phrase(summary: dict) -> str:
    """'skipped 34% (busy 5, low_gain 12)' for live lines, '' when nothing was skipped."""
    reasons = summary.get("spec/skip_reasons") or {}
    if not summary.get("spec/skipped_frac"):
        return ""
    parts = ", ".join(f"{r} {n}" for r, n in reasons.items() if n)
    return f"skipped {100 * summary['spec/skipped_frac']:.0f}% ({parts})"


def _source(data: dict) -> str:
    """Who made the drafts of an event (traces written before drafts said so: the world model)."""
    return data.get("source") or "world_model"


def chrome_trace(events: list[dict]) -> dict:
    """Trace events (JSONL rows) -> Chrome trace format: one row per episode (tid), spans for
    policy generation, tool execution, world-model prediction and speculative generation."""
    out, open_spans = [], {}
    begin = {"policy_start": "policy", "exec_start": "tool", "wm_start": "world model", "spec_start": "speculative policy"}
    finish = {"policy_done": "policy", "exec_done": "tool", "wm_draft": "world model", "exec_won": "world model"}
    for ev in events:
        kind, ep, t = ev["kind"], ev["episode"], ev["t"] * 1e6
        pid = 1 if ev.get("mode", "speculative") == "speculative" else 0
        rid = ev.get("request_id", "")
        if kind in begin:
            name = begin[kind] if not (kind == "policy_start" and ev.get("speculative")) else None
            if name:
                open_spans[(pid, ep, name, rid if name != "tool" else "")] = t
            if kind == "spec_start":
                open_spans[(pid, ep, "speculative policy", rid)] = t
        elif kind in finish or (kind == "request_end" and ev.get("role") == "policy"):
            name = finish.get(kind, "speculative policy")
            if kind == "policy_done" and ev.get("speculative"):
                name = "speculative policy"
            key = (pid, ep, name, rid if name != "tool" else "")
            if kind == "exec_won":
                key = (pid, ep, "world model", rid)
            start = open_spans.pop(key, None)
            if start is not None:
                out.append({"name": name, "ph": "X", "ts": start, "dur": max(0.0, t - start),
                            "pid": pid, "tid": ep, "args": {"turn": ev["turn"], **_args(ev)}})
        elif kind in ("match", "rollback"):
            out.append({"name": kind, "ph": "i", "s": "t", "ts": t, "pid": pid, "tid": ep})
    meta = [{"name": "process_name", "ph": "M", "pid": p, "args": {"name": n}}
            for p, n in ((0, "sequential"), (1, "speculative"))]
    return {"traceEvents": meta + out, "displayTimeUnit": "ms"}


def _args(ev: dict) -> dict:
    return {k: v for k, v in ev.items() if k in ("command", "exit_code", "tokens", "outcome", "reason")}


def export_chrome_trace(trace_jsonl: str, out_path: str) -> int:
    with open(trace_jsonl) as f:
        events = [json.loads(line) for line in f if line.strip()]
    trace = chrome_trace(events)
    with open(out_path, "w") as f:
        json.dump(trace, f)
    return len(trace["traceEvents"])


# ---------------------------------------------------------------------------------------------
# Over the rows of a training run's metrics.jsonl


def pooled_success(rows: list[dict]) -> dict:
    """"family/kind" -> success over several steps' `success_by_kind` (metrics.jsonl rows)
    together; a kind with no scored episode there is absent."""
    won, scored = Counter(), Counter()
    for row in rows:
        for k, (w, n) in (row.get("success_by_kind") or {}).items():
            won[k] += w
            scored[k] += n
    return {k: won[k] / scored[k] for k in sorted(scored) if scored[k]}


def mean_of(values) -> float | None:
    """The mean of the values that are not None (None if there are none)."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
