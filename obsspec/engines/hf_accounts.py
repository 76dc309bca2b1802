"""What the hf engine counts: its worker's counters (`EngineStats`) and what speculative work has
cost committed work (`Accounts`, read as `SchedulingStats`; docs/ENGINES.md, "Scheduling stats").

    accounts = Accounts()
    accounts.charge(rows, speculative, t0, t1, committed, row_cost)   # after each forward pass
    accounts.settle(running, now)                                     # when a request leaves
    accounts.snapshot                                                 # a consistent SchedulingStats
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

from obsspec.engines.base import SchedulingStats


@dataclass
class EngineStats:
    """Counters of the worker; read them for tests and benchmarks (not thread-synchronised)."""

    prefills: int = 0
    prefill_tokens: int = 0  # prompt tokens prefilled (with a prefix cache: of those, some reused)
    prefill_sec: float = 0.0  # time in prefill forward passes (which run alone)
    decode_steps: int = 0  # decode forward passes
    decode_sec: float = 0.0  # time in decode forward passes
    largest_batch: int = 0  # most requests decoded by one forward pass
    tokens: int = 0
    proposed_tokens: int = 0  # prompt lookup: tokens proposed, and of those accepted
    proposed_accepted: int = 0
    finished: int = 0
    cancelled: int = 0
    # decode steps each recently finished request took part in (bounded, newest last)
    steps_by_request: OrderedDict[str, int] = field(default_factory=OrderedDict)


class PassCost:
    """What a row adds to a batched decode pass: the slope of pass time against rows, fitted by
    least squares over the recent passes (exponentially weighted, so it follows the cache
    lengths). Until the passes seen vary in size it knows no slope, and the linear share
    (every row costs pass / rows) stands in: an upper bound on a pass with fixed overheads."""

    def __init__(self, decay: float = 0.98):
        self.decay = decay
        self.w = self.n = self.t = self.nn = self.nt = 0.0

    def add(self, rows: int, seconds: float) -> None:
        d = self.decay
        self.w, self.n, self.t = d * self.w + 1, d * self.n + rows, d * self.t + seconds
        self.nn, self.nt = d * self.nn + rows * rows, d * self.nt + rows * seconds

    def marginal(self, rows: int, seconds: float) -> float:
        """Seconds one row adds to a pass of `rows` rows that took `seconds`."""
        linear = seconds / rows
        var = self.nn / self.w - (self.n / self.w) ** 2 if self.w else 0.0
        if var < 0.25:  # (fewer than two sizes seen, in effect)
            return linear
        slope = (self.nt / self.w - (self.n / self.w) * (self.t / self.w)) / var
        return min(linear, max(0.0, slope))


class Accounts:
    """Committed time, its delay by speculative passes, and speculative compute. Written by the
    worker thread; `snapshot` is replaced, never mutated, so a reader gets a consistent one."""

    def __init__(self) -> None:
        self.snapshot = SchedulingStats()

    def charge(self, rows: int, speculative: list, t0: float, t1: float, committed,
               row_cost: float | None = None) -> None:
        """Account one forward pass of `rows` rows, `speculative` of them low-priority when it
        started. Their part of the pass is speculative compute, and it delayed every committed
        request of `committed` (those waiting or running meanwhile; one that arrived during the
        pass from its arrival: a pass in flight cannot be interrupted). Their part: all of a pass
        of theirs alone; in a pass they ride in, `row_cost` seconds each (a row's marginal time)."""
        if row_cost is None or len(speculative) == rows:
            share = len(speculative) / rows
        else:
            share = min(1.0, len(speculative) * row_cost / max(t1 - t0, 1e-9))
        for r in committed:
            since = r.committed_since
            if since is not None and t1 > since and not any(r is s for s in speculative):
                r.delay += (t1 - max(t0, since)) * share
        s = self.snapshot
        self.snapshot = replace(s, speculative_compute_sec=s.speculative_compute_sec + (t1 - t0) * share)

    def settle(self, r, now: float) -> None:
        """A committed request leaves: add its time and delay."""
        since = r.committed_since
        if since is None:
            return
        s = self.snapshot
        self.snapshot = replace(
            s, committed=s.committed + 1, committed_sec=s.committed_sec + (now - since),
            committed_delay_sec=s.committed_delay_sec + r.delay)
