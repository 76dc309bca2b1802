"""Sandboxes on Ray workers (`sandbox.placement: ray`), on a cluster this machine runs for the
tests (tests/conftest.py: a head without CPUs and two worker nodes): rollouts token-identical to
local ones, a killed worker (an infrastructure failure; retried when configured; the other
episodes go on), a node that cannot start a sandbox (one line naming it), a sandbox larger than
any node, and a lost head (the run stops with one line). The reward-hack and fault suites run on
this path too (RAY_SUITES in conftest.py).
"""

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import RayCluster, backend_config, ray_missing, start_ray_cluster
from fakes import ByteTokenizer, ScriptedPolicy
from obsspec.env.episode import run_scripted
from obsspec.env.sandbox import SandboxConfig, SandboxUnavailable
from obsspec.env.suite import task_by_id
from obsspec.rollout.batch import run_episodes
from obsspec.rollout.predictors import Oracle
from obsspec.rollout.scheduler import Sampling
from obsspec.rollout.tools import EmulatedLatency, SandboxTool
from obsspec.tokens import ChatFormat

pytestmark = pytest.mark.skipif(bool(ray_missing()), reason=ray_missing() or "")

TASKS = [task_by_id(t) for t in ("json-edit-00004", "count-lines-00001", "dir-stats-00034", "fix-script-00002")]
COMMANDS = ["ls -la", "cat $(ls | head -n 1) | head -n 5", "wc -l * 2>&1 | tail -n 2", "echo $RANDOM; date; pwd"]
SAMPLING = Sampling(max_turns=6, max_new_tokens=300, max_context=60000, seed=5)
LOCAL = SandboxConfig(timeout_s=10)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def on_ray(**ray_keys) -> SandboxConfig:
    cfg = backend_config(LOCAL, "ray")
    return dataclasses.replace(cfg, ray=dataclasses.replace(cfg.ray, **ray_keys))


class KeptTool(SandboxTool):
    """Keeps where its sandbox ran (`where`) after the episode closed it."""

    where: dict = {}

    async def start(self):
        await super().start()
        self.where = getattr(self.sandbox, "where", {})


def rollout(config, *, speculative=False, predictor=None, latency=0.0, done_after=3, on_event=None, tools=None):
    tok = ByteTokenizer()
    policy = ScriptedPolicy(tok, COMMANDS, token_delay=0, done_after=done_after)

    def make_tool(task, episode):
        tool = KeptTool(task, episode, config, EmulatedLatency("fixed", latency) if latency else EmulatedLatency())
        if tools is not None:
            tools.setdefault(episode, []).append(tool)
        return tool

    async def go():
        return await asyncio.wait_for(run_episodes(
            policy, ChatFormat(tok), TASKS, make_tool, SAMPLING, cap=config.output_cap, speculative=speculative,
            predictor=predictor, listeners=[on_event] if on_event else ()), 240)  # (nothing may hang)

    return asyncio.run(go())


def same_tokens(a, b) -> list[str]:
    """What differs between two batches' trajectories (token ids, masks, logprobs, observations, rewards)."""
    out = []
    for x, y in zip(a.trajectories, b.trajectories):
        for field in ("ids", "policy_mask", "wm_mask", "logprobs", "reward"):
            if getattr(x, field) != getattr(y, field):
                out.append(f"episode {x.episode}: {field}")
        if [t.observation for t in x.turns] != [t.observation for t in y.turns]:
            out.append(f"episode {x.episode}: observations")
    return out


@pytest.fixture(scope="module")
def local_batch(ray_cluster):
    return rollout(LOCAL)


