"""The method's invariants (docs/ROLLOUT.md, "Invariant tests"), each checked against a real sandbox.

- Lossless: speculative and sequential rollouts give identical token ids, masks, logprobs and
  rewards — with an oracle (all hits), forced rollbacks, forced exec_won, breadth 2, depth 2 and 3.
- Seeds come from (episode, turn): the speculative request of turn t+1 equals the sequential one.
- No speculative side effects: only committed actions reach the sandbox.
- Accounting: every speculative request ends committed, cancelled (with a reason) or failed.
The policy is a scripted engine (tests/fakes.py) whose action depends on every context token.
"""

import asyncio
import shutil
from collections import Counter

import pytest

from fakes import ByteTokenizer, ScriptedPolicy
from obsspec.config import TasksConfig
from obsspec.env.sandbox import SandboxConfig
from obsspec.env.suite import generate_builtin
from obsspec.rollout.events import EventBus
from obsspec.rollout.gate import Gate
from obsspec.rollout.metrics import SpecMetrics
from obsspec.rollout.predictors import Base, Corrupting, Delayed, Draft, Oracle, WithHistory, derive_seed
from obsspec.rollout.scheduler import Sampling, Scheduler
from obsspec.rollout.tools import EmulatedLatency, SandboxTool
from obsspec.tokens import ChatFormat

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

COMMANDS = ["ls", "pwd", "touch spec-{h}; ls spec-* | wc -l", "echo {h} >> log.txt; tail -n 2 log.txt",
            "find . -type f | sort | head -n 5", "cat nope-{h}"]
SANDBOX = SandboxConfig(timeout_s=10, output_cap=512)
LATENCY = EmulatedLatency("fixed", 0.02)
# Slower than a scripted action (with margin for a loaded machine): speculation runs ahead.
SLOW_TOOL = EmulatedLatency("fixed", 0.6)
SAMPLING = Sampling(max_turns=6, max_new_tokens=400, max_context=6000, seed=11)


def tasks(n):
    return generate_builtin(TasksConfig(num_instances=n, families=("count-lines", "find-by-name")))[0]


class Recording:
    """Collects events; checks accounting."""

    def __init__(self):
        self.events = []

    def __call__(self, e):
        self.events.append(e)

    def kinds(self):
        return Counter(e.kind for e in self.events)


def run(task_list, speculative, predictor=None, group=1, executed=None, token_delay=0.0005, depth=1,
        latency=LATENCY, busy_limit=0, concurrency=0, sched_out=None, policy_wrap=None, gate=None,
        commands=COMMANDS):
    tok = ByteTokenizer()
    fmt = ChatFormat(tok)
    policy = ScriptedPolicy(tok, commands, token_delay=token_delay)
    bus = EventBus()
    rec = Recording()
    bus.subscribe(rec)
    if policy_wrap is not None:
        policy = policy_wrap(policy, bus)
    sched = Scheduler(policy, fmt, bus, SAMPLING, cap=SANDBOX.output_cap, predictor=predictor, depth=depth,
                      busy_limit=busy_limit, gate=gate)
    if sched_out is not None:
        sched_out.append(sched)
    episodes = [t for t in task_list for _ in range(group)]

    def make_tool(task, episode):
        tool = SandboxTool(task, episode, SANDBOX, latency)
        if executed is not None:
            original = tool.run

            async def run_and_record(command, turn, timeout=None):
                executed.append((episode, command))
                return await original(command, turn, timeout=timeout)

            tool.run = run_and_record
        return tool

    trajs = asyncio.run(sched.run_batch(episodes, make_tool, speculative, concurrency=concurrency))
    return trajs, rec, policy


def oracle_from(task_list, trajs, group=1):
    episodes = [t for t in task_list for _ in range(group)]
    return Oracle([(task.content_hash(), [t.command for t in tr.turns if t.kind == "bash"],
                    [t.observation for t in tr.turns if t.kind == "bash"])
                   for task, tr in zip(episodes, trajs)])


