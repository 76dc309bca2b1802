"""Discrete-event simulation of a batch of episodes, sequential or speculative (docs/ROLLOUT.md).

    result = simulate_batch(cfg, workload, speculative=True)   # -> BatchResult

A workload is, per episode, its turns (`SimTurn`: action length, kind, tool latency, world-model
latency, whether the draft matches). Every policy action is a request on one shared `FluidEngine`.
Speculative mode follows the scheduler: a bash call starts the tool and a prediction at once;
when the prediction arrives, each of `breadth` drafts gets a low-priority speculative request for
the next action, if the speculation gate (obsspec/rollout/gate.py, the scheduler's own `Gate`,
with `spec.gate` on) expects it to gain; with depth left, a finished speculative bash action gets
its own prediction and speculative next action. When the tool finishes: no prediction yet ->
`exec_won` (cancelled); a correct draft that started -> `match` (its request is promoted, what it
carries goes forward); every draft skipped by the gate -> `skipped`; otherwise `rollback`
(everything speculative is cancelled, its tokens wasted); after the last two the action is
generated as in the sequential run. The gate learns as the scheduler's does: every committed
generation (G), every tool (T per command class) and every draft's outcome, skipped or not (p,
from the draft's confidence, `SpecSpec.confidence`) and what speculation costs committed work
(every committed generation and the requests of each kind in flight beside it, fed to the gate's
cost model as the scheduler feeds it: obsspec/rollout/cost.py; and the engine's own account of
committed delay, as the hf engine's SchedulingStats). Before a prediction, the gate
prices asking the world model (`wm_cost` skips). Everything is deterministic given the workload.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from dataclasses import dataclass, field

from obsspec.rollout.cost import LoadMeter
from obsspec.rollout.gate import SKIP_REASONS, Decision, Gate
from obsspec.sim.config import SimConfig
from obsspec.sim.engine import FluidEngine, Request

GOLDEN = 0.6180339887498949  # spreads the confidences of one prediction's `breadth` drafts


@dataclass(frozen=True)
class SimTurn:
    action_tokens: float
    kind: str = "bash"         # bash | done | error
    tool_s: float = 0.0
    wm_s: float = 0.0          # inf: the prediction never arrives before the tool
    hit: bool = False          # the greedy draft equals the real observation
    cls: str = "other"         # command class (first word of the command)
    prompt_tokens: float = 0.0  # the history this turn's action is generated on (prefill)
    conf_u: float = 0.5        # the uniform behind the draft's confidence (SpecSpec.confidence)


@dataclass
class _Spec:
    correct: bool
    decision: Decision | None = None  # the gate's; None for a draft of the last turn (nothing to start)
    request: Request | None = None
    deeper: "_Branch | None" = None
    pending: bool = False      # matched and promoted: the episode waits for it
    cancelled: bool = False

    @property
    def skipped(self) -> bool:
        return self.decision is not None and not self.decision.go


@dataclass
class _Branch:
    turn: int                  # predicts the observation of this turn
    correct: bool              # built on the real history (every draft below it matched)
    depth: int
    specs: list[_Spec] = field(default_factory=list)
    arrived: bool = False
    cancelled: bool = False


@dataclass
class EpisodeResult:
    episode: int
    start: float = 0.0
    latency: float = 0.0
    tool_sec: float = 0.0
    wait_policy_sec: float = 0.0     # time the episode waited for a committed generation
    blocked_sec: float = 0.0         # time it waited for a matched speculation to finish
    outcomes: dict = field(default_factory=dict)
    gen_sec: dict = field(default_factory=dict)  # turn -> seconds a committed generation took


@dataclass
class BatchResult:
    episodes: list[EpisodeResult]
    wasted_tokens: float
    committed_tokens: float
    spec_tokens: float
    engine_busy_sec: float
    makespan: float
    spec_admitted: int = 0           # speculative requests admitted (prefilled) while speculative
    committed_delay_sec: float = 0.0  # the engine's SchedulingStats (FluidEngine)
    speculative_compute_sec: float = 0.0
    gate_cost: float = 0.0           # the gate's D at the end: committed delay per speculative generation, s
    drafts: int = 0                  # drafts the gate decided on
    skips: dict = field(default_factory=dict)  # drafts the gate skipped, by reason

    @property
    def total_latency(self) -> float:
        return sum(e.latency for e in self.episodes)

    def counts(self) -> dict:
        out = {}
        for e in self.episodes:
            for k, v in e.outcomes.items():
                out[k] = out.get(k, 0) + v
        return out

    def next_gen_mean(self) -> float:
        """Mean committed generation time of turns that follow a tool (the benchmark's G)."""
        xs = [g for e in self.episodes for t, g in e.gen_sec.items() if t > 0]
        return statistics.fmean(xs) if xs else 0.0


class _Batch:
    def __init__(self, cfg: SimConfig, workload: list[list[SimTurn]], speculative: bool):
        self.cfg, self.workload, self.speculative = cfg, workload, speculative
        self.engine = FluidEngine(cfg.engine)
        self.heap: list = []
        self._tie = itertools.count()
        self.results = [EpisodeResult(i) for i in range(len(workload))]
        self.waiting = list(range(len(workload)))
        self.branch: dict[int, _Branch | None] = {}
        self.ready_since: dict[int, float] = {}
        self.tool_start: dict[int, float] = {}
        self.finished: set[int] = set()
        s = cfg.spec
        self.gate = Gate(enabled=s.gate, cost_share=s.gate_cost_share)
        self.meter = LoadMeter()  # requests in flight by kind: the gate's cost samples, as in the scheduler
        self.skips = dict.fromkeys(SKIP_REASONS, 0)
        self.drafts = 0
        self._stats = (0.0, 0.0)  # committed delay, speculative prefills: last fed to the gate

    # -- the clock ------------------------------------------------------------------------------
    def at(self, t: float, fn, *args) -> None:
        heapq.heappush(self.heap, (t, next(self._tie), fn, args))

    def run(self) -> BatchResult:
        c = self.cfg.workload.concurrency or len(self.workload)
        for _ in range(min(c, len(self.waiting))):
            self._start(self.waiting.pop(0))
        eng = self.engine
        while True:
            t_heap = self.heap[0][0] if self.heap else float("inf")
            t_eng = eng.next_completion()
            if t_heap == float("inf") and t_eng == float("inf"):
                break
            if t_eng <= t_heap:
                for r in eng.advance(t_eng, finish_one=True):
                    r.on_done()
            else:
                eng.advance(t_heap)
                _, _, fn, args = heapq.heappop(self.heap)
                fn(*args)
        if len(self.finished) != len(self.workload):
            raise RuntimeError("simulation stalled with episodes unfinished (a bug of the simulator)")
        return BatchResult(self.results, eng.wasted_tokens, eng.tokens[0], eng.tokens[1], eng.busy_sec, eng.now,
                           spec_admitted=eng.prefills[1], drafts=self.drafts,
                           skips={k: v for k, v in self.skips.items() if v},
                           committed_delay_sec=eng.committed_delay_sec,
                           speculative_compute_sec=eng.speculative_compute_sec,
                           gate_cost=self.gate.delay_s(self.meter.count["committed"] or 1))

    @property
    def now(self) -> float:
        return self.engine.now

    # -- one episode ----------------------------------------------------------------------------
    def _start(self, e: int) -> None:
        self.results[e].start = self.now
        self.branch[e] = None
        self._generate(e, 0)

    def _finish(self, e: int) -> None:
        r = self.results[e]
        r.latency = self.now - r.start
        self.finished.add(e)
        if self.waiting:
            # the next episode's start-up (and this one's verification) outside its latency
            gap = self.cfg.workload.episode_gap_s
            if gap > 0:
                self.at(self.now + gap, self._start, self.waiting.pop(0))
            else:
                self._start(self.waiting.pop(0))

    def _count(self, e: int, outcome: str) -> None:
        o = self.results[e].outcomes
        o[outcome] = o.get(outcome, 0) + 1

    def _generate(self, e: int, k: int) -> None:
        t0 = self.now
        turn = self.workload[e][k]
        self.meter.add("committed", 1, t0)
        before = self.meter.areas(t0)

        def done():
            self.meter.add("committed", -1, self.now)
            self.results[e].gen_sec[k] = self.now - t0
            self.results[e].wait_policy_sec += self.now - t0
            self.gate.observe_generation(self.now - t0)
            self.gate.cost.observe(self.now - t0, turn.action_tokens, turn.prompt_tokens,
                                   self.meter.mean_loads(t0, before, self.now))
            self._action(e, k, None)

        self.engine.submit(turn.action_tokens, 0, done, prompt_tokens=turn.prompt_tokens)

    def _action(self, e: int, k: int, carried: _Branch | None) -> None:
        """Turn k's action exists (generated, or a speculation that matched)."""
        turns = self.workload[e]
        turn = turns[k]
        if turn.kind != "bash":
            if carried is not None:
                self._cancel_branch(carried)
            if turn.kind == "error" and k + 1 < len(turns):
                return self._generate(e, k + 1)
            return self._finish(e)
        self.results[e].tool_sec += turn.tool_s
        self.tool_start[e] = self.now
        self.at(self.now + turn.tool_s, self._tool_done, e, k)
        if self.speculative and self.cfg.spec.enabled:
            ask = self.gate.ask(cls=turn.cls, elapsed_s=0.0, committed=self.meter.count["committed"])
            if carried is None and not ask.go:
                self.skips[ask.reason] += 1
                self._count(e, "not_asked")  # (no draft: the turn goes on as sequentially)
                return
            self.branch[e] = carried or self._predict(e, k, True, self.cfg.spec.depth)

    def _predict(self, e: int, k: int, correct: bool, depth: int) -> _Branch:
        b = _Branch(k, correct, depth)
        wm_s = self.workload[e][k].wm_s
        if wm_s != float("inf"):
            self.meter.add("world_model", 1, self.now)
            self.at(self.now + wm_s, self._drafts, e, b)
        return b

    def _drafts(self, e: int, b: _Branch) -> None:
        self.meter.add("world_model", -1, self.now)
        if b.cancelled:
            return
        b.arrived = True
        self.gate.observe_world_model(self.workload[e][b.turn].cls, self.workload[e][b.turn].wm_s)
        turns = self.workload[e]
        turn = turns[b.turn]
        hit = b.correct and turn.hit
        # a branch is the episode's own once its turn's tool runs; before (a deeper branch under
        # a speculative action) all of the tool's expected time is left
        elapsed = self.now - self.tool_start[e] if b is self.branch.get(e) else 0.0
        eng = self.engine
        stats = (eng.committed_delay_sec, eng.prefills[1])
        self.gate.observe_cost(stats[0] - self._stats[0], stats[1] - self._stats[1])
        self._stats = stats
        for j in range(self.cfg.spec.breadth):
            spec = _Spec(correct=hit and j == 0)
            b.specs.append(spec)
            if b.turn + 1 >= len(turns):
                continue
            confidence = self.cfg.spec.confidence((turn.conf_u + j * GOLDEN) % 1.0, spec.correct)
            spec.decision = self.gate.decide(source="world_model", cls=turn.cls, confidence=confidence,
                                             elapsed_s=elapsed, committed=self.meter.count["committed"])
            self.drafts += 1
            if not spec.decision.go:
                self.skips[spec.decision.reason] += 1
                continue
            nxt = turns[b.turn + 1]
            self.meter.add("speculative", 1, self.now)
            spec.request = self.engine.submit(nxt.action_tokens, 1, lambda s=spec: self._spec_done(e, b, s),
                                              prompt_tokens=nxt.prompt_tokens)

    def _spec_done(self, e: int, b: _Branch, spec: _Spec) -> None:
        self.meter.add("speculative", -1, self.now)
        turns, k = self.workload[e], b.turn + 1
        # a wrong draft's action is some other command: assume it is a bash call too
        is_bash = turns[k].kind == "bash" if spec.correct else True
        if b.depth > 1 and is_bash:
            spec.deeper = self._predict(e, k, spec.correct, b.depth - 1)
        if spec.pending:
            blocked = self.now - self.ready_since.pop(e)
            self.results[e].blocked_sec += blocked
            self.gate.observe_hidden("world_model", self.gate.gen_s() - blocked)
            self._action(e, k, spec.deeper)

    def _tool_done(self, e: int, k: int) -> None:
        turns, b = self.workload[e], self.branch.get(e)
        self.branch[e] = None
        self.gate.observe_tool(turns[k].cls, turns[k].tool_s)
        if b is not None:
            if not b.arrived:
                self._count(e, "exec_won")
                self._cancel_branch(b)
            else:
                for s in b.specs:  # skipped drafts too: the calibration keeps learning
                    if s.decision is not None:
                        self.gate.observe_draft(s.decision, s.correct)
                matched = next((s for s in b.specs if s.correct and not s.skipped), None)
                for s in b.specs:
                    if s is not matched:
                        self._cancel_spec(s)
                skipped = all(s.skipped for s in b.specs)  # the turn goes on as if sequential
                self._count(e, "skipped" if skipped else "match" if matched else "rollback")
                if matched is not None and matched.request is not None:
                    self.engine.promote(matched.request)
                    if matched.request.finished_at is not None:
                        self.gate.observe_hidden("world_model", self.gate.gen_s())
                        return self._action(e, k + 1, matched.deeper)
                    matched.pending = True
                    self.ready_since[e] = self.now
                    return
        if k + 1 < len(turns):
            return self._generate(e, k + 1)
        self._finish(e)

    def _cancel_branch(self, b: _Branch) -> None:
        b.cancelled = True
        for s in b.specs:
            self._cancel_spec(s)

    def _cancel_spec(self, s: _Spec) -> None:
        if s.cancelled:
            return
        s.cancelled = True
        if s.request is not None:
            if s.request.finished_at is None:
                self.meter.add("speculative", -1, self.now)
            self.engine.cancel(s.request)
        if s.deeper is not None:
            self._cancel_branch(s.deeper)


def simulate_batch(cfg: SimConfig, workload: list[list[SimTurn]], speculative: bool) -> BatchResult:
    return _Batch(cfg, workload, speculative).run()
