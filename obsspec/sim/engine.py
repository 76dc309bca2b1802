"""A fluid model of a continuous-batching policy engine shared by every episode.

A request waits in line, is admitted (its prompt prefilled), then decodes. Between two events
every decoding request advances at the same rate, one token per decode step of
`EngineSpec.step_sec(n)` seconds, n being the requests decoding in that step. The simulation asks
`next_completion()`, advances time with `advance(t)`, and submits, promotes and cancels requests
as episodes do. Tokens are fractional: a cancelled request has wasted exactly the work done on it.

Priority follows obsspec's hf engine (obsspec/engines/hf.py, `_admit` and `_decode`) with
`spec_priority=low`: a speculative request is admitted only while no committed request runs or
waits, and once admitted it decodes only while no committed request decodes; promotion makes it
committed work in its place in line. With `spec_priority=equal` (vLLM FCFS) all requests share.
With `spec_priority=priority` (vLLM's `--scheduling-policy priority`, which the GPU recipes run) the
line is ordered by priority, committed requests first, and admitted requests share the decode
steps; vLLM also preempts a lower-priority running request when a running one needs KV blocks,
which is not modelled.

Prefill (`EngineSpec.prefill_tok_s` > 0) is the hf engine's: each admitted request's prompt is
prefilled alone, in one forward pass that nothing interrupts, while every other request waits.
Admission goes in rounds, as the engine's worker loop does: a round prefills every request that
was admissible when it began, one after the other, and a request that arrives meanwhile (committed
or not) waits for the round to end. So a speculative prefill begun in idle time delays committed
work that arrives during it, and a request cancelled during its round is still prefilled.
With `prefill_tok_s=0` prefill is free (its cost folded into the decode speed), as for vLLM's
chunked prefill, which shares the batch.

What speculation costs committed work is accounted as the hf engine accounts it
(obsspec/engines/base.py SchedulingStats, hf_accounts.py `Accounts.charge`): `speculative_compute_sec` is engine
time on speculative rows, a decode step of n rows of which k speculative counted k/n of it (the
linear share) and a speculative prefill all of it; over that time every committed request, waiting
or running, is delayed by the same amount, added to `committed_delay_sec` when it finishes. With
`spec_priority=low` speculative rows decode only when no committed row does, so the delay comes
only from a speculative prefill in flight; with `equal` each committed request is delayed by the
speculative share of every step it shares.
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
    prompt_tokens: float = 0.0    # prefilled on admission
    admitted: bool = False        # prefilled (or being prefilled): holds a place in the batch
    finished_at: float | None = None
    cancelled: bool = False
    delay_mark: float = 0.0       # the engine's delay clock when it became committed
    meta: dict = field(default_factory=dict)

    @property
    def left(self) -> float:
        return self.tokens - self.done_tokens


class FluidEngine:
    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.now = 0.0
        self.waiting: list[Request] = []    # in line, by arrival
        self.decoding: list[Request] = []   # admitted and prefilled
        self.round: list[Request] = []      # admitted in this round, prefill still to come
        self.prefill_left = 0.0             # seconds left of round[0]'s prefill
        self._seq = itertools.count()
        self.busy_sec = 0.0                 # time with a prefill or at least one request decoding
        self.prefill_sec = 0.0
        self.prefills = {0: 0, 1: 0}        # requests admitted, by the priority they had then
        self.tokens = {0: 0.0, 1: 0.0}      # tokens decoded, by the priority they had
        self.wasted_tokens = 0.0
        # SchedulingStats: all live committed requests are delayed alike, so one clock of the
        # delay per committed request serves them all (a request keeps its mark)
        self.delay_clock = 0.0
        self.committed_delay_sec = 0.0
        self.speculative_compute_sec = 0.0

    @property
    def requests(self) -> list[Request]:
        """Every live request: waiting, being prefilled, or decoding."""
        return [*self.waiting, *(r for r in self.round if not r.cancelled), *self.decoding]

    # -- what runs ----------------------------------------------------------------------------
    def _urgent(self) -> bool:
        """Committed work running or waiting: then speculative work is not admitted."""
        return any(r.priority == 0 for r in self.requests)

    def _admit(self) -> None:
        """Start an admission round if none runs: every request admissible now, in line order."""
        if self.round:
            return
        held_back = self.spec.spec_priority == "low" and self._urgent()
        room = self.spec.max_batch - len(self.decoding)
        line = self.waiting
        if self.spec.spec_priority == "priority":
            line = sorted(self.waiting, key=lambda r: (r.priority, r.seq))
        for r in list(line):
            if room <= 0:
                break
            if held_back and r.priority > 0:
                continue
            self.waiting.remove(r)
            r.admitted = True
            self.prefills[r.priority] += 1
            room -= 1
            if self.spec.prefill_tok_s > 0:
                self.round.append(r)
            else:
                self.decoding.append(r)
        if self.round:
            self.prefill_left = self.spec.prefill_sec(self.round[0].prompt_tokens)

    def _running(self) -> list[Request]:
        """The requests decoding now (none while a prefill runs)."""
        if self.round:
            return []
        if self.spec.spec_priority == "low" and any(r.priority == 0 for r in self.decoding):
            return [r for r in self.decoding if r.priority == 0]
        return self.decoding

    def rate(self, running: list[Request]) -> float:
        """Tokens per second of each running request."""
        return 1.0 / self.spec.step_sec(len(running)) if running else 0.0

    def next_completion(self) -> float:
        """When the next prefill or request finishes (inf: nothing runs)."""
        if self.round:
            return self.now + self.prefill_left
        running = self._running()
        if not running:
            return float("inf")
        return self.now + min(r.left for r in running) / self.rate(running)

    def advance(self, t: float, finish_one: bool = False) -> list[Request]:
        """Move time to `t` (no later than next_completion()); return the requests finished.
        `finish_one`: `t` is next_completion(), so the nearest prefill or request finishes even
        if rounding left a sliver of it (else the loop could stand still)."""
        dt = t - self.now
        self.now = max(self.now, t)
        if self.round:
            if dt > 0:
                self.prefill_left -= dt
                self.busy_sec += dt
                self.prefill_sec += dt
                if self.round[0].priority > 0:  # cancelled or not, it is prefilled
                    self._charge(dt, 1.0)
            if finish_one or self.prefill_left <= 1e-12:
                self._end_prefill()
            return []
        running = self._running()
        if dt > 0 and running:
            step = dt * self.rate(running)
            for r in running:
                r.done_tokens = min(r.tokens, r.done_tokens + step)
                self.tokens[r.priority] += step
            self.busy_sec += dt
            speculative = sum(r.priority > 0 for r in running)
            if speculative:
                self._charge(dt, speculative / len(running))
        if finish_one and running:
            first = min(running, key=lambda r: r.left)
            first.done_tokens = first.tokens
        done = [r for r in running if r.left <= 1e-9 * max(1.0, r.tokens)]
        for r in done:
            r.finished_at = self.now
            self.decoding.remove(r)
            self._settle(r)
        if done:
            self._admit()
        return done

    def _charge(self, dt: float, share: float) -> None:
        """`dt` seconds of engine time, `share` of it on speculative rows."""
        self.speculative_compute_sec += dt * share
        self.delay_clock += dt * share

    def _settle(self, r: Request) -> None:
        """A committed request leaves: its delay joins the scheduling stats."""
        if r.priority == 0:
            self.committed_delay_sec += self.delay_clock - r.delay_mark

    def _end_prefill(self) -> None:
        r = self.round.pop(0)
        if not r.cancelled:
            self.decoding.append(r)
        if self.round:
            self.prefill_left = self.spec.prefill_sec(self.round[0].prompt_tokens)
        else:
            self.prefill_left = 0.0
            self._admit()

    # -- what episodes do ---------------------------------------------------------------------
    def submit(self, tokens: float, priority: int, on_done=None, prompt_tokens: float = 0.0, **meta) -> Request:
        r = Request(max(tokens, 1e-6), priority, on_done, seq=next(self._seq), prompt_tokens=prompt_tokens,
                    meta=meta, delay_mark=self.delay_clock)
        self.waiting.append(r)
        self._admit()
        return r

    def promote(self, r: Request) -> None:
        """A speculation that matched: committed work from now on (keeps its place in line)."""
        r.priority = 0
        r.delay_mark = self.delay_clock
        self._admit()

    def cancel(self, r: Request) -> float:
        """Stop computing `r`; returns the tokens thrown away. A request admitted in the current
        round is prefilled all the same (the hf engine drops cancelled requests only between
        rounds)."""
        if r.cancelled:
            return 0.0
        r.cancelled = True
        self._settle(r)
        for line in (self.waiting, self.decoding):
            if r in line:
                line.remove(r)
        wasted = r.done_tokens
        self.wasted_tokens += wasted
        self._admit()
        return wasted