def assert_lossless(seq, spec):
    assert len(seq) == len(spec)
    for a, b in zip(seq, spec):
        assert not a.infra_error and not b.infra_error, (a.infra_error, b.infra_error)
        assert a.ids == b.ids, f"LOSSLESS violated: episode {a.episode} token ids differ"
        assert a.policy_mask == b.policy_mask and a.wm_mask == b.wm_mask, f"episode {a.episode}: masks differ"
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6), f"episode {a.episode}: logprobs differ"
        assert a.reward == b.reward, f"episode {a.episode}: rewards differ"


def assert_accounted(rec):
    started = Counter()
    ended = Counter()
    for e in rec.events:
        if e.kind == "wm_start":
            started[e.data["request_id"]] += 1
        if e.kind == "spec_start":
            started[e.data["request_id"]] += 1
        if e.kind == "request_end":
            ended[e.data["request_id"]] += 1
            assert e.data["outcome"] in ("committed", "cancelled", "failed")
            if e.data["outcome"] == "cancelled":
                assert e.data["reason"], "ACCOUNTING: a cancelled request has no reason"
    assert started == ended, "ACCOUNTING: some speculative request never ended (or ended twice)"


@pytest.fixture(scope="module")
def baseline():
    ts = tasks(10)
    seq, rec, _ = run(ts, speculative=False, group=5)  # 50 episodes, GRPO groups of 5
    return ts, seq


def test_fifty_episodes_lossless_with_oracle(baseline):
    ts, seq = baseline
    assert len(seq) == 50 and sum(len(t.turns) for t in seq) > 100
    spec, rec, _ = run(ts, speculative=True, predictor=oracle_from(ts, seq, 5), group=5)
    assert_lossless(seq, spec)
    kinds = rec.kinds()
    assert kinds["match"] > 50 and kinds["rollback"] == 0
    assert_accounted(rec)


def test_lossless_under_forced_rollbacks(baseline):
    ts, seq = baseline
    predictor = Corrupting(oracle_from(ts, seq, 5), every=2)
    spec, rec, _ = run(ts, speculative=True, predictor=predictor, group=5)
    assert_lossless(seq, spec)
    assert rec.kinds()["rollback"] > 20 and rec.kinds()["match"] > 20
    assert_accounted(rec)


def test_lossless_when_the_tool_always_wins(baseline):
    ts, seq = baseline
    spec, rec, _ = run(ts, speculative=True, predictor=Delayed(oracle_from(ts, seq, 5), 5.0), group=5)
    assert_lossless(seq, spec)
    assert rec.kinds()["exec_won"] > 50 and rec.kinds()["match"] == 0
    assert_accounted(rec)


class HoldFirst:
    """Holds episode 0's first generation until every other episode has ended: meanwhile it is
    a committed generation in flight (busy >= 1) for all of them, and afterwards episode 0 runs
    alone (busy 0). Busy and idle moments by construction, not by timing."""

    def __init__(self, policy, bus, others: int):
        self.policy, self.others, self.ended = policy, others, 0
        self.release = asyncio.Event()
        self.first_seed = derive_seed(SAMPLING.seed, "policy", 0, 0)
        bus.subscribe(self._count)

    def _count(self, e):
        if e.kind == "episode_end" and e.episode != 0:
            self.ended += 1
            if self.ended == self.others:
                self.release.set()

    async def generate(self, request):
        if request.seed == self.first_seed and request.priority == 0:
            await self.release.wait()
        return await self.policy.generate(request)

    def __getattr__(self, name):
        return getattr(self.policy, name)


