"""The speculation gate's arithmetic and estimates (obsspec/rollout/gate.py); its effect on
rollouts is tested through the real sandbox in tests/test_rollout.py."""

import pytest

from obsspec.rollout.gate import Gate, confidence_bin, expected_gain


def test_expected_gain_is_the_hidden_time_of_a_hit_minus_the_cost_of_a_miss():
    assert expected_gain(1.0, 0.5, 2.0, 0.125) == pytest.approx(0.5)      # a sure hit hides G
    assert expected_gain(1.0, 0.5, 0.1, 0.125) == pytest.approx(0.1)      # ... at most the tool's time left
    assert expected_gain(0.0, 0.5, 2.0, 0.125) == pytest.approx(-0.125)   # a sure miss costs its delay
    assert expected_gain(0.2, 0.5, 2.0, 0.0) > 0                          # free speculation always goes


def test_a_class_that_keeps_missing_is_gated_and_one_that_hits_is_not():
    gate = Gate(cost_share=0.25, prior_gen_s=0.5, prior_tool_s=1.0)
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
    gate = Gate(prior_tool_s=1.0)
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


def test_the_delay_of_a_speculative_generation_follows_the_engine_measurement():
    gate = Gate(cost_share=0.25, prior_gen_s=0.4)
    assert gate.delay_s() == pytest.approx(0.1)               # the prior: cost_share x G
    gate.observe_cost(delay_s=0.0, generations=40)            # preempted speculation: free
    assert gate.delay_s() < 0.01
    busy = Gate(cost_share=0.25, prior_gen_s=0.4)
    busy.observe_cost(delay_s=16.0, generations=40)           # each one delayed committed work by G
    assert busy.delay_s() > 0.35
    # the same draft goes on the first engine and not on the second
    for g in (gate, busy):
        for _ in range(6):
            g.observe_draft(g.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0), False)
        g.observe_draft(g.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0), True)
    assert gate.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0).go
    assert not busy.decide(source="world_model", cls="ls", confidence=None, elapsed_s=0).go
