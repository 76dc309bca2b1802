"""The speculation gate: speculative work starts only when its expected gain is positive.

    gate = Gate(cost_share=0.25)
    ask = gate.ask(cls="ls", elapsed_s=0.0, committed=3)      # before asking the world model
    decision = gate.decide(source="world_model", cls="ls", confidence=0.83, elapsed_s=0.1, committed=3)
    if decision.go: ...start the speculative action...
    gate.observe_draft(decision, hit=True)          # when the tool's real output is known

A draft that arrives while its command still runs is worth, in seconds of episode time,

    gain = p * min(G, T_left)  -  (1 - p) * D

and asking the world model for one (before it exists) is worth

    gain = p * min(G, T_left - W)  -  min(W, T_left) * R_w  -  (1 - p) * D

- p        the calibrated probability that the draft equals the real output token for token:
           a Beta estimate over this run's drafts of the same source, command class and
           confidence bin, shrunk towards the class's rate, shrunk towards the source's rate,
           shrunk towards the draft's own confidence (its sequence probability under the world
           model; replayed observations start from HIGH_PRIOR);
- G        what a hit hides at most: the mean committed policy generation time so far, or,
           once hits of the source have been seen (`observe_hidden`), the mean of what they
           hid: G less the time the turn still waited on its speculative generation after the
           tool (a loaded engine that runs low-priority rows late hides little);
- T_left   the tool's expected time left (mean tool time of the class so far, minus what
           has elapsed): a hit cannot hide more than the tool still takes;
- W        the world model's mean time for the class so far: a draft later than the tool is
           cancelled (it cost until then and hid nothing);
- D        what a wasted speculative generation costs committed work: G * R_s, or where the
           policy engine accounts for its own delays (obsspec/engines/base.py SchedulingStats:
           the hf engine; `observe_cost`) the delay it measured per speculative generation, when
           that is the larger (it sees a pass in flight and a prefill that a mean load dilutes);
- R_s, R_w the committed seconds one second of a speculative generation (R_s) or of a
           world-model request (R_w) in flight costs, at the committed load of the moment
           (obsspec/rollout/cost.py: measured from every committed generation of the run, on any
           engine; 0 when nothing committed runs beside it; the prior `cost_share` until
           measured). On a GPU batch with room they are ~0; on CPU cores that the policy and the
           world model share they are ~1.

A negative decision is overruled with probability EXPLORE (`explore` in the event): the rates
and hit rates of what the gate holds back would otherwise never be measured again, and a class
that starts to pay would stay held back.

The gate changes timing only, never tokens: a skipped draft is still compared with the real
output (so the calibration keeps learning), and the next action is generated on the real
observation exactly as sequentially. Decisions depend on timing, so they may differ between
runs; outcomes never do.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from obsspec.rollout.cost import CostModel

HIGH_PRIOR = 0.9        # prior hit rate of exact replays (history cache, siblings, oracle)
DEFAULT_PRIOR = 0.5     # prior hit rate of a draft with no confidence of its own
CONFIDENCE_BINS = (0.2, 0.4, 0.6, 0.8)  # upper edges of the confidence bins (the last is 1.0)
SKIP_REASONS = ("busy", "no_time", "low_gain", "wm_cost")
EXPLORE = 0.1           # share of negative decisions let through to keep measuring
PRIOR_WM_S = 0.2        # the world model's time for a class before one is measured
COST_PRIOR_GENERATIONS = 2  # speculative generations the cost-share prior of an engine's own account is worth


def expected_gain(p_hit: float, gen_s: float, tool_left_s: float, delay_s: float) -> float:
    """Seconds a speculation is expected to save (negative: expected to cost): a hit hides up to
    the generation or the tool's time left, a miss delays committed work by `delay_s`."""
    hide = max(0.0, min(gen_s, tool_left_s))
    return p_hit * hide - (1.0 - p_hit) * delay_s


def draft_gain(p_hit: float, gen_s: float, tool_left_s: float, wm_s: float, wm_rate: float,
               delay_s: float) -> float:
    """Seconds asking the world model is expected to save: its draft arrives after `wm_s`, hides
    what is left of the tool then, costs `wm_rate` committed seconds per second until it arrives
    or the tool ends, and a miss wastes a speculative generation (`delay_s`)."""
    hide = max(0.0, min(gen_s, tool_left_s - wm_s))
    return p_hit * hide - min(wm_s, tool_left_s) * wm_rate - (1.0 - p_hit) * delay_s