def test_a_busy_engine_skips_speculation_and_stays_lossless(baseline):
    ts, seq = baseline
    scheds = []
    spec, rec, _ = run(ts[:1], speculative=True, predictor=oracle_from(ts[:1], seq[:5], 5), group=5,
                       busy_limit=1, sched_out=scheds, policy_wrap=lambda p, bus: HoldFirst(p, bus, 4))
    assert_lossless(seq[:5], spec)
    skipped = [e for e in rec.events if e.kind == "spec_skipped"]
    assert all(e.data["busy"] >= 1 for e in skipped)
    bash_turns = {(tr.episode, i) for tr in spec for i, t in enumerate(tr.turns) if t.kind == "bash"}
    assert {(e.episode, e.turn) for e in skipped} == {k for k in bash_turns if k[0] != 0}, \
        "every command issued while episode 0 was generating must be skipped, and no other"
    assert all(t.spec == "match" for i, t in enumerate(spec[0].turns) if (0, i) in bash_turns), \
        "episode 0 ran alone (busy 0): each of its commands should have been speculated on, and hit"
    summary = SpecMetrics()
    for e in rec.events:
        summary(e)
    s = summary.summary()
    assert s["spec/skipped_frac"] == len(skipped) / (len(skipped) + rec.kinds()["wm_start"])
    assert all(t.spec == "skipped" for tr in spec for i, t in enumerate(tr.turns)
               if (tr.episode, i) in {(e.episode, e.turn) for e in skipped})
    assert scheds[0].busy == 0, "the count of committed generations in flight leaked"
    assert_accounted(rec)


def test_one_episode_at_a_time_is_never_too_busy_to_speculate(baseline):
    few = baseline[0][:2]
    seq, _, _ = run(few, speculative=False, concurrency=1)
    spec, rec, _ = run(few, speculative=True, predictor=oracle_from(few, seq), busy_limit=1, concurrency=1)
    assert_lossless(seq, spec)
    assert rec.kinds()["spec_skipped"] == 0 and rec.kinds()["match"] > 0


class WrongThenRight(Base):
    """Breadth 2: a wrong draft first, the right one second."""

    name = "breadth2"

    def __init__(self, inner):
        self.inner = inner

    async def predict(self, request):
        right = await self.inner.predict(request)
        return [Draft("wrong\n(exit_code=0)")] + right

    def learn(self, request, body):
        pass


def test_lossless_with_breadth_two(baseline):
    ts, seq = baseline
    spec, rec, _ = run(ts, speculative=True, predictor=WrongThenRight(oracle_from(ts, seq, 5)), group=5)
    assert_lossless(seq, spec)
    reasons = Counter(e.data["reason"] for e in rec.events if e.kind == "request_end")
    assert reasons["other_draft"] > 20, reasons
    assert_accounted(rec)


def speculated_ahead(rec) -> int:
    """Turns k whose observation was predicted before turn k-1's tool had finished: only depth > 1
    does that (at depth 1 the prediction of turn k starts with turn k's committed command)."""
    done, ahead = set(), set()
    for e in rec.events:
        if e.kind == "exec_done":
            done.add((e.episode, e.turn))
        elif e.kind == "wm_start" and e.turn > 0 and (e.episode, e.turn - 1) not in done:
            ahead.add((e.episode, e.turn))
    return len(ahead)


def test_lossless_at_depth_two(baseline):
    ts, seq = baseline
    spec, rec, _ = run(ts, speculative=True, predictor=oracle_from(ts, seq, 5), group=5, depth=2,
                       latency=SLOW_TOOL)
    assert_lossless(seq, spec)
    kinds = rec.kinds()
    assert kinds["match"] > 50 and kinds["rollback"] == 0
    assert speculated_ahead(rec) >= 5, "depth 2 never speculated past the committed turn"
    assert_accounted(rec)


def test_depth_one_never_speculates_ahead(baseline):
    ts, seq = baseline
    _, rec, _ = run(ts[:2], speculative=True, predictor=oracle_from(ts[:2], seq[::5][:2]), latency=SLOW_TOOL)
    assert rec.kinds()["match"] > 0 and speculated_ahead(rec) == 0


