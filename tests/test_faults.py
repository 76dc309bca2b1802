"""Fault injection in the rollout scheduler: cancellation at every await point of a turn, engine
failures mid-speculation, tool failures mid-draft, a sandbox killed mid-episode, bugs of ours.

Each case checks the scheduler's structured-concurrency invariants:
- every request ends (a `request_end`: committed, cancelled with a reason, or failed);
- no asyncio task is left behind, the tool is closed (and no sandbox process survives);
- the episode is classified right: only declared infrastructure failures become `infra_error`
  with reward None, an outer cancellation propagates, a bug of ours is raised with its traceback.
Fake tools and engines keep this fast; the sandbox cases use the real sandbox, on every backend.
"""

import asyncio
import dataclasses
import os

import pytest

from fakes import ByteTokenizer, PlainEngine, ScriptedPolicy
from obsspec import chat
from obsspec.engines.base import EngineClosedError, Generation, PromptTooLong
from obsspec.env import podman
from obsspec.env.sandbox import SandboxConfig, SandboxError
from obsspec.env.task import Task
from obsspec.rollout.events import EventBus
from obsspec.rollout.metrics import SpecMetrics
from obsspec.rollout.predictors import Base, Draft, WorldModelPredictor
from obsspec.rollout.scheduler import Sampling, Scheduler
from obsspec.rollout.tools import EmulatedLatency, SandboxTool, ToolResult
from obsspec.tokens import ChatFormat

SAMPLING = Sampling(max_turns=5, max_new_tokens=200, max_context=4000, seed=3)
TASK = Task("t-1", "fake", "do it", ["ls"], "true")
COMMANDS = ["ls", "pwd", "cat a"]


def body(command: str) -> str:
    return f"out of {command}\n\n(exit_code=0)"


class FakeTool:
    """Answers `body(command)` after `delay` seconds; `fail_at` turn raises `error` instead."""

    def __init__(self, delay=0.02, fail_at=None, error=None):
        self.delay, self.fail_at, self.error = delay, fail_at, error
        self.closed = 0
        self.timeouts = []

    async def start(self):
        pass

    async def run(self, command, turn, timeout=None):
        self.timeouts.append(timeout)
        await asyncio.sleep(self.delay)
        if turn == self.fail_at:
            raise self.error
        return ToolResult(body(command), 0, self.delay)

    async def reward(self):
        return 1.0

    async def close(self):
        self.closed += 1


class Predictor(Base):
    """Drafts [wrong, right] (breadth 2) after `delay`; raises `error` when given."""

    name = "fake"

    def __init__(self, delay=0.0, error=None, drafts=("wrong", "right")):
        self.delay, self.error, self.drafts = delay, error, drafts

    async def predict(self, request):
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        right = body(request.commands[-1])
        return [Draft(right if d == "right" else right + " ") for d in self.drafts]

    def learn(self, request, body):
        pass


class Events(list):
    def __call__(self, e):
        self.append(e)

    def check_accounting(self):
        started = [e.data["request_id"] for e in self if e.kind in ("spec_start", "wm_start")]
        ended = [e.data["request_id"] for e in self if e.kind == "request_end"]
        assert sorted(started) == sorted(ended), \
            f"every request must end exactly once: unended {set(started) - set(ended)}, extra {sorted(ended)}"
        for e in self:
            if e.kind == "request_end":
                assert e.data["outcome"] in ("committed", "cancelled", "failed")
                assert e.data["outcome"] != "cancelled" or e.data["reason"], "a cancellation without a reason"


class YieldingPolicy(ScriptedPolicy):
    """ScriptedPolicy's actions, yielding to the event loop after every token without a timer
    (a sleep of any length costs ~1 ms here): many await points, and fast."""

    async def generate(self, request):
        gen = await super().generate(request)
        for i in range(len(gen.token_ids)):
            if request.request_id in self.cancelled:
                return Generation(request.request_id, gen.token_ids[:i], gen.logprobs[:i], "cancelled")
            await asyncio.sleep(0)
        return gen


def scheduler(predictor=None, depth=1, token_delay=0.001, policy=None):
    tok = ByteTokenizer()
    fmt = ChatFormat(tok)
    bus, events = EventBus(), Events()
    bus.subscribe(events)
    if policy is None and token_delay == 0:
        policy = YieldingPolicy(tok, COMMANDS, token_delay=0, done_after=3)
    policy = policy or ScriptedPolicy(tok, COMMANDS, token_delay=token_delay, done_after=3)
    return Scheduler(policy, fmt, bus, SAMPLING, cap=512, predictor=predictor, depth=depth), events


def no_tasks_left():
    others = asyncio.all_tasks() - {asyncio.current_task()}
    assert not others, f"tasks left behind by the episode: {others}"


# ---------------------------------------------------------------------------------------------
# outer cancellation


