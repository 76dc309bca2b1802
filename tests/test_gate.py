"""The speculation gate's arithmetic and estimates (obsspec/rollout/gate.py) and its measured
cost rates (obsspec/rollout/cost.py); its effect on rollouts is tested through the real sandbox
in tests/test_rollout.py and on engines of known cost in tests/test_gate_engines.py."""

import random

import pytest

from obsspec.rollout.cost import CostModel, LoadMeter
from obsspec.rollout.gate import Gate, confidence_bin, draft_gain, expected_gain


def test_expected_gain_is_the_hidden_time_of_a_hit_minus_the_cost_of_a_miss():
    assert expected_gain(1.0, 0.5, 2.0, 0.125) == pytest.approx(0.5)      # a sure hit hides G
    assert expected_gain(1.0, 0.5, 0.1, 0.125) == pytest.approx(0.1)      # ... at most the tool's time left
    assert expected_gain(0.0, 0.5, 2.0, 0.125) == pytest.approx(-0.125)   # a sure miss costs its delay
    assert expected_gain(0.2, 0.5, 2.0, 0.0) > 0                          # free speculation always goes


def test_a_class_that_keeps_missing_is_gated_and_one_that_hits_is_not():
    gate = Gate(cost_share=0.25, prior_gen_s=0.5, prior_tool_s=1.0, explore=0.0)
    first = gate.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0.0)
    assert first.go and first.p == pytest.approx(0.5)
    for _ in range(6):
        d = gate.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0.0)
        gate.observe_draft(d, hit=False)
        d = gate.decide(source="world_model", cls="cat", confidence=None, elapsed_s=0.0)
        gate.observe_draft(d, hit=True)
    ls = gate.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0.0)
    cat = gate.decide(source="world_model", cls="cat", confidence=None, elapsed_s=0.0)
    assert not ls.go and ls.reason == "low_gain" and ls.p < 0.2
    assert cat.go and cat.p > 0.8


def test_confidence_sets_the_prior_and_its_bin_is_calibrated_separately():
    gate = Gate()
    assert gate.p_hit("world_model", "ls", 0.95) > gate.p_hit("world_model", "ls", 0.05)
    assert gate.p_hit("history", "ls", None) == pytest.approx(0.9)
    # confident drafts of a class hit, unconfident ones miss: the two bins learn apart
    for _ in range(8):
        gate.observe_draft(gate.decide(source="world_model", cls="cat", confidence=0.9, elapsed_s=0), True)
        gate.observe_draft(gate.decide(source="world_model", cls="cat", confidence=0.1, elapsed_s=0), False)
    assert gate.p_hit("world_model", "cat", 0.9) > 0.75 > 0.25 > gate.p_hit("world_model", "cat", 0.1)
    assert confidence_bin(None) == -1 and confidence_bin(0.0) == 0 and confidence_bin(1.0) == 4


def test_a_tool_expected_to_be_done_leaves_nothing_to_hide():
    gate = Gate(prior_tool_s=1.0, explore=0.0)
    for _ in range(3):
        gate.observe_tool("ls", 0.2)
    late = gate.decide(source="world_model", cls="ls", confidence=0.99, elapsed_s=0.5)
    assert not late.go and late.reason == "no_time" and late.tool_left_s == 0


def test_a_disabled_gate_lets_everything_through_but_keeps_estimating():
    gate = Gate(enabled=False)
    for _ in range(10):
        gate.observe_draft(gate.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0), False)
    d = gate.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0)
    assert d.go and d.gain_s < 0


@pytest.mark.parametrize("bad", [{"cost_share": -1}, {"prior_strength": 0}, {"prior_tool_s": -0.1}])
def test_bad_gate_settings_are_refused(bad):
    with pytest.raises(ValueError):
        Gate(**bad)


def feed(cost: CostModel, zero_sum: bool, samples: int = 400, seed: int = 0) -> None:
    """Committed generations on an engine whose seconds per token are 0.01, or (zero_sum: the
    cores are shared by every request in flight) 0.01 per request in flight."""
    rng = random.Random(seed)
    for _ in range(samples):
        loads = {"committed": 1 + rng.randint(0, 4), "speculative": rng.choice([0, 0, 1, 2]),
                 "world_model": rng.choice([0, 0, 1])}
        per_token = 0.01 * (sum(loads.values()) if zero_sum else 1)
        tokens = rng.randint(10, 60)
        cost.observe(per_token * tokens * rng.uniform(0.97, 1.03), tokens, 200, loads)


