"""The event stream: everything the scheduler does, timestamped, for every consumer.

The scheduler calls `bus.emit(kind, episode, turn, **data)`; consumers (metrics, the JSONL trace,
the live display) subscribe with a callable. Nothing else looks into the scheduler's state.

Kinds (data fields in brackets):
    episode_start, episode_end [reward, turns, latency_sec, infra_error]
    policy_start [request_id, speculative], policy_done [request_id, tokens, speculative]
    action [parsed, form]                   a committed turn parsed: bash | done | error, and
                                            the call's form xml | json ("" for none)
    exec_start [command], exec_done [seconds, exit_code, hop_sec]
                                            hop_sec: of the tool's seconds, the hop to a
                                            sandbox on another machine (0 for a local one)
    episode_retry [attempt, infra_error]    the episode's sandbox was lost (its Ray worker
                                            died): it runs again from its start
    wm_start [request_id], wm_draft [request_id, drafts, tokens]
    spec_start [request_id, draft]          a speculative policy generation begins
    match [request_id, pending]             the draft equals the real observation: kept
    rollback [drafts]                       no draft matched: speculative work cancelled
    exec_won [request_id]                   the tool finished before the world model
    spec_skipped [busy]                     not speculated on: `busy` committed generations
                                            were in flight (rollout.busy_limit)
    gate [go, reason, p, gain_s, source, cls, explore]
                                            the gate's decision on a draft, or (reason
                                            wm_cost, p None) on asking the world model
    draft_verdict [p, hit, source, cls]     a draft compared with the real output
    gate_state [committed_load, gen_s, cost, classes]
                                            what the gate learned, at a batch's end
    request_end [request_id, role, outcome, reason, tokens]   every request's fate:
                 outcome in {committed, cancelled, failed}
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Event:
    kind: str
    t: float  # seconds since the bus started
    episode: int
    turn: int
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "t": round(self.t, 6), "episode": self.episode,
                "turn": self.turn, **self.data}


class EventBus:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._t0 = clock()
        self._subscribers: list[Callable[[Event], None]] = []

    def subscribe(self, consumer: Callable[[Event], None]) -> None:
        self._subscribers.append(consumer)

    def now(self) -> float:
        return self._clock() - self._t0

    def emit(self, kind: str, episode: int, turn: int, **data: Any) -> Event:
        event = Event(kind, self.now(), episode, turn, data)
        for consumer in self._subscribers:
            consumer(event)
        return event


class JsonlTrace:
    """Writes one JSON line per event (the run's trace file)."""

    def __init__(self, path: str, mode: str = ""):
        self._file = open(path, "w")
        self._mode = mode

    def __call__(self, event: Event) -> None:
        row = event.to_dict()
        if self._mode:
            row["mode"] = self._mode
        self._file.write(json.dumps(row, sort_keys=True) + "\n")

    def close(self) -> None:
        self._file.close()
