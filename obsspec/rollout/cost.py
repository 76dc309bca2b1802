"""What speculative work costs committed work, measured while it runs, on any engine.

    meter = LoadMeter()                     # the scheduler counts requests in flight by kind
    meter.add("speculative", +1, now)       # ... and -1 when one ends
    cost = CostModel()
    cost.observe(seconds, tokens, prompt_tokens, meter.mean_loads(since, now, areas))
    cost.rate("world_model", committed=3)   # committed seconds lost per second of one request

Every committed policy generation is a sample: its seconds per generated token, and how many
committed, speculative and world-model requests were in flight, on average, over its life (the
meter's time integrals). A least-squares fit, forgetting old samples, of

    seconds_per_token = b0 + b_p * prompt/tokens + b_c * committed + b_s * speculative + b_w * world_model

gives what one more request of a kind in flight adds to every committed token. One speculative
request in flight for a second then delays the C committed requests beside it by about
b_s * C / tau seconds (tau: their seconds per token) — `rate("speculative", C)`; the same for a
world-model request. The figure needs no view inside the engine: it holds for the hf engine,
a vLLM server, and a world model on another engine that shares the same cores. Where the batch
has room (a GPU) the slopes are ~0 and speculation is free; on 2 CPU cores sharing one compute
a slope is about tau / C, and a second of speculative work costs about a second of committed
work. Until `MIN_SAMPLES` samples with each kind in flight exist, the rate is the prior.
"""

from __future__ import annotations

import numpy as np

KINDS = ("committed", "speculative", "world_model")
MIN_SAMPLES = 8      # samples with a kind in flight before its slope replaces the prior
FORGET = 0.995       # weight of the past per new sample (~200 samples of memory)
RIDGE = 1e-3         # pulls an unidentified slope to 0 rather than letting it swing


class LoadMeter:
    """Requests in flight by kind, and their time integrals (request-seconds), so that the mean
    load over any stretch is (area after - area before) / seconds."""

    def __init__(self, now: float = 0.0):
        self.count = dict.fromkeys(KINDS, 0)
        self.area = dict.fromkeys(KINDS, 0.0)
        self.t = now

    def _advance(self, now: float) -> None:
        if now > self.t:
            for k in KINDS:
                self.area[k] += self.count[k] * (now - self.t)
            self.t = now

    def add(self, kind: str, delta: int, now: float) -> None:
        self._advance(now)
        self.count[kind] += delta

    def areas(self, now: float) -> dict[str, float]:
        self._advance(now)
        return dict(self.area)

    def mean_loads(self, since: float, before: dict[str, float], now: float) -> dict[str, float]:
        """Mean requests of each kind in flight between `since` (areas `before`) and `now`."""
        after, span = self.areas(now), max(now - since, 1e-9)
        return {k: (after[k] - before[k]) / span for k in KINDS}


class CostModel:
    """The fit of the module docstring, and the rates the gate prices speculation with."""

    def __init__(self, prior_rates: dict[str, float] | None = None):
        self.prior = {"speculative": 0.25, "world_model": 0.25, **(prior_rates or {})}
        n = 2 + len(KINDS)
        self.xtx = np.zeros((n, n))
        self.xty = np.zeros(n)
        self.samples = dict.fromkeys(KINDS, 0.0)  # (forgetting) samples with the kind in flight
        self.tau = 0.0       # mean seconds per committed token (forgetting)
        self._tau_sum = 0.0
        self.weight = 0.0
        self._beta: np.ndarray | None = None

    def observe(self, seconds: float, tokens: int, prompt_tokens: int, loads: dict[str, float]) -> None:
        """One committed generation: its time, tokens, prompt, and the mean loads over its life
        (`committed` counts it too; one is taken off)."""
        if tokens <= 0 or seconds <= 0:
            return
        y = seconds / tokens
        x = np.array([1.0, prompt_tokens / tokens, max(0.0, loads["committed"] - 1.0),
                      loads["speculative"], loads["world_model"]])
        self.xtx = FORGET * self.xtx + np.outer(x, x)
        self.xty = FORGET * self.xty + x * y
        for k in KINDS:
            self.samples[k] = FORGET * self.samples[k] + (loads[k] > (1.0 if k == "committed" else 0.0))
        self.weight = FORGET * self.weight + 1.0
        self._tau_sum = FORGET * self._tau_sum + y
        self.tau = self._tau_sum / self.weight
        self._beta = None

    def slopes(self) -> dict[str, float]:
        """Seconds each committed token gains per extra request of a kind in flight."""
        if self._beta is None:
            reg = RIDGE * max(1.0, float(np.trace(self.xtx)) / len(self.xty)) * np.eye(len(self.xty))
            reg[0, 0] = 0.0
            try:
                self._beta = np.linalg.solve(self.xtx + reg, self.xty)
            except np.linalg.LinAlgError:
                self._beta = np.zeros(len(self.xty))
        b = self._beta
        return {"committed": float(b[2]), "speculative": float(b[3]), "world_model": float(b[4])}

    def measured(self, kind: str) -> bool:
        return self.samples[kind] >= MIN_SAMPLES and self.tau > 0

    def rate(self, kind: str, committed: float) -> float:
        """Committed seconds lost per second of one request of `kind` in flight beside
        `committed` committed requests (0 when none runs: it uses idle compute)."""
        if committed <= 0:
            return 0.0
        if not self.measured(kind):
            return self.prior[kind]
        return max(0.0, self.slopes()[kind]) * committed / self.tau

    def summary(self, committed: float) -> dict:
        s = self.slopes() if self.weight else dict.fromkeys(KINDS, 0.0)
        return {"seconds_per_token": round(self.tau, 6),
                "slope_per_request": {k: round(v, 7) for k, v in s.items()},
                "samples": {k: round(v, 1) for k, v in self.samples.items()},
                "rate_at_mean_load": {k: round(self.rate(k, committed), 4) for k in ("speculative", "world_model")},
                "measured": {k: self.measured(k) for k in ("speculative", "world_model")}}
