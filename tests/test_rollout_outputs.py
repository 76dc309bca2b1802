"""What rollouts produce besides trajectories: metrics, the Chrome trace, and offline replay."""

import asyncio
import json
import shutil

import pytest

from fakes import ByteTokenizer, PlainEngine, ScriptedPolicy
from obsspec.rollout.events import Event, EventBus, JsonlTrace
from obsspec.rollout.metrics import SpecMetrics, chrome_trace, export_chrome_trace, percentile
from obsspec.rollout.predictors import Corrupting, Delayed, Oracle
from obsspec.rollout.scheduler import Scheduler
from obsspec.rollout.tools import ReplayDiverged, ReplayTool
from obsspec.tokens import ChatFormat
from test_rollout import COMMANDS, SAMPLING, assert_lossless, oracle_from, run, tasks

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def ev(kind, t, episode=0, turn=0, **data):
    return Event(kind, t, episode, turn, data)


def test_metrics_from_a_known_event_sequence():
    m = SpecMetrics()
    stream = [
        ev("episode_start", 0.0, task_id="x"),
        ev("wm_start", 0.1, request_id="wm-0-0"), ev("exec_start", 0.1),
        ev("wm_draft", 0.2, request_id="wm-0-0", drafts=1, tokens=10),
        ev("spec_start", 0.2, turn=1, request_id="p1"),
        ev("policy_start", 0.2, turn=1, request_id="p1", speculative=True),
        ev("exec_done", 0.5, seconds=0.4, exit_code=0),
        ev("match", 0.5, request_id="p1", pending=True, draft_tokens=10),
        ev("policy_done", 0.7, turn=1, request_id="p1", tokens=5, speculative=True),
        ev("request_end", 0.7, turn=1, request_id="p1", role="policy", outcome="committed", reason="", tokens=5),
        ev("wm_start", 0.8, turn=1, request_id="wm-0-1"), ev("exec_start", 0.8, turn=1),
        ev("exec_done", 0.9, turn=1, seconds=0.1, exit_code=0),
        ev("exec_won", 0.9, turn=1, request_id="wm-0-1"),
        ev("wm_start", 1.0, turn=2, request_id="wm-0-2"),
        ev("wm_draft", 1.1, turn=2, request_id="wm-0-2", drafts=1, tokens=7, unusable=1),
        ev("spec_start", 1.1, turn=3, request_id="p3"),
        ev("rollback", 1.3, turn=2, drafts=1),
        ev("request_end", 1.3, turn=3, request_id="p3", role="policy", outcome="cancelled", reason="rollback", tokens=3),
        ev("episode_end", 2.0, reward=1.0, turns=3, latency_sec=2.0, infra_error=""),
    ]
    for e in stream:
        m(e)
    s = m.summary()
    assert s["spec/exact_frac"] == 0.5 and s["spec/rollback_frac"] == 0.5
    assert s["spec/exec_won_frac"] == pytest.approx(1 / 3)
    assert s["spec/policy_tokens_discarded"] == 3
    assert s["spec/wm_tokens_total"] == 17 and s["spec/wm_tokens_matched"] == 10
    assert s["spec/wm_drafts_unusable"] == 1
    assert s["spec/overlap_sec"] == pytest.approx(0.3) and s["spec/block_sec"] == pytest.approx(0.2)
    assert s["latency_p50_sec"] == 2.0 and s["reward_mean"] == 1.0


def test_a_world_model_whose_drafts_are_all_unusable_shows_a_zero_hit_rate():
    """Arrivals with nothing usable count as misses: the hit rate cannot hide a failing model."""
    m = SpecMetrics()
    for turn in range(4):
        m(ev("wm_start", turn, turn=turn, request_id=f"wm{turn}"))
        m(ev("exec_start", turn, turn=turn))
        m(ev("wm_draft", turn + 0.1, turn=turn, request_id=f"wm{turn}", drafts=0, tokens=3, unusable=1))
        m(ev("exec_done", turn + 0.5, turn=turn, seconds=0.5, exit_code=0))
    s = m.summary()
    assert s["spec/exact_frac"] == 0.0, "four drafts arrived, none usable: 0 %, never '-'"
    assert s["spec/unusable_frac"] == 1.0 and s["spec/rollback_frac"] == 0.0
    assert s["spec/wm_sec_mean"] == pytest.approx(0.1) and s["tool_sec_mean"] == pytest.approx(0.5)
    assert s["spec/wm_tool_ratio"] == pytest.approx(5.0)
    # A predictor with nothing to say (history cache miss) is no draft at all, not a miss.
    h = SpecMetrics()
    h(ev("wm_start", 0, request_id="wm0"))
    h(ev("wm_draft", 0.1, request_id="wm0", drafts=0, tokens=0, unusable=0))
    assert h.summary()["spec/exact_frac"] is None