def test_lossless_at_depth_three_with_rollbacks_and_two_drafts(baseline):
    ts, seq = baseline
    executed = []
    predictor = WrongThenRight(Corrupting(oracle_from(ts, seq, 5), every=3))
    spec, rec, _ = run(ts, speculative=True, predictor=predictor, group=5, depth=3, executed=executed,
                       latency=SLOW_TOOL)
    assert_lossless(seq, spec)
    kinds = rec.kinds()
    assert kinds["rollback"] > 10 and kinds["match"] > 10, kinds
    assert speculated_ahead(rec) >= 5
    reasons = Counter(e.data["reason"] for e in rec.events if e.kind == "request_end")
    assert reasons["other_draft"] > 10 and reasons["rollback"] > 10, reasons
    committed = [(tr.episode, t.command) for tr in spec for t in tr.turns if t.kind == "bash"]
    assert sorted(executed) == sorted(committed), "SIDE EFFECTS: a speculative action was executed"
    assert_accounted(rec)


def test_speculative_request_draws_the_sequential_seed(baseline):
    ts, seq = baseline
    _, _, seq_policy = run(ts[:2], speculative=False)
    _, _, spec_policy = run(ts[:2], speculative=True, predictor=oracle_from(ts[:2], seq[::5][:2]))
    key = lambda r: (tuple(r.prompt_ids), r.seed, r.max_new_tokens, r.temperature)
    seq_requests = {key(r) for r in seq_policy.requests}
    assert seq_requests <= {key(r) for r in spec_policy.requests}, \
        "SEEDS: a sequential request (prompt, seed) was never issued speculatively or otherwise"


def test_no_speculative_side_effects(baseline):
    ts, seq = baseline
    executed = []
    predictor = Corrupting(oracle_from(ts, seq, 5), every=1)  # every speculation is rolled back
    spec, rec, policy = run(ts, speculative=True, predictor=predictor, group=5, executed=executed)
    committed = [(tr.episode, t.command) for tr in spec for t in tr.turns if t.kind == "bash"]
    assert sorted(executed) == sorted(committed), "SIDE EFFECTS: an uncommitted action was executed"
    assert rec.kinds()["spec_start"] > 20  # speculative actions were generated (and discarded)
    assert_lossless(seq, spec)


def test_event_times_say_when_things_happened(baseline):
    """Timestamps are what the report's latency breakdown and the Perfetto timeline are built
    from: each must be when its thing happened, not merely in emission order."""
    ts, seq = baseline
    trajs, rec, _ = run(ts[:2], speculative=True, predictor=oracle_from(ts[:2], seq[::5][:2]), latency=SLOW_TOOL)
    by_episode: dict[int, list] = {}
    for e in rec.events:
        if e.episode >= 0:  # (-1: the batch's own, gate_state)
            by_episode.setdefault(e.episode, []).append(e)
    for ep, events in by_episode.items():
        assert events[0].kind == "episode_start" and events[-1].kind == "episode_end", ep
        starts = {e.turn: e for e in events if e.kind == "exec_start"}
        waits = [done.t - starts[done.turn].t for done in events if done.kind == "exec_done"]
        # the episode's latency (sandbox start and verification aside) holds every tool wait
        assert sum(waits) <= events[-1].data["latency_sec"] <= events[-1].t - events[0].t, ep
        for done in (e for e in events if e.kind == "exec_done"):
            waited = done.t - starts[done.turn].t
            assert waited >= SLOW_TOOL.median_s - 0.01, f"a tool answered before its latency: {waited}"
            assert done.data["seconds"] == pytest.approx(waited, abs=0.05)
            for verdict in (e for e in events if e.kind in ("match", "rollback") and e.turn == done.turn):
                assert verdict.t >= done.t, "a draft was judged before the real observation existed"
        begun = {e.data["request_id"]: e.t for e in events if e.kind == "policy_start"}
        for e in (e for e in events if e.kind == "policy_done"):
            assert e.t >= begun[e.data["request_id"]]
    assert rec.kinds()["match"] > 0, "the oracle's drafts should have matched"