def test_rollouts_on_ray_are_token_identical_to_local_ones_and_report_the_hop(local_batch):
    assert not any(t.infra_error for t in local_batch.trajectories)
    assert {t.reward for t in local_batch.trajectories} - {None}, "no episode was scored"
    tools = {}
    on_ray_batch = rollout(on_ray(cpus=2), tools=tools)  # 2 CPUs each: the four fill both nodes
    assert same_tokens(local_batch, on_ray_batch) == [], "a rollout on Ray differs from the local one"
    nodes = {w["node_id"] for w in _wheres(tools)}
    assert len(nodes) == 2, f"the sandboxes did not spread over both worker nodes: {nodes}"
    summary = on_ray_batch.metrics.summary()
    assert summary["tool_hop_sec_mean"] and 0 < summary["tool_hop_sec_mean"] < summary["tool_sec_mean"]
    assert local_batch.metrics.summary()["tool_hop_sec_mean"] is None, "a local sandbox reported a hop"
    # speculation on Ray (every draft right: an oracle of the local run) changes no token either
    recorded = [(task.content_hash(), [t.command for t in tr.turns if t.kind == "bash"],
                 [t.observation for t in tr.turns if t.kind == "bash"])
                for task, tr in zip(TASKS, local_batch.trajectories)]
    speculative = rollout(on_ray(), speculative=True, predictor=Oracle(recorded))
    assert speculative.metrics.counts["match"] > 0
    assert same_tokens(local_batch, speculative) == []


def _wheres(tools) -> list[dict]:
    return [tool.where for ts in tools.values() for tool in ts if tool.where]


def kill_one_host(tools: dict, killed: list):
    """A listener that, once every episode has run a command, kills the Ray worker holding the
    sandboxes of one node (SIGKILL, as a crash or the OOM killer would)."""
    def listen(e):
        if e.kind == "exec_done" and not killed and sum(1 for ts in tools.values() if ts[-1].where) == 4:
            where = next(w for w in _wheres(tools))
            killed.append(where)
            os.kill(where["worker_pid"], signal.SIGKILL)
    return listen


def test_a_killed_worker_makes_its_episodes_infra_failures_and_the_others_go_on(local_batch):
    tools, killed = {}, []
    t0 = time.monotonic()
    batch = rollout(on_ray(cpus=2), latency=0.5, done_after=4, on_event=kill_one_host(tools, killed), tools=tools)
    assert killed, "no worker was killed"
    lost = [t for t in batch.trajectories if t.infra_error]
    assert lost and all(t.infra_error.startswith("SandboxLost: ") and t.reward is None for t in lost), \
        [t.infra_error for t in batch.trajectories]
    assert killed[0]["node_ip"] in lost[0].infra_error, "the error does not name the node"
    on_node = {ep for ep, ts in tools.items() if ts[0].where["node_id"] == killed[0]["node_id"]}
    assert {t.episode for t in lost} == on_node, "episodes on the other node were lost too"
    assert len(on_node) < 4 and all(t.reward is not None for t in batch.trajectories if t.episode not in on_node)
    assert batch.metrics.summary()["infra_failures"] == len(on_node)
    assert time.monotonic() - t0 < 120
    for where in _wheres(tools):  # nothing of the lost sandboxes is left running on the node
        assert not os.path.exists(f"/proc/{where['supervisor_pid']}"), f"sandbox {where} survived its worker"


def test_a_worker_that_died_while_idle_is_replaced_at_the_next_start(ray_cluster):
    from obsspec.env.ray_sandbox import RaySandbox

    async def where_each_node():  # (4 CPUs each: one sandbox on each worker node)
        sandboxes = [RaySandbox(on_ray(cpus=4)) for _ in range(2)]
        await asyncio.gather(*(sb.start() for sb in sandboxes))
        for sb in sandboxes:
            await sb.close()
        return [sb.where for sb in sandboxes]

    before = asyncio.run(where_each_node())
    assert len({w["node_id"] for w in before}) == 2
    for w in before:
        os.kill(w["worker_pid"], signal.SIGKILL)
    time.sleep(1)
    after = asyncio.run(where_each_node())  # (no SandboxLost: a new host on each node)
    assert {w["worker_pid"] for w in after}.isdisjoint(w["worker_pid"] for w in before)


def test_with_retries_the_lost_episodes_run_again_to_the_same_tokens(local_batch):
    tools, killed = {}, []
    batch = rollout(on_ray(cpus=2, retries=1), latency=0.5, on_event=kill_one_host(tools, killed), tools=tools)
    assert killed
    summary = batch.metrics.summary()
    assert summary["infra_retried"] >= 1 and summary["infra_failures"] == 0
    assert not any(t.infra_error for t in batch.trajectories)
    assert same_tokens(local_batch, batch) == [], "a retried episode differs from the local one"