class CannedEngine(PlainEngine):
    """An engine that answers the k-th request of a prediction with texts[k]."""

    def __init__(self, tok, texts):
        self.tok, self.texts, self.requests = tok, texts, []

    async def generate(self, request):
        from obsspec.engines.base import Generation

        self.requests.append(request)
        ids = self.tok.encode(self.texts[(len(self.requests) - 1) % len(self.texts)])
        return Generation(request.request_id, ids, [0.0] * len(ids), "stop")


def test_world_model_drafts_that_never_close_are_returned_unusable_and_counted():
    from obsspec.rollout.predictors import PredictRequest, WorldModelPredictor

    tok = ByteTokenizer()
    fmt = ChatFormat(tok)
    engine = CannedEngine(tok, ["hi\n(exit_code=0)\n</tool_response>", "</tool_response>", "unfinished"])
    wm = WorldModelPredictor(engine, fmt, cap=512, max_tokens=64, breadth=3)
    request = PredictRequest("k", "t", 0, 0, ("ls",), (1, 2, 3))
    drafts = asyncio.run(wm.predict(request))
    assert [d.body for d in drafts] == ["hi\n(exit_code=0)", None, None]
    assert [r.temperature for r in engine.requests] == [0.0, 0.7, 0.7]
    assert len({r.seed for r in engine.requests}) == 3
    sched = Scheduler(ScriptedPolicy(tok, COMMANDS), fmt, EventBus(), SAMPLING, cap=512, predictor=wm)
    metrics = SpecMetrics()
    sched.bus.subscribe(metrics)

    async def branch():
        specs = await sched._branch([1, 2, 3], request, depth=1)
        for spec in specs:
            await sched._cancel(spec, "test")
        return specs

    specs = asyncio.run(branch())
    assert len(specs) == 1 and specs[0].draft.body == "hi\n(exit_code=0)"
    s = metrics.summary()
    assert s["spec/wm_drafts_unusable"] == 2
    assert s["spec/wm_tokens_total"] == sum(len(tok.encode(t)) for t in engine.texts)


def test_percentile():
    assert percentile([1, 2, 3, 4], 0.5) == 2.5 and percentile([], 0.5) is None
    assert percentile([5], 0.95) == 5


@needs_bwrap
def test_trace_jsonl_and_chrome_export(tmp_path):
    ts = tasks(2)
    seq, _, _ = run(ts, speculative=False)
    bus_events = []
    _, rec, _ = run(ts, speculative=True, predictor=Corrupting(oracle_from(ts, seq), every=2))
    path = tmp_path / "trace.jsonl"
    trace = JsonlTrace(str(path), "speculative")
    for e in rec.events:
        trace(e)
    trace.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == len(rec.events) and all("t" in r and "kind" in r for r in rows)
    n = export_chrome_trace(str(path), str(tmp_path / "trace.json"))
    chrome = json.loads((tmp_path / "trace.json").read_text())
    spans = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    names = {e["name"] for e in spans}
    assert {"policy", "tool", "world model", "speculative policy"} <= names, names
    assert n == len(chrome["traceEvents"]) and all(e["dur"] >= 0 for e in spans)
    assert any(e["name"] in ("match", "rollback") for e in chrome["traceEvents"] if e["ph"] == "i")


@needs_bwrap
def test_replay_reproduces_the_recorded_episodes_without_tools():
    ts = tasks(3)
    seq, _, _ = run(ts, speculative=False)
    tok = ByteTokenizer()
    fmt = ChatFormat(tok)
    recorded = [tr.to_dict() for tr in seq]

    async def replay(predictor):
        sched = Scheduler(ScriptedPolicy(tok, COMMANDS), fmt, EventBus(), SAMPLING, cap=512, predictor=predictor)
        return await sched.run_batch(ts, lambda task, e: ReplayTool(recorded[e]["turns"], recorded[e]["reward"]),
                                     speculative=predictor is not None)

    assert_lossless(seq, asyncio.run(replay(None)))
    assert_lossless(seq, asyncio.run(replay(oracle_from(ts, seq))))