class WrongWorldModel(Base):
    """A world model that always answers, always wrongly."""

    name = "world_model"

    async def predict(self, request):
        return [Draft("no such output\n(exit_code=0)", tokens=5)]

    def learn(self, request, body):
        pass


def test_cache_hits_cannot_hide_a_world_model_that_predicts_nothing(baseline):
    """Group members repeat each other's commands, so a history cache ahead of the world model
    hits; the world model's own hit rate stays apart, and here it is 0."""
    ts, seq = baseline
    # one episode at a time: each member finds what the earlier members of its group saw
    spec, rec, _ = run(ts[:4], speculative=True, predictor=WithHistory(WrongWorldModel()), group=5,
                       concurrency=1)
    assert_lossless(seq[:20], spec)
    m = SpecMetrics()
    for e in rec.events:
        m(e)
    s = m.summary()
    assert s["spec/hits_cache"] > 0 and s["spec/exact_frac_cache"] > 0.5, s
    assert s["spec/hits_wm"] == 0 and s["spec/exact_frac_wm"] == 0.0, \
        "the world model's own drafts never matched, yet its hit rate is not 0"
    assert s["spec/exact_frac"] == pytest.approx(s["spec/hits_cache"] / m.drafts_in_time)
    assert_accounted(rec)


def test_metrics_of_two_processes_merge_into_those_of_all_episodes(baseline):
    """With several training processes each rolls out its share; the step's metrics are merged
    from theirs (rank 0's alone hid the other ranks' infra failures)."""
    ts, seq = baseline
    _, rec, _ = run(ts[:4], speculative=True, predictor=oracle_from(ts, seq, group=5), group=2)
    whole, halves = SpecMetrics(), (SpecMetrics(), SpecMetrics())
    for e in rec.events:
        whole(e)
        halves[e.episode % 2](e)
    halves[0].merge(halves[1])
    assert halves[0].summary() == whole.summary()
    assert whole.summary()["episodes"] == 8 and whole.summary()["spec/exact_frac"]


# ---------------------------------------------------------------------------------------------
# The gate and sibling futures


class CostlySpeculation:
    """The scripted policy on an engine that accounts for its own delays, as the hf engine does:
    each speculative generation delays committed work by `delay_s` (a saturated engine)."""

    def __init__(self, policy, bus, delay_s: float = 0.05):
        self.policy, self.delay_s, self.speculative = policy, delay_s, 0

    async def generate(self, request):
        self.speculative += request.priority > 0
        return await self.policy.generate(request)

    def cancel(self, request_id):
        return self.policy.cancel(request_id)

    def promote(self, request_id):
        return self.policy.promote(request_id)

    def scheduling_stats(self):
        from obsspec.engines.base import SchedulingStats

        return SchedulingStats(committed_delay_sec=self.speculative * self.delay_s)