def test_a_podman_sandbox_runs_on_a_worker_too(ray_cluster, podman_base):
    from obsspec.env.ray_sandbox import RaySandbox

    async def go():
        async with RaySandbox(dataclasses.replace(on_ray(), backend="podman")) as sb:
            await sb.start(files={"a.txt": "hi\n"})
            return sb.where, await sb.run("cat a.txt; grep -q Debian /etc/os-release && echo debian"), \
                await sb.verify("test -f a.txt")

    where, result, reward = asyncio.run(go())
    assert where["container"].startswith("obsspec-") and where["node_ip"] == "127.0.0.1", where
    assert result.output == b"hi\ndebian\n" and reward == 1.0


def _shell(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *sys.path[1:]])}
    return subprocess.run([sys.executable, "-m", "obsspec", "shell", "json-edit-00004", "--no-verify", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)


def ray_set(address: str, *keys: str) -> list[str]:
    out = []
    for k in ("sandbox.placement=ray", f"sandbox.ray.address={address}", *keys):
        out += ["--set", k]
    return out


def test_a_sandbox_larger_than_every_node_is_one_line(ray_cluster):
    with pytest.raises(SandboxUnavailable, match="no node of the Ray cluster can hold a sandbox of 64 CPUs"):
        asyncio.run(run_scripted(TASKS[0], ["true"], on_ray(cpus=64)))
    run = _shell("-c", "true", *ray_set(RayCluster.address, "sandbox.ray.cpus=64"))
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0, run.stderr[-2000:]
    assert "sandbox.ray.cpus" in run.stderr


def test_a_node_that_cannot_start_a_sandbox_is_one_line_naming_it(ray_cluster):
    """A node without bubblewrap (its PATH lacks it), the only one with room for 16 CPUs."""
    path = os.environ["PATH"]
    os.environ["PATH"] = "/usr/local/bin"
    try:
        node = RayCluster.cluster.add_node(num_cpus=16)
    finally:
        os.environ["PATH"] = path
    try:
        with pytest.raises(SandboxUnavailable) as err:
            asyncio.run(run_scripted(TASKS[0], ["true"], on_ray(cpus=16)))
        message = str(err.value)
        assert "\n" not in message and "bubblewrap (bwrap) is not installed" in message
        assert f"on Ray node 127.0.0.1 ({node.node_id[:8]})" in message, message
        run = _shell("-c", "true", *ray_set(RayCluster.address, "sandbox.ray.cpus=16"))
        assert run.returncode == 2 and run.stderr.strip().count("\n") == 0, run.stderr[-2000:]
        assert node.node_id[:8] in run.stderr and "bubblewrap" in run.stderr
    finally:
        RayCluster.cluster.remove_node(node)


def test_a_lost_head_stops_the_run_with_one_line(ray_cluster):
    """`obsspec shell` on a cluster of its own whose head (GCS) is killed mid-command."""
    cluster, _ = start_ray_cluster(workers=1)
    try:
        run = subprocess.Popen(
            [sys.executable, "-m", "obsspec", "shell", "json-edit-00004", "--no-verify", "-c", "sleep 97",
             *ray_set(cluster.address)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *sys.path[1:]])})
        deadline = time.monotonic() + 120
        while not _running("sleep 97") and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert run.poll() is None, run.communicate()[1][-2000:]
        cluster.head_node.kill_gcs_server()
        t0 = time.monotonic()
        _, err = run.communicate(timeout=120)
        assert run.returncode == 2, err[-3000:]
        assert time.monotonic() - t0 < 60, "the run took too long to notice its head was gone"
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: the Ray cluster's head at") and "--resume" in last, err[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
        cluster.shutdown()


def _running(argv: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().replace(b"\0", b" ").strip() == argv.encode():
                    return True
        except OSError:
            pass
    return False


def test_without_ray_in_the_environment_the_switch_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # (import ray then fails)
    with pytest.raises(SandboxUnavailable, match=r"needs Ray in this environment: pip install 'obsspec\[ray\]'"):
        asyncio.run(run_scripted(TASKS[0], ["true"], dataclasses.replace(LOCAL, placement="ray")))