def test_replay_refuses_a_diverging_command():
    tool = ReplayTool([{"kind": "bash", "command": "ls", "observation": "a\n\n(exit_code=0)",
                        "exit_code": 0, "tool_sec": 0.0}], 1.0)
    assert asyncio.run(tool.run("ls", 0)).body == "a\n\n(exit_code=0)"
    with pytest.raises(ReplayDiverged):
        asyncio.run(tool.run("pwd", 0))


def test_compare_classifies_differences_and_times_identical_episodes_only():
    from obsspec.rollout_run import compare
    from obsspec.rollout.trajectory import Trajectory

    def traj(ep, ids, mask, latency):
        return Trajectory(ep, "t", 1, ids, mask, [0] * len(ids), [0.0] * len(ids), [], 1.0, "", latency)

    seq = [traj(0, [1, 2, 3], [0, 1, 0], 10.0), traj(1, [1, 2, 3], [0, 1, 0], 10.0), traj(2, [1, 2, 3], [0, 1, 0], 10.0)]
    spec = [traj(0, [1, 2, 3], [0, 1, 0], 8.0), traj(1, [1, 2, 9], [0, 1, 0], 1.0), traj(2, [1, 7, 3], [0, 1, 0], 1.0)]
    c = compare(seq, spec)
    assert not c["token_identical"] and c["differing_first_in_observation"] == [1]
    assert c["differing_first_in_action"] == [2] and c["episodes_compared_for_latency"] == 1
    assert c["mean_latency_reduction"] == pytest.approx(0.2)


@pytest.mark.parametrize("speculative", [True, False])
def test_the_plain_live_display_shows_speculation_only_when_there_is_some(speculative, capsys):
    from obsspec.ui.live import PlainLive

    m = SpecMetrics()
    for e in (ev("episode_start", 0.0, task_id="x"), ev("episode_end", 1.0, reward=1.0, latency_sec=1.0)):
        m(e)
    live = PlainLive("val", every_s=60)
    live.start(m, 1, speculative=speculative)
    live.stop()
    line = capsys.readouterr().err
    assert line.startswith("val: 1/1 episodes")
    assert ("hit rate" in line and "spec overlap" in line) == speculative


# ---------------------------------------------------------------------------------------------
# The headline of `rollout --mode both`: alternating pairs, an interval, a verdict


def test_pairs_alternate_which_mode_runs_first():
    from obsspec.rollout_run import passes

    assert passes("both", 3) == ["sequential", "speculative", "speculative", "sequential",
                                 "sequential", "speculative"]
    assert passes("speculative", 3) == ["speculative"]


def test_the_verdict_says_not_resolvable_when_the_interval_includes_zero():
    from obsspec.rollout.metrics import mean_interval, verdict

    noisy = mean_interval([0.145, -0.033, 0.006])   # three runs of one rollout on 2 shared cores
    assert noisy["ci95"] > abs(noisy["mean"]) and verdict(noisy) == "not resolvable here"
    assert verdict(mean_interval([0.10, 0.11, 0.09])) == "gain"
    assert verdict(mean_interval([-0.05, -0.06, -0.04])) == "loss"
    assert verdict(mean_interval([0.2]))[:8] == "one pair"


def test_compare_pairs_reduces_each_pair_and_checks_every_pass_for_identity():
    from obsspec.rollout.trajectory import Trajectory
    from obsspec.rollout_run import compare_pairs

    def traj(episode, latency, ids=(1, 2, 3)):
        t = Trajectory.start(episode, "t", list(ids[:1]))
        t.append_action(list(ids[1:]), [0.0] * (len(ids) - 1))
        t.latency_sec, t.reward = latency, 1.0
        return t

    runs = [("sequential", [traj(0, 2.0)]), ("speculative", [traj(0, 1.0)]),
            ("speculative", [traj(0, 1.5)]), ("sequential", [traj(0, 2.0)])]
    comp = compare_pairs(runs)
    assert comp["pairs"] == 2 and comp["reduction_per_pair"] == [0.5, 0.25]
    assert comp["mean_latency_reduction"] == pytest.approx(0.375) and comp["token_identical"]
    # a later pass that differs in a token is caught, though the first pair was identical
    runs[2] = ("speculative", [traj(0, 1.5, ids=(1, 2, 4))])
    assert not compare_pairs(runs)["token_identical"]