def confidence_bin(confidence: float | None) -> int:
    """-1 for a draft without confidence, else 0..len(CONFIDENCE_BINS)."""
    if confidence is None:
        return -1
    return sum(confidence > edge for edge in CONFIDENCE_BINS)


@dataclass(frozen=True)
class Decision:
    go: bool
    reason: str          # "" when go, else one of SKIP_REASONS
    p: float             # calibrated hit probability
    gain_s: float        # expected gain in seconds
    tool_left_s: float
    source: str
    cls: str
    confidence: float | None
    explore: bool = False  # a negative decision overruled (EXPLORE)


class _Tally:
    """A running sum over a count: a mean, or a rate shrunk towards a prior."""

    __slots__ = ("total", "n")

    def __init__(self) -> None:
        self.total, self.n = 0.0, 0

    def add(self, value: float, count: int = 1) -> None:
        self.total += value
        self.n += count

    def mean(self, default: float) -> float:
        return self.total / self.n if self.n else default

    def shrunk(self, prior: float, strength: float) -> float:
        """The mean with `strength` pseudo-counts at `prior` (a Beta estimate, for 0/1 values)."""
        return (self.total + strength * prior) / (self.n + strength)


class Gate:
    """Online estimates of p, G, T, W and the cost rates, and the decisions. One per run (the
    passes of a rollout and the steps of a training run share it)."""

    def __init__(self, *, enabled: bool = True, cost_share: float = 0.25, prior_strength: float = 2.0,
                 prior_tool_s: float = 1.0, prior_gen_s: float = 0.5, min_samples: int = 3,
                 explore: float | None = None, seed: int = 0):
        explore = EXPLORE if explore is None else explore
        if cost_share < 0 or prior_strength <= 0 or prior_tool_s < 0 or prior_gen_s < 0 or not 0 <= explore <= 1:
            raise ValueError("gate: cost_share, prior_tool_s, prior_gen_s must be >= 0, prior_strength > 0 "
                             "and explore in [0, 1]")
        self.enabled, self.cost_share, self.strength = enabled, cost_share, prior_strength
        self.prior_tool_s, self.prior_gen_s, self.min_samples = prior_tool_s, prior_gen_s, min_samples
        self.explore, self._rng = explore, random.Random(seed)
        self.cost = CostModel({"speculative": cost_share, "world_model": cost_share})
        self._source_rate: dict[str, _Tally] = defaultdict(_Tally)
        self._class_rate: dict[tuple[str, str], _Tally] = defaultdict(_Tally)
        self._bin_rate: dict[tuple[str, str, int], _Tally] = defaultdict(_Tally)
        self._tool: dict[str, _Tally] = defaultdict(_Tally)
        self._tool_all = _Tally()
        self._wm: dict[str, _Tally] = defaultdict(_Tally)
        self._wm_all = _Tally()
        self._gen = _Tally()
        self._hidden: dict[str, _Tally] = defaultdict(_Tally)  # per source: what hits hid
        self._delay = _Tally()  # the engine's own account: committed delay over speculative generations

    # -- estimates -------------------------------------------------------------------------------
    def p_hit(self, source: str, cls: str, confidence: float | None) -> float:
        prior = (HIGH_PRIOR if source != "world_model" else
                 DEFAULT_PRIOR if confidence is None else min(max(confidence, 0.0), 1.0))
        p_source = self._source_rate[source].shrunk(prior, self.strength)
        p_class = self._class_rate[(source, cls)].shrunk(p_source, self.strength)
        return self._bin_rate[(source, cls, confidence_bin(confidence))].shrunk(p_class, self.strength)

    def _class_mean(self, per_class: dict, overall: _Tally, cls: str, prior: float) -> float:
        m = per_class.get(cls)
        if m is not None and m.n >= self.min_samples:
            return m.mean(prior)
        return overall.mean(prior)

    def tool_s(self, cls: str) -> float:
        return self._class_mean(self._tool, self._tool_all, cls, self.prior_tool_s)

    def wm_s(self, cls: str) -> float:
        return self._class_mean(self._wm, self._wm_all, cls, PRIOR_WM_S)

    def delay_s(self, committed: float = 1.0) -> float:
        """D: what a wasted speculative generation costs committed work (the larger of the two
        measures, each its prior until measured)."""
        measured = self.gen_s() * self.cost.rate("speculative", committed)
        if not self._delay.n:
            return measured
        own = self._delay.shrunk(self.cost_share * self.gen_s(), COST_PRIOR_GENERATIONS)
        return max(measured, own)

    def gen_s(self) -> float:
        return self._gen.mean(self.prior_gen_s)

    def hidden_s(self, source: str) -> float:
        """What a hit of `source` hides at most: G, or what its hits hid (never more than G)."""
        g, m = self.gen_s(), self._hidden.get(source)
        if m is None or m.n < self.min_samples:
            return g
        return max(0.0, min(g, m.mean(g)))

    # -- the decisions -----------------------------------------------------------------------------
    def _verdict(self, gain: float, left: float, held: str, source: str, cls: str, p: float,
                 confidence: float | None) -> Decision:
        reason = "" if not self.enabled or gain > 0 else "no_time" if left <= 0 else held
        explore = bool(reason) and self._rng.random() < self.explore
        return Decision(not reason or explore, reason, p, gain, left, source, cls, confidence, explore)

    def ask(self, *, cls: str, elapsed_s: float, committed: float) -> Decision:
        """Ask the world model for a draft of this command's output? (`reason` wm_cost when not)"""
        p = self.p_hit("world_model", cls, None)
        left = max(0.0, self.tool_s(cls) - elapsed_s)
        gain = draft_gain(p, self.hidden_s("world_model"), left, self.wm_s(cls),
                          self.cost.rate("world_model", committed), self.delay_s(committed))
        return self._verdict(gain, left - self.wm_s(cls), "wm_cost", "world_model", cls, p, None)

    def decide(self, *, source: str, cls: str, confidence: float | None, elapsed_s: float,
               committed: float = 1.0) -> Decision:
        p = self.p_hit(source, cls, confidence)
        left = max(0.0, self.tool_s(cls) - elapsed_s)
        gain = expected_gain(p, self.hidden_s(source), left, self.delay_s(committed))
        return self._verdict(gain, left, "low_gain", source, cls, p, confidence)

    # -- what happened -----------------------------------------------------------------------------
    def observe_draft(self, decision: Decision, hit: bool) -> None:
        for rate in (self._source_rate[decision.source], self._class_rate[(decision.source, decision.cls)],
                     self._bin_rate[(decision.source, decision.cls, confidence_bin(decision.confidence))]):
            rate.add(bool(hit))

    def observe_tool(self, cls: str, seconds: float) -> None:
        for m in (self._tool[cls], self._tool_all):
            m.add(seconds)

    def observe_cost(self, delay_s: float, generations: int) -> None:
        """The policy engine's own account: committed work was delayed by `delay_s` (a difference
        of its SchedulingStats) while `generations` speculative generations started."""
        self._delay.add(max(0.0, delay_s), max(0, generations))

    def observe_hidden(self, source: str, seconds: float) -> None:
        """A hit of `source` hid `seconds` (G less what the turn waited on it; may be < 0)."""
        self._hidden[source].add(seconds)

    def observe_world_model(self, cls: str, seconds: float) -> None:
        """A world-model request answered after `seconds`."""
        for m in (self._wm[cls], self._wm_all):
            m.add(seconds)

    def observe_generation(self, seconds: float) -> None:
        self._gen.add(seconds)

    def summary(self, committed: float) -> dict:
        """What the gate has learned (summary.json's `gate`): the cost rates at the run's mean
        committed load, and per source and command class the calibrated hit probability and
        the mean tool and world-model times."""
        classes = sorted({c for _, c in self._class_rate} | set(self._tool))
        return {"committed_load": round(committed, 2), "gen_s": round(self.gen_s(), 4),
                "hidden_per_hit_s": {src: round(self.hidden_s(src), 4) for src in sorted(self._hidden)},
                "cost": self.cost.summary(committed),
                "classes": {c: {"tool_s": round(self.tool_s(c), 4), "wm_s": round(self.wm_s(c), 4),
                                **{f"p_{src}": round(self.p_hit(src, c, None), 3)
                                   for src, cc in sorted(self._class_rate) if cc == c}}
                            for c in classes}}