FAST = dict(token_delay=0)  # the cancellation sweep runs ~100 episodes per depth


def events_of_a_full_episode(predictor, depth):
    sched, events = scheduler(predictor, depth, **FAST)
    asyncio.run(sched.run_episode(TASK, 0, FakeTool(delay=0.005), speculative=True))
    return len(events)


@pytest.mark.parametrize("depth", [1, 2])
def test_cancel_at_every_await_point_of_a_turn_propagates_and_cleans_up(depth):
    """Cancel after the k-th event, for every k of a full episode (and twice, the second time
    during the cleanup): the CancelledError reaches the caller, every request ends, nothing is
    left running, and the tool is closed once."""
    n = events_of_a_full_episode(Predictor(), depth)
    assert n > 20
    for k in range(1, n):
        for twice in (False, True):
            sched, events = scheduler(Predictor(), depth, **FAST)
            tool = FakeTool(delay=0.005)

            async def go():
                episode = asyncio.ensure_future(sched.run_episode(TASK, 0, tool, speculative=True))
                seen, fired = [], []

                def on_event(e):
                    seen.append(e)
                    if len(seen) == k or (twice and len(seen) == k + 1):
                        fired.append(e.kind)
                        asyncio.get_running_loop().call_soon(episode.cancel)

                sched.bus.subscribe(on_event)
                try:
                    await episode
                except asyncio.CancelledError:
                    pass
                await asyncio.sleep(0)
                no_tasks_left()
                # (timing varies the event count: a run may end before its k-th event)
                return episode.cancelled() or not fired or fired[0] == "episode_end"

            cancelled = asyncio.run(go())
            ended = events[-1].kind == "episode_end"
            assert ended, f"k={k}: the episode did not report its end"
            assert tool.closed == 1, f"k={k} twice={twice}: tool closed {tool.closed} times"
            assert cancelled, f"k={k}: the cancellation did not propagate"
            events.check_accounting()


def test_cancelling_a_batch_closes_every_episode():
    sched, events = scheduler(Predictor(delay=0.01))
    tools = []

    def make_tool(task, episode):
        tools.append(FakeTool(delay=0.2))
        return tools[-1]

    async def go():
        batch = asyncio.ensure_future(sched.run_batch([TASK] * 4, make_tool, speculative=True))
        await asyncio.sleep(0.1)
        batch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await batch
        no_tasks_left()

    asyncio.run(go())
    assert [t.closed for t in tools] == [1, 1, 1, 1]
    events.check_accounting()


# ---------------------------------------------------------------------------------------------
# failures


def test_engine_failure_of_the_world_model_is_no_draft_and_the_episode_goes_on():
    sched, events = scheduler(Predictor(error=EngineClosedError("gone")))
    traj = asyncio.run(sched.run_episode(TASK, 0, FakeTool(), speculative=True))
    assert traj.infra_error == "" and traj.reward == 1.0
    assert {e.data["outcome"] for e in events if e.kind == "request_end"} == {"failed"}
    events.check_accounting()


def test_a_world_model_adapter_unloaded_mid_rollout_is_a_miss_not_a_failed_episode():
    """Co-training on another process unloads the adapter version a draft was asked of: vLLM
    answers 404. That draft is a miss; before, it raised from the episode and the other ranks
    waited out the collective timeout."""
    from obsspec.engines.vllm import AdapterNotServed

    gone = AdapterNotServed(404, "the server does not serve 'wm-v3'; it serves ['Qwen/Qwen3-0.6B', 'wm-v4']")
    sched, events = scheduler(Predictor(error=gone))
    traj = asyncio.run(sched.run_episode(TASK, 0, FakeTool(), speculative=True))
    assert traj.infra_error == "" and traj.reward == 1.0
    ends = [e.data for e in events if e.kind == "request_end"]
    assert ends and all(d["outcome"] == "failed" and "wm-v3" in d["reason"] for d in ends)
    events.check_accounting()


def test_engine_failure_of_the_committed_speculation_is_an_infra_error():
    tok = ByteTokenizer()

    class FailingSpeculation(ScriptedPolicy):
        async def generate(self, request):
            if request.priority == 1:  # speculative
                await asyncio.sleep(0.01)
                raise EngineClosedError("engine closed mid-speculation")
            return await super().generate(request)

    policy = FailingSpeculation(tok, COMMANDS, token_delay=0.0005, done_after=3)
    sched, events = scheduler(Predictor(drafts=("right",)), policy=policy)
    tool = FakeTool(delay=0.05)
    traj = asyncio.run(sched.run_episode(TASK, 0, tool, speculative=True))
    assert traj.reward is None and traj.infra_error.startswith("EngineClosedError")
    assert tool.closed == 1
    events.check_accounting()


