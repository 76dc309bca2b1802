"""The gate on engines of known cost (obsspec/rollout/gate.py, obsspec/rollout/cost.py).

Two fake engines, both timed by sleeps, so that the cost of speculation is what the engine says:
- shared: one processor for every request in flight (committed and speculative policy rows and
  the world model's drafts): each token takes `UNIT` seconds times the requests in flight, as on
  2 CPU cores where a speculative row or a draft takes the compute a committed row needs;
- fixed: each token takes `UNIT` seconds whatever else runs (a GPU batch with room).
The world model answers every command after `WM_TOKENS` tokens of the same compute; half its
drafts are wrong. On the shared engine the gate must learn that drafts cost more than they hide
and back off until speculative and sequential rollouts take about the same time; on the fixed
engine, and for the model-free tiers' drafts, it must keep speculating.
"""

import asyncio

from fakes import ByteTokenizer, ScriptedPolicy
from obsspec.config import TasksConfig
from obsspec.env.suite import generate_builtin
from obsspec.rollout.batch import run_episodes
from obsspec.rollout.gate import Gate
from obsspec.rollout.predictors import Base, Draft, WithHistory
from obsspec.rollout.scheduler import Sampling
from obsspec.rollout.tools import ToolResult
from obsspec.tokens import ChatFormat

UNIT = 0.0005       # seconds per token with one request in flight
WM_TOKENS = 60      # a draft's tokens
TOOL_S = 0.3
COMMANDS = ["ls", "pwd", "cat notes-{h}.txt", "grep -c x data-{h}.csv", "echo {h}"]
SAMPLING = Sampling(max_turns=6, max_new_tokens=400, max_context=6000, seed=5)


class Compute:
    """Requests in flight on one processor (shared) or on their own (fixed)."""

    def __init__(self, shared: bool):
        self.shared, self.active = shared, 0

    def token_s(self) -> float:
        return UNIT * (max(1, self.active) if self.shared else 1)


class Policy(ScriptedPolicy):
    def __init__(self, tok, compute: Compute):
        super().__init__(tok, COMMANDS, token_delay=UNIT, done_after=5)
        self.compute = compute

    @property
    def token_delay(self):
        return self.compute.token_s()

    @token_delay.setter
    def token_delay(self, value):
        pass

    async def generate(self, request):
        self.compute.active += 1
        try:
            return await super().generate(request)
        finally:
            self.compute.active -= 1


class Tool:
    """Every command answers `output of COMMAND` after TOOL_S (nothing runs)."""

    async def start(self):
        pass

    async def run(self, command, turn, timeout=None):
        await asyncio.sleep(TOOL_S)
        return ToolResult(f"output of {command}\n(exit_code=0)", 0, TOOL_S)

    async def reward(self):
        return 1.0

    async def close(self):
        pass


class WorldModel(Base):
    """Right on even turns, one byte off on odd ones, after WM_TOKENS tokens of the compute."""

    name = "world_model"

    def __init__(self, compute: Compute):
        self.compute, self.in_flight = compute, lambda delta: None

    def watch(self, in_flight):
        self.in_flight = in_flight

    async def predict(self, request):
        if not request.world_model:
            return []
        self.in_flight(1)
        self.compute.active += 1
        try:
            for _ in range(WM_TOKENS):
                await asyncio.sleep(self.compute.token_s())
        finally:
            self.compute.active -= 1
            self.in_flight(-1)
        body = f"output of {request.commands[-1]}\n(exit_code=0)"
        if (request.turn + request.episode) % 2:
            body = body.replace("output", "outputs")
        return [Draft(body, WM_TOKENS, confidence=0.5)]


def tasks(n: int):
    return generate_builtin(TasksConfig(num_instances=n, families=("count-lines", "find-by-name")))[0]


def rollouts(shared: bool, speculative: bool, gate: Gate, episodes: int = 8, compute: Compute | None = None,
             predictor=None):
    compute = compute or Compute(shared)
    tok = ByteTokenizer()
    predictor = predictor or WorldModel(compute)
    ts = tasks(episodes)
    batch = asyncio.run(run_episodes(Policy(tok, compute), ChatFormat(tok), ts, lambda task, e: Tool(), SAMPLING,
                                     cap=512, speculative=speculative, predictor=predictor if speculative else None,
                                     gate=gate))
    return batch


def mean_latency(batch) -> float:
    return sum(t.latency_sec for t in batch.trajectories) / len(batch.trajectories)


def test_on_a_shared_processor_the_gate_backs_off_until_speculation_costs_nothing():
    gate = Gate(prior_tool_s=TOOL_S, prior_gen_s=0.05)
    seq = rollouts(True, False, gate)                    # (the gate learns the baseline from it too)
    off = rollouts(True, True, Gate(enabled=False, prior_tool_s=TOOL_S))
    on = [rollouts(True, True, gate) for _ in range(3)]  # it keeps what it learnt, as a run's passes do
    seq_b = rollouts(True, False, gate)                  # A/B/A: the two sequential passes give the noise
    base = (mean_latency(seq) + mean_latency(seq_b)) / 2
    noise = abs(mean_latency(seq_b) / mean_latency(seq) - 1)
    ungated = mean_latency(off) / base - 1
    gated = mean_latency(on[-1]) / base - 1
    assert ungated > 0.05, f"precondition: speculating every draft should cost here ({ungated:+.1%})"
    assert gated < max(0.03, 2 * noise), f"the gate let speculation cost {gated:+.1%} (ungated {ungated:+.1%}, A/A {noise:.1%})"
    learned = on[-1].metrics.summary()["gate"]
    assert learned["learned"]["cost"]["measured"]["world_model"], learned
    held = sum(n for d in learned["decisions"].values() for r, n in d.items() if r in ("wm_cost", "low_gain"))
    asked = sum(n for d in learned["decisions"].values() for n in d.values())
    assert held >= 0.6 * asked, learned["decisions"]


def test_on_an_engine_with_room_the_gate_keeps_speculating():
    gate = Gate(prior_tool_s=TOOL_S, prior_gen_s=0.05)
    seq = rollouts(False, False, gate)
    on = [rollouts(False, True, gate) for _ in range(2)]
    assert mean_latency(on[-1]) < mean_latency(seq), "speculation on a free engine should save time"
    s = on[-1].metrics.summary()
    assert s["spec/gate_passed"] >= 0.5 * (s["spec/gate_passed"] + s["spec/skipped_wm_cost"]), s["gate"]
    assert s["spec/exact_frac"] and s["spec/exact_frac"] > 0.3


def test_on_a_shared_processor_the_model_free_tiers_still_speculate():
    """The same episodes again (same seeds: the same commands, as a GRPO group's members repeat
    each other's): the history cache's exact replays cost no compute to draft and always hit, so
    their speculative actions still start."""
    gate = Gate(prior_tool_s=TOOL_S, prior_gen_s=0.05)
    compute = Compute(True)
    rollouts(True, False, gate, compute=compute)
    tiered = WithHistory(WorldModel(compute), siblings=False)
    rollouts(True, True, gate, compute=compute, predictor=tiered)
    on = rollouts(True, True, gate, compute=compute, predictor=tiered)
    decisions = on.metrics.summary()["gate"]["decisions"]
    history = {r: n for k, d in decisions.items() if k.startswith("history/") for r, n in d.items()}
    assert history.get("go", 0) > 0 and history.get("go", 0) >= 3 * history.get("low_gain", 0), decisions