def test_the_gate_stops_speculating_on_drafts_that_never_match_and_changes_no_token(baseline):
    ts, seq = baseline
    few = ts[:6]
    seq_few, _, _ = run(few, speculative=False, latency=SLOW_TOOL)
    never = Corrupting(oracle_from(few, seq_few), every=1)
    spec, rec, _ = run(few, speculative=True, predictor=never, latency=SLOW_TOOL, concurrency=1,
                       gate=Gate(cost_share=0.25, prior_gen_s=0.05, prior_tool_s=0.6, explore=0.0),
                       policy_wrap=CostlySpeculation)
    assert_lossless(seq_few, spec)
    assert_accounted(rec)
    gates = [e.data for e in rec.events if e.kind == "gate"]
    verdicts = [e.data for e in rec.events if e.kind == "draft_verdict"]
    assert len(gates) >= 12 and not any(v["hit"] for v in verdicts)
    # once misses are known the expected gain is negative: the later half starts nothing
    assert not any(g["go"] for g in gates[len(gates) // 2:]), [(g["p"], g["go"]) for g in gates]
    assert rec.kinds()["spec_start"] < len(gates) // 2
    # every draft was still compared: the estimate learnt from all of them
    assert len(verdicts) == len(gates) and verdicts[-1]["p"] < 0.2


def test_the_gate_lets_drafts_that_match_start_their_actions(baseline):
    ts, seq = baseline
    few = ts[:4]
    seq_few, _, _ = run(few, speculative=False, latency=SLOW_TOOL)
    spec, rec, _ = run(few, speculative=True, predictor=oracle_from(few, seq_few), latency=SLOW_TOOL,
                       concurrency=1, gate=Gate(cost_share=0.25, prior_gen_s=0.05, prior_tool_s=0.6))
    assert_lossless(seq_few, spec)
    gates = [e.data for e in rec.events if e.kind == "gate"]
    assert gates and all(g["go"] for g in gates)
    assert rec.kinds()["match"] == len(gates)


class EpisodeLatency:
    """Episode 0's commands are fast, every other episode's slow (a sibling well ahead)."""

    def sample(self, episode, turn):
        return 0.02 if episode == 0 else 0.8


def test_siblings_running_the_same_command_take_the_first_result_as_their_draft(baseline):
    ts, _ = baseline
    one = ts[:1]
    seq, _, _ = run(one, speculative=False, group=3, latency=EpisodeLatency(), commands=["ls -la"])
    predictor = WithHistory(NoWorldModel())
    spec, rec, _ = run(one, speculative=True, predictor=predictor, group=3, latency=EpisodeLatency(),
                       commands=["ls -la"])
    assert_lossless(seq, spec)
    assert_accounted(rec)
    # turn 0: episodes 1 and 2 take episode 0's `ls`, which finishes first: as a sibling's result
    # when they asked while it ran, from the history cache when it had already finished (a loaded
    # machine starts the three sandboxes far enough apart for either)
    done = next(e.t for e in rec.events if e.kind == "exec_done" and e.episode == 0 and e.turn == 0)
    for k in (1, 2):
        asked = next(e.t for e in rec.events if e.kind == "wm_start" and e.episode == k and e.turn == 0)
        [match] = [e for e in rec.events if e.kind == "match" and e.episode == k and e.turn == 0]
        assert match.data["source"] == ("sibling" if asked < done else "history"), (k, asked, done, match.data)
    assert not [e for e in rec.events if e.kind == "rollback"]


def test_a_sibling_result_is_still_verified_against_the_episode_own_output(baseline):
    """A sibling's result is only a draft: one that differs from the episode's own output (here
    spoiled on purpose) is a rollback, never kept."""
    ts, _ = baseline
    one = ts[:1]
    seq, _, _ = run(one, speculative=False, group=3, latency=EpisodeLatency(), commands=["ls -la"])
    predictor = Corrupting(WithHistory(NoWorldModel()), every=1)
    spec, rec, _ = run(one, speculative=True, predictor=predictor, group=3, latency=EpisodeLatency(),
                       commands=["ls -la"])
    assert_lossless(seq, spec)
    assert rec.kinds()["rollback"] > 0 and rec.kinds()["match"] == 0


class NoWorldModel(Base):
    name = "none"

    async def predict(self, request):
        return []


def test_the_world_models_own_verdicts_are_counted_per_command_class():
    """spec/wm_class_hits: drafts of the world model compared with the real output, by command
    class; other sources' drafts (cache, sibling) are not the world model's hits."""
    from obsspec.rollout.events import Event

    m = SpecMetrics()
    for source, cls, hit in [("world_model", "ls", True), ("world_model", "ls", False), ("world_model", "cat", True),
                             ("history", "ls", True), ("sibling", "cat", True)]:
        m(Event("draft_verdict", 0.0, 0, 1, {"p": 0.5, "hit": hit, "source": source, "cls": cls}))
    assert m.summary()["spec/wm_class_hits"] == {"cat": [1, 1], "ls": [1, 2]}