def test_tool_failure_while_the_world_model_runs_is_not_exec_won():
    sched, events = scheduler(Predictor(delay=1.0))
    tool = FakeTool(fail_at=1, error=SandboxError("sandbox died (output closed)"))
    traj = asyncio.run(sched.run_episode(TASK, 0, tool, speculative=True))
    assert traj.reward is None and "sandbox died" in traj.infra_error
    wm_ends = [e.data for e in events if e.kind == "request_end" and e.data["role"] == "wm"]
    assert wm_ends[-1]["reason"] == "tool_failed", f"the failed tool's draft ended as {wm_ends[-1]}"
    assert sum(e.kind == "exec_won" for e in events) == 1  # turn 0 only, where the tool did win
    events.check_accounting()


def test_tool_failure_mid_draft_cancels_the_speculative_actions():
    sched, events = scheduler(Predictor(delay=0.0), token_delay=0.01)
    tool = FakeTool(delay=0.05, fail_at=1, error=SandboxError("sandbox died"))
    traj = asyncio.run(sched.run_episode(TASK, 0, tool, speculative=True))
    assert traj.reward is None
    reasons = {e.data["reason"] for e in events if e.kind == "request_end" and e.data["role"] == "policy"}
    assert "tool_failed" in reasons
    events.check_accounting()


def test_one_failing_draft_request_cancels_its_siblings():
    tok = ByteTokenizer()
    fmt = ChatFormat(tok)

    class Engine(PlainEngine):
        def __init__(self):
            self.cancelled = 0

        async def generate(self, request):
            if request.temperature == 0.0:
                await asyncio.sleep(0.01)
                raise EngineClosedError("greedy draft failed")
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return Generation(request.request_id, (), (), "stop")

    engine = Engine()
    wm = WorldModelPredictor(engine, fmt, cap=512, max_tokens=16, breadth=3)
    sched, events = scheduler(wm)

    async def go():
        traj = await sched.run_episode(TASK, 0, FakeTool(delay=0.2), speculative=True)
        no_tasks_left()
        return traj

    traj = asyncio.run(go())
    assert traj.reward == 1.0 and engine.cancelled >= 2, "sibling draft requests kept running"
    events.check_accounting()


def test_a_world_model_prompt_past_its_positions_gets_no_draft_and_the_episode_goes_on():
    """A history that fills the policy's context, plus the observation opening, is longer than a
    world model with as many positions takes: its engine refused the prompt, the scheduler took
    that for a bug and the training run died."""

    class Engine(PlainEngine):
        calls = 0

        async def generate(self, request):
            Engine.calls += 1
            raise PromptTooLong(f"prompt of {len(request.prompt_ids)} tokens exceeds the model's positions")

    sched, events = scheduler(WorldModelPredictor(Engine(), ChatFormat(ByteTokenizer()), cap=512))
    traj = asyncio.run(sched.run_episode(TASK, 0, FakeTool(delay=0.05), speculative=True))
    assert traj.reward == 1.0 and traj.infra_error == "" and Engine.calls == 3
    events.check_accounting()
    # counted, and not as a draft that never closed
    metrics = SpecMetrics()
    for e in events:
        metrics(e)
    summary = metrics.summary()
    assert summary["spec/wm_prompt_too_long"] == 3 and summary["spec/wm_drafts_unusable"] == 0


def test_a_bug_of_ours_is_raised_not_excluded():
    sched, events = scheduler(Predictor(error=TypeError("a bug")))
    tool = FakeTool()
    with pytest.raises(TypeError, match="a bug"):
        asyncio.run(sched.run_episode(TASK, 0, tool, speculative=True))
    assert tool.closed == 1
    assert events[-1].kind == "episode_end" and events[-1].data["infra_error"].startswith("bug:")
    events.check_accounting()


def test_a_bug_in_one_episode_stops_the_batch_and_closes_every_tool():
    sched, events = scheduler(Predictor(delay=0.01))
    tools = []

    def make_tool(task, episode):
        tools.append(FakeTool(delay=0.05, fail_at=1 if episode == 2 else None, error=KeyError("bug")))
        return tools[-1]

    async def go():
        with pytest.raises(KeyError):
            await sched.run_batch([TASK] * 4, make_tool, speculative=True)
        no_tasks_left()

    asyncio.run(go())
    assert [t.closed for t in tools] == [1, 1, 1, 1]
    events.check_accounting()


# ---------------------------------------------------------------------------------------------
# limits the scheduler passes on


