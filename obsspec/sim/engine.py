"""A fluid model of a continuous-batching policy engine shared by every episode.

Between two events every running request advances at the same rate, one token per decode step of
`EngineSpec.step_sec(n)` seconds, n being the requests decoding in that step. The simulation asks
`next_completion()`, advances time with `advance(t)`, and submits, promotes and cancels requests
as episodes do. Low-priority (speculative) requests decode only while no committed request runs,
as obsspec's hf engine serves them; with `spec_priority=equal` they share the batch.
Tokens are fractional: a cancelled request has wasted exactly the work done on it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from obsspec.sim.config import EngineSpec


@dataclass(eq=False)
class Request:
    tokens: float
    priority: int                 # 0 committed, 1 speculative
    on_done: object = None        # called with no arguments when it finishes
    done_tokens: float = 0.0
    seq: int = 0
    finished_at: float | None = None
    cancelled: bool = False
    meta: dict = field(default_factory=dict)

    @property
    def left(self) -> float:
        return self.tokens - self.done_tokens


class FluidEngine:
    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.now = 0.0
        self.requests: list[Request] = []
        self._seq = itertools.count()
        self.busy_sec = 0.0                 # time with at least one request decoding
        self.tokens = {0: 0.0, 1: 0.0}      # tokens computed, by the priority they had
        self.wasted_tokens = 0.0

    # -- what runs ----------------------------------------------------------------------------
    def _running(self) -> list[Request]:
        live = sorted(self.requests, key=lambda r: (r.priority, r.seq))[: self.spec.max_batch]
        if self.spec.spec_priority == "low" and any(r.priority == 0 for r in live):
            return [r for r in live if r.priority == 0]
        return live

    def rate(self, running: list[Request]) -> float:
        """Tokens per second of each running request."""
        return 1.0 / self.spec.step_sec(len(running)) if running else 0.0

    def next_completion(self) -> float:
        running = self._running()
        if not running:
            return float("inf")
        return self.now + min(r.left for r in running) / self.rate(running)

    def advance(self, t: float, finish_one: bool = False) -> list[Request]:
        """Move time to `t` (no later than next_completion()); return the requests finished.
        `finish_one`: `t` is next_completion(), so the nearest request finishes even if rounding
        left a sliver of it (else the loop could stand still)."""
        dt = t - self.now
        running = self._running()
        if dt > 0 and running:
            step = dt * self.rate(running)
            for r in running:
                r.done_tokens = min(r.tokens, r.done_tokens + step)
                self.tokens[r.priority] += step
            self.busy_sec += dt
        self.now = max(self.now, t)
        if finish_one and running:
            first = min(running, key=lambda r: r.left)
            first.done_tokens = first.tokens
        done = [r for r in running if r.left <= 1e-9 * max(1.0, r.tokens)]
        for r in done:
            r.finished_at = self.now
            self.requests.remove(r)
        return done

    # -- what episodes do ---------------------------------------------------------------------
    def submit(self, tokens: float, priority: int, on_done=None, **meta) -> Request:
        r = Request(max(tokens, 1e-6), priority, on_done, seq=next(self._seq), meta=meta)
        self.requests.append(r)
        return r

    def promote(self, r: Request) -> None:
        """A speculation that matched: committed work from now on (keeps its place in line)."""
        r.priority = 0

    def cancel(self, r: Request) -> float:
        """Stop computing `r`; returns the tokens thrown away."""
        if r.cancelled:
            return 0.0
        r.cancelled = True
        if r in self.requests:
            self.requests.remove(r)
        wasted = r.done_tokens
        self.wasted_tokens += wasted
        return wasted
