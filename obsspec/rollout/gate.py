"""The speculation gate: a speculative generation starts only when its expected gain is positive.

    gate = Gate(cost_share=0.25)
    decision = gate.decide(source="world_model", cls="ls", confidence=0.83, elapsed_s=0.1)
    if decision.go: ...start the speculative action...
    gate.observe_draft(decision, hit=True)          # when the tool's real output is known

A draft that arrives while its command still runs is worth, in seconds of episode time,

    gain = p * min(G, T_left)  -  (1 - p) * D

- p        the calibrated probability that the draft equals the real output token for token:
           a Beta estimate over this run's drafts of the same source, command class and
           confidence bin, shrunk towards the class's rate, shrunk towards the source's rate,
           shrunk towards the draft's own confidence (its sequence probability under the world
           model; replayed observations start from HIGH_PRIOR);
- G        the mean committed policy generation time so far: what a hit hides at most;
- T_left   the tool's expected time left (mean tool time of the class so far, minus what
           has elapsed): a hit cannot hide more than the tool still takes;
- D        the committed time a speculative generation delays, summed over the committed
           requests it delays (a wasted one is pure loss): preempted, low-priority speculation
           costs ~0, on a saturated first-come engine it costs about G. The prior is
           cost_share * G, worth COST_PRIOR_GENERATIONS generations; where the policy engine
           measures its delays (obsspec/engines/base.py SchedulingStats.committed_delay_sec), the
           scheduler feeds them in with the number of speculative generations that caused them
           (`observe_cost`), and the estimate follows the engine.

The gate changes timing only, never tokens: a skipped draft is still compared with the real
output (so the calibration keeps learning), and the next action is generated on the real
observation exactly as sequentially. Decisions depend on timing, so they may differ between
runs; outcomes never do.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

HIGH_PRIOR = 0.9        # prior hit rate of exact replays (history cache, siblings, oracle)
DEFAULT_PRIOR = 0.5     # prior hit rate of a draft with no confidence of its own
CONFIDENCE_BINS = (0.2, 0.4, 0.6, 0.8)  # upper edges of the confidence bins (the last is 1.0)
SKIP_REASONS = ("busy", "no_time", "low_gain")
COST_PRIOR_GENERATIONS = 2  # speculative generations the configured cost share is worth


def expected_gain(p_hit: float, gen_s: float, tool_left_s: float, delay_s: float) -> float:
    """Seconds a speculation is expected to save (negative: expected to cost): a hit hides up to
    the generation or the tool's time left, a miss delays committed work by `delay_s`."""
    hide = max(0.0, min(gen_s, tool_left_s))
    return p_hit * hide - (1.0 - p_hit) * delay_s


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
    """Online estimates of p, G and T, and the decision. One per scheduler (a run, a training
    step's batch keeps the trainer's across steps)."""

    def __init__(self, *, enabled: bool = True, cost_share: float = 0.25, prior_strength: float = 2.0,
                 prior_tool_s: float = 1.0, prior_gen_s: float = 0.5, min_samples: int = 3):
        if cost_share < 0 or prior_strength <= 0 or prior_tool_s < 0 or prior_gen_s < 0:
            raise ValueError("gate: cost_share, prior_tool_s, prior_gen_s must be >= 0 and prior_strength > 0")
        self.enabled, self.cost_share, self.strength = enabled, cost_share, prior_strength
        self.prior_tool_s, self.prior_gen_s, self.min_samples = prior_tool_s, prior_gen_s, min_samples
        self._source_rate: dict[str, _Tally] = defaultdict(_Tally)
        self._class_rate: dict[tuple[str, str], _Tally] = defaultdict(_Tally)
        self._bin_rate: dict[tuple[str, str, int], _Tally] = defaultdict(_Tally)
        self._tool: dict[str, _Tally] = defaultdict(_Tally)
        self._tool_all = _Tally()
        self._gen = _Tally()
        self._delay = _Tally()  # committed delay over speculative generations

    # -- estimates -------------------------------------------------------------------------------
    def p_hit(self, source: str, cls: str, confidence: float | None) -> float:
        prior = (HIGH_PRIOR if source != "world_model" else
                 DEFAULT_PRIOR if confidence is None else min(max(confidence, 0.0), 1.0))
        p_source = self._source_rate[source].shrunk(prior, self.strength)
        p_class = self._class_rate[(source, cls)].shrunk(p_source, self.strength)
        return self._bin_rate[(source, cls, confidence_bin(confidence))].shrunk(p_class, self.strength)

    def tool_s(self, cls: str) -> float:
        m = self._tool.get(cls)
        if m is not None and m.n >= self.min_samples:
            return m.mean(self.prior_tool_s)
        return self._tool_all.mean(self.prior_tool_s)

    def delay_s(self) -> float:
        """D: committed delay per speculative generation, the prior moved by measurements."""
        return self._delay.shrunk(self.cost_share * self.gen_s(), COST_PRIOR_GENERATIONS)

    def gen_s(self) -> float:
        return self._gen.mean(self.prior_gen_s)

    # -- the decision ------------------------------------------------------------------------------
    def decide(self, *, source: str, cls: str, confidence: float | None, elapsed_s: float) -> Decision:
        p = self.p_hit(source, cls, confidence)
        left = max(0.0, self.tool_s(cls) - elapsed_s)
        gain = expected_gain(p, self.gen_s(), left, self.delay_s())
        if not self.enabled or gain > 0:
            reason = ""
        else:
            reason = "no_time" if left <= 0 else "low_gain"
        return Decision(not reason, reason, p, gain, left, source, cls, confidence)

    # -- what happened -----------------------------------------------------------------------------
    def observe_draft(self, decision: Decision, hit: bool) -> None:
        for rate in (self._source_rate[decision.source], self._class_rate[(decision.source, decision.cls)],
                     self._bin_rate[(decision.source, decision.cls, confidence_bin(decision.confidence))]):
            rate.add(bool(hit))

    def observe_tool(self, cls: str, seconds: float) -> None:
        for m in (self._tool[cls], self._tool_all):
            m.add(seconds)

    def observe_cost(self, delay_s: float, generations: int) -> None:
        """Committed work was delayed by `delay_s` (a difference of the engine's SchedulingStats)
        while `generations` speculative generations started."""
        self._delay.add(max(0.0, delay_s), max(0, generations))

    def observe_generation(self, seconds: float) -> None:
        self._gen.add(seconds)