def test_task_max_turns_binds_when_tighter():
    sched, events = scheduler(Predictor())
    task = Task("t-2", "fake", "do it", ["ls"], "true", max_turns=2)
    policy_never_done = ScriptedPolicy(ByteTokenizer(), COMMANDS, done_after=99)
    sched.policy = policy_never_done
    for speculative in (False, True):
        traj = asyncio.run(sched.run_episode(task, 0, FakeTool(), speculative=speculative))
        assert len(traj.turns) == 2, f"turn limit min(sampling, task) = 2 not honoured: {len(traj.turns)}"
    assert max(r.prompt_ids.count(ord("\n")) for r in policy_never_done.requests) > 0
    turns = {e.turn for e in events if e.kind in ("policy_start", "spec_start")}
    assert max(turns) <= 1, "a generation was started for a turn past the task's limit"


def test_the_tool_calls_timeout_reaches_the_tool():
    tok = ByteTokenizer()

    class TimedPolicy(ScriptedPolicy):
        async def generate(self, request):
            self.requests.append(request)
            done = self.tok.decode(request.prompt_ids).count("<tool_response>") >= 1
            text = chat.render_done() if done else chat.render_bash("sleep 1", timeout=7)
            ids = tuple(self.tok.encode(text) + [self.im_end])
            return Generation(request.request_id, ids, (0.0,) * len(ids), "stop")

    sched, _ = scheduler(policy=TimedPolicy(tok, COMMANDS))
    tool = FakeTool()
    asyncio.run(sched.run_episode(TASK, 0, tool, speculative=False))
    assert tool.timeouts == [7], f"the tool call's timeout did not reach the tool: {tool.timeouts}"


# ---------------------------------------------------------------------------------------------
# the real sandbox, on every backend (tests/conftest.py: bubblewrap, and podman where installed)

SANDBOX = SandboxConfig(timeout_s=2, memory_mb=1024, max_procs=64)


@pytest.fixture
def sandbox_cfg(sandbox_backend):
    from conftest import backend_config

    return backend_config(SANDBOX, sandbox_backend)


def test_timeout_parameter_is_clamped_and_shown(sandbox_cfg):
    tool = SandboxTool(TASK, 0, sandbox_cfg, EmulatedLatency())

    async def go():
        await tool.start()
        try:
            return [await tool.run("sleep 5", 0, timeout=1), await tool.run("sleep 5", 1, timeout=600)]
        finally:
            await tool.close()

    short, clamped = asyncio.run(go())
    assert short.body == f"{chat.timeout_message(1)}\n(exit_code=-1)" and short.seconds < 1.8
    assert clamped.body == f"{chat.timeout_message(2)}\n(exit_code=-1)", "timeout not clamped to the recipe's"


def _episode_left(host_pid, container):
    """What of an episode still exists: its PID 1 on the host, and (podman) its container."""
    left = []
    if host_pid and os.path.exists(f"/proc/{host_pid}"):
        left.append(f"process {host_pid}")
    if container and podman.podman("container", "exists", container, timeout=60).returncode == 0:
        left.append(f"container {container}")
    return left


def test_sandbox_killed_mid_episode_is_an_infra_error_with_nothing_left(sandbox_cfg):
    sched, events = scheduler(Predictor(delay=0.05))
    tool = SandboxTool(TASK, 0, sandbox_cfg, EmulatedLatency())
    original = tool.run
    seen = []

    async def run_and_kill(command, turn, timeout=None):
        if turn == 1:
            seen.append((tool.sandbox.supervisor_pid, tool.sandbox.container))
            assert seen[0][0], "the sandbox's PID 1 is not known"
            asyncio.get_running_loop().call_later(0.05, os.kill, seen[0][0], 9)
            return await original("sleep 1", turn, timeout)
        return await original(command, turn, timeout)

    tool.run = run_and_kill

    async def go():
        traj = await sched.run_episode(TASK, 0, tool, speculative=True)
        no_tasks_left()
        return traj

    traj = asyncio.run(go())
    assert traj.reward is None and traj.infra_error.startswith("SandboxError"), traj.infra_error
    assert not _episode_left(*seen[0]), f"the killed sandbox left {_episode_left(*seen[0])}"
    events.check_accounting()


def test_cancelling_mid_command_kills_the_sandbox(sandbox_cfg):
    sched, events = scheduler(Predictor(delay=0.05))
    tool = SandboxTool(TASK, 0, sandbox_cfg, EmulatedLatency())
    seen = []
    original = tool.run

    async def slow(command, turn, timeout=None):
        seen.append((tool.sandbox.supervisor_pid, tool.sandbox.container))
        return await original("sleep 30", turn, timeout)

    tool.run = slow

    async def go():
        episode = asyncio.ensure_future(sched.run_episode(TASK, 0, tool, speculative=True))
        while not seen and not episode.done():  # (a container takes longer to start than bwrap)
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        episode.cancel()
        with pytest.raises(asyncio.CancelledError):
            await episode
        no_tasks_left()

    asyncio.run(go())
    assert seen, "the episode never ran a command before it was cancelled"
    assert not _episode_left(*seen[0]), f"a cancelled episode left {_episode_left(*seen[0])} running"
    events.check_accounting()