def test_the_cost_rates_are_measured_from_committed_generations():
    free, shared = CostModel(), CostModel()
    assert free.rate("world_model", committed=3) == 0.25        # the prior, until measured
    feed(free, zero_sum=False)
    feed(shared, zero_sum=True)
    for kind in ("speculative", "world_model"):
        assert free.measured(kind) and shared.measured(kind)
        assert free.rate(kind, committed=3) < 0.05, "a batch with room: speculation is free"
        # one second of speculative work costs the 3 committed requests beside it 3 x 0.01 / tau,
        # tau their mean seconds per token (~0.05 here): about 0.6 s
        assert 0.3 < shared.rate(kind, committed=3) < 1.2, shared.summary(3)
    assert shared.rate("speculative", committed=0) == 0.0, "nothing committed runs: idle compute"


def test_the_load_meter_integrates_requests_in_flight():
    meter = LoadMeter(0.0)
    meter.add("committed", 1, 0.0)
    before = meter.areas(0.0)
    meter.add("speculative", 1, 1.0)
    meter.add("speculative", -1, 3.0)
    loads = meter.mean_loads(0.0, before, 4.0)
    assert loads == {"committed": 1.0, "speculative": 0.5, "world_model": 0.0}


def test_the_same_draft_goes_on_a_free_engine_and_not_on_a_shared_one():
    free, shared = Gate(prior_gen_s=0.4, explore=0.0), Gate(prior_gen_s=0.4, explore=0.0)
    feed(free.cost, zero_sum=False)
    feed(shared.cost, zero_sum=True)
    for g in (free, shared):
        for _ in range(6):
            g.observe_draft(g.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0, committed=3), False)
        g.observe_draft(g.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0, committed=3), True)
    assert free.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0, committed=3).go
    assert not shared.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0, committed=3).go
    # nothing committed beside it: the shared engine's compute is idle, the draft goes
    assert shared.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0, committed=0).go


def test_the_world_model_is_asked_only_where_its_draft_pays_for_its_compute():
    assert draft_gain(1.0, 0.5, 2.0, 0.2, 0.0, 0.1) == pytest.approx(0.5)    # free, sure, in time
    assert draft_gain(1.0, 0.5, 0.6, 0.2, 0.0, 0.1) == pytest.approx(0.4)    # hides what is left after it
    assert draft_gain(1.0, 0.5, 0.1, 0.2, 1.0, 0.1) == pytest.approx(-0.1)   # late: costs until the tool ends
    free, shared = Gate(prior_gen_s=0.3, explore=0.0), Gate(prior_gen_s=0.3, explore=0.0)
    for g in (free, shared):
        feed(g.cost, zero_sum=g is shared)
        for _ in range(3):
            g.observe_tool("ls", 1.2)
            g.observe_world_model("ls", 0.2)
    assert free.ask(cls="ls", elapsed_s=0, committed=3).go
    held = shared.ask(cls="ls", elapsed_s=0, committed=3)
    assert not held.go and held.reason == "wm_cost"
    assert shared.ask(cls="ls", elapsed_s=0, committed=0).go  # idle compute
    for _ in range(3):
        shared.observe_world_model("cat", 2.0)
        shared.observe_tool("cat", 1.0)
    late = shared.ask(cls="cat", elapsed_s=0, committed=0)
    assert not late.go and late.reason == "no_time"


def test_exploration_lets_a_share_of_held_back_decisions_through():
    gate = Gate(prior_gen_s=0.4, explore=0.25, seed=3)
    feed(gate.cost, zero_sum=True)
    decisions = [gate.ask(cls="ls", elapsed_s=0, committed=4) for _ in range(400)]
    explored = sum(d.explore for d in decisions)
    assert all(d.go == d.explore for d in decisions)
    assert 60 < explored < 140
