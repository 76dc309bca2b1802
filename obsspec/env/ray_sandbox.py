"""Sandboxes on the workers of a Ray cluster (`sandbox.placement: ray`).

    sandbox = RaySandbox(SandboxConfig(placement="ray"), workdir="/app")   # as `Sandbox(...)`
    await sandbox.start(files, setup); result = await sandbox.run("ls -la")
    reward = await sandbox.verify(script, files); await sandbox.close()

`start_sandbox` and `preflight` (obsspec/env/episode.py) pick this class when the recipe says
`sandbox.placement: ray`, so rollouts, training, evaluation, `obsspec shell` and task validation
all take this one path, whether the cluster is this machine or many; the scheduler, the engines
and the trainer stay in this process. Ray is the transport; there is no protocol of ours.

How: each sandbox first reserves the CPUs and memory its task asks for (else `sandbox.ray.cpus`
/ `memory_mb`) as a Ray placement group of one bundle, which Ray puts on a node with room, or
queues until one has. The sandbox itself, an ordinary `Sandbox` (bubblewrap, or Podman for an
image task), then starts in that node's `SandboxHost`: one Ray actor per node and driver, started
on first use, holding every sandbox of this run on that node (a process per sandbox would cost
each ~1 s of CPU to start and ~100 MB of memory). Closing the sandbox frees its reservation.

- Each command's result carries `hop_s`: its round trip here minus the sandbox's own time there.
- A host (the Ray worker) or its node lost mid-episode is `SandboxLost` (a `SandboxError`: the
  episode is an infrastructure failure, excluded, counted, and run again `sandbox.ray.retries`
  times); a call with no answer within its own limit plus `HOP_GRACE_S` counts as lost too.
- A sandbox that cannot start on its node is a one-line `SandboxUnavailable` naming the node.
- The head (GCS) is probed every `PROBE_S` seconds while sandboxes are open; after `PROBES`
  failed probes, or a failed call whose probe fails, every call raises `RayClusterLost` (not an
  infrastructure failure: the run stops, to be resumed from its last checkpoint).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
import uuid
import weakref

from obsspec.env import podman
from obsspec.env.sandbox import ExecResult, Sandbox, SandboxConfig, SandboxError, SandboxUnavailable
from obsspec.env.task import shipped

HOP_GRACE_S = 60.0   # a call's answer may come this much later than its own limit
PROBE_S = 2.0        # how often the head is probed while sandboxes are open
PROBES = 3           # failed probes in a row that mean the head is gone
START_LIMIT_S = 3600.0  # a sandbox may wait this long for a node with room (then: lost)
INSTALL_HINT = "pip install 'obsspec[ray]' (docs/PLACEMENT.md, \"Sandboxes on other machines\")"


class SandboxLost(SandboxError):
    """The Ray worker (or the node) that held the sandbox is gone: its episode cannot go on."""


class RayClusterLost(RuntimeError):
    """The Ray cluster's head stopped answering: no sandbox can be started or reached."""


# ---------------------------------------------------------------------------------------------
# The worker's side: one actor per node, holding that node's sandboxes


class SandboxHost:
    """What runs on a node's Ray worker: local `Sandbox`es by id, and where they are."""

    def __init__(self):
        import ray

        self.sandboxes: dict[str, Sandbox] = {}
        self.where = {"node_id": ray.get_runtime_context().get_node_id(), "worker_pid": os.getpid(),
                      "host": socket.gethostname()}

    async def start(self, sid: str, config: SandboxConfig, workdir: str, environment: podman.Environment | None,
                    files: dict[str, str], setup: str) -> dict:
        sandbox = self.sandboxes[sid] = Sandbox(config, workdir=workdir, environment=environment)
        try:
            await sandbox.start(files=files, setup=setup)
        except BaseException:
            await self.close(sid)
            raise
        return {**self.where, "supervisor_pid": sandbox.supervisor_pid, "container": sandbox.container}

    async def run(self, sid: str, command: str, timeout_s: float | None) -> ExecResult:
        return await self._get(sid).run(command, timeout_s=timeout_s)

    async def verify(self, sid: str, script: str, files: dict[str, str] | None, timeout_s: float | None,
                     reward_file: bool) -> float:
        return await self._get(sid).verify(script, files, timeout_s, reward_file=reward_file)

    async def close(self, sid: str) -> None:
        sandbox = self.sandboxes.pop(sid, None)
        if sandbox is not None:
            await sandbox.close()

    def _get(self, sid: str) -> Sandbox:
        if sid not in self.sandboxes:
            raise SandboxError("sandbox is not running on its node (closed, or never started)")
        return self.sandboxes[sid]


# ---------------------------------------------------------------------------------------------
# The cluster, as this process sees it


class _Cluster:
    """This process's connection: the head's address, the node list, each node's host."""

    head: tuple[str, int] | None = None
    nodes: tuple[float, list[dict]] = (0.0, [])
    hosts: dict = {}  # node id -> the SandboxHost actor this process started there


def _ray():
    try:
        import ray
    except ImportError:
        raise SandboxUnavailable(f"sandbox.placement=ray needs Ray in this environment: {INSTALL_HINT}") from None
    return ray


def connect(address: str):
    """Join the cluster `address` names (once per process: a process already in a cluster stays
    in it); the `ray` module."""
    ray = _ray()
    if not ray.is_initialized():
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, logging_level="WARNING", configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise SandboxUnavailable(f"cannot join the Ray cluster at {address} (sandbox.ray.address): "
                                     f"{_first_line(e)}; start it with `ray start --head`") from None
        _Cluster.head = None
    if _Cluster.head is None:  # (also when this process joined a cluster before, by itself)
        host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
        _Cluster.head, _Cluster.nodes, _Cluster.hosts = (host.strip("[]"), int(port)), (0.0, []), {}
    return ray


def _check_room(ray, cpus: float, memory_mb: int) -> None:
    """One line when no live node of the cluster could ever hold such a sandbox (Ray would
    otherwise keep it pending forever). The node list is read again after 30 s, or when it shows
    no room (a node may have joined since)."""
    def fits() -> bool:
        return any(n["Resources"].get("CPU", 0) >= cpus and n["Resources"].get("memory", 0) >= memory_mb << 20
                   for n in _Cluster.nodes[1])

    if time.monotonic() - _Cluster.nodes[0] > 30 or not fits():
        _Cluster.nodes = (time.monotonic(), [n for n in ray.nodes() if n.get("Alive")])
    if not fits():
        sizes = [(n["Resources"].get("CPU", 0), n["Resources"].get("memory", 0) / 2**20) for n in _Cluster.nodes[1]]
        have = ", ".join(f"{c:g} CPUs/{m:.0f} MiB" for c, m in sizes) or "no live node"
        raise SandboxUnavailable(f"no node of the Ray cluster can hold a sandbox of {cpus:g} CPUs and "
                                 f"{memory_mb} MiB (nodes: {have}): lower sandbox.ray.cpus or memory_mb "
                                 "(or the task's resources), or start a larger node")


def _node_ip(ray, node_id: str) -> str:
    """The address the cluster knows a node by (its raylet's)."""
    for fresh in (False, True):
        if fresh:
            _Cluster.nodes = (time.monotonic(), [n for n in ray.nodes() if n.get("Alive")])
        found = [n.get("NodeManagerAddress", "?") for n in _Cluster.nodes[1] if n.get("NodeID") == node_id]
        if found:
            return found[0]
    return "?"


def _host(ray, node_id: str):
    """This process's SandboxHost on `node_id`, started there on first use (it reserves nothing:
    each sandbox's placement group holds its share of the node)."""
    if node_id not in _Cluster.hosts:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        _Cluster.hosts[node_id] = ray.remote(SandboxHost).options(
            num_cpus=0, max_concurrency=1 << 16,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    return _Cluster.hosts[node_id]


async def head_answers(timeout: float = 5.0) -> bool:
    """Does the head's GCS port still take a connection?"""
    if _Cluster.head is None:
        return True
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(*_Cluster.head), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


class _Watch:
    """Probes the head while sandboxes of this event loop are open; `lost` is set once it is gone."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.lost = loop.create_future()
        self.users = 0
        self.task: asyncio.Task | None = None

    async def probe(self) -> None:
        failed = 0
        while True:
            await asyncio.sleep(PROBE_S)
            failed = 0 if await head_answers() else failed + 1
            if failed >= PROBES:
                self.declare()
                return

    def declare(self) -> None:
        if not self.lost.done():
            where = ":".join(map(str, _Cluster.head)) if _Cluster.head else "?"
            self.lost.set_exception(RayClusterLost(
                f"the Ray cluster's head at {where} stopped answering: the run stops here; restart the "
                "cluster and resume from the last checkpoint (obsspec train RECIPE --out RUN_DIR --resume)"))
            self.lost.exception()  # (retrieved: no "never retrieved" warning when nobody waits)


_watches: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watch]" = weakref.WeakKeyDictionary()


def _watch() -> _Watch:
    loop = asyncio.get_running_loop()
    if loop not in _watches:
        _watches[loop] = _Watch(loop)
    return _watches[loop]


# ---------------------------------------------------------------------------------------------
# The driver's side


class RaySandbox:
    """A `Sandbox` on a Ray worker: the same methods, results and errors, plus `where` (the
    node's IP and id, the host's PID, the sandbox's PID 1 and container there) once started."""

    def __init__(self, config: SandboxConfig, workdir: str = "/app",
                 environment: podman.Environment | None = None):
        self.config, self.workdir, self.environment = config, workdir, environment
        self.host_root = ""  # (nothing of an episode is kept on this machine)
        self.where: dict = {}
        self._sid = uuid.uuid4().hex
        self._host = None    # the node's SandboxHost, while the sandbox is open there
        self._group = None   # the placement group holding its CPUs and memory
        self._watch: _Watch | None = None

    @property
    def supervisor_pid(self) -> int:
        """Host PID (on its node) of the sandbox's PID 1; 0 before start."""
        return self.where.get("supervisor_pid", 0)

    @property
    def container(self) -> str:
        """Podman only: the episode's container name on its node."""
        return self.where.get("container", "")

    @property
    def node(self) -> str:
        return f"{self.where.get('node_ip', '?')} ({self.where.get('node_id', '?')[:8]})"

    async def start(self, files: dict[str, str] | None = None, setup: str = "") -> None:
        from ray.util.placement_group import placement_group, placement_group_table

        placement, env = self.config.ray, self.environment
        ray = connect(placement.address)
        cpus = (env.cpus if env and env.cpus else 0) or placement.cpus
        memory_mb = (env.memory_mb if env and env.memory_mb else 0) or placement.memory_mb
        watch = _watch()
        if watch.lost.done():  # (the head is gone: asking it for room would hang)
            raise watch.lost.exception()
        _check_room(ray, cpus, memory_mb)
        self._watch = watch
        watch.users += 1
        if watch.task is None:
            watch.task = asyncio.ensure_future(watch.probe())
        try:
            self._group = placement_group([{"CPU": cpus, **({"memory": memory_mb << 20} if memory_mb else {})}])
            await self._call(self._group.ready(), START_LIMIT_S)
            local = dataclasses.replace(self.config, placement="local")
            for attempt in (1, 2):
                node_id = placement_group_table(self._group)["bundles_to_node_id"][0]
                self.where = {"node_id": node_id, "node_ip": _node_ip(ray, node_id)}
                self._host = _host(ray, node_id)
                try:
                    # (a blob's path is on this machine: its bytes travel instead)
                    environment = self.environment and dataclasses.replace(
                        self.environment, files=shipped(self.environment.files))
                    there = await self._call(self._host.start.remote(
                        self._sid, local, self.workdir, environment, shipped(files or {}), setup), START_LIMIT_S)
                    break
                except SandboxLost:
                    if attempt == 2:  # (a host that died while idle is only found out now: once more)
                        raise
            self.where = {**there, **self.where}
        except BaseException:
            await self.close()
            raise

    async def run(self, command: str, timeout_s: float | None = None) -> ExecResult:
        self._running()
        limit = min(timeout_s, self.config.timeout_s) if timeout_s else self.config.timeout_s
        t0 = time.perf_counter()
        result = await self._call(self._host.run.remote(self._sid, command, timeout_s), limit)
        seconds = time.perf_counter() - t0
        return dataclasses.replace(result, seconds=seconds, hop_s=max(0.0, seconds - result.seconds))

    async def verify(self, script: str, files: dict[str, str] | None = None,
                     timeout_s: float | None = None, *, reward_file: bool = False) -> float:
        self._running()
        # (the reset before it may take RESET_TIMEOUT_S, the verifier up to max_verify_s)
        limit = 180.0 + self.config.max_verify_s
        return await self._call(self._host.verify.remote(self._sid, script, files and shipped(files), timeout_s,
                                                         reward_file), limit)

    async def close(self) -> None:
        """Close the sandbox there and free its reservation. Safe to call twice."""
        host, self._host = self._host, None
        group, self._group = self._group, None
        try:
            if host is not None and not (self._watch and self._watch.lost.done()):
                try:
                    await self._call(host.close.remote(self._sid), 60.0)
                except (SandboxError, RayClusterLost):
                    pass  # its host is gone, and the sandbox with it (--die-with-parent)
        finally:
            if group is not None and not (self._watch and self._watch.lost.done()):
                try:
                    _ray().util.remove_placement_group(group)
                except Exception:  # noqa: BLE001 (the cluster went meanwhile: so did the group)
                    pass
            await self._release()

    async def __aenter__(self) -> "RaySandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- calls ----------------------------------------------------------------------------------
    async def _call(self, ref, limit: float):
        """The result of a remote call, racing the head's watch; Ray's failures become ours, and
        the sandbox's own ones get its node's name."""
        ray = _ray()
        answer = asyncio.wrap_future(ref.future())
        try:
            done, _ = await asyncio.wait({answer, self._watch.lost}, timeout=limit + HOP_GRACE_S,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            answer.cancel()
            if self._host is not None:  # mid-request: out of step now, as a local sandbox would be
                await asyncio.shield(self.close())
            raise
        if answer not in done:
            answer.cancel()
            if self._watch.lost.done():
                raise self._watch.lost.exception()
            raise SandboxLost(f"no answer from the sandbox's Ray worker on node {self.node} in "
                              f"{limit + HOP_GRACE_S:.0f} s")
        try:
            return answer.result()
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, SandboxError):  # the sandbox's own failure, as it was named there
                raise type(cause)(f"on Ray node {self.node}: {cause}") from None
            raise
        except ray.exceptions.RayError as e:
            if not await head_answers():
                self._watch.declare()
                raise self._watch.lost.exception() from None
            if isinstance(e, ray.exceptions.RayActorError):
                _Cluster.hosts = {k: v for k, v in _Cluster.hosts.items() if v is not self._host}
                if e.actor_init_failed:
                    raise SandboxUnavailable(f"the Ray worker on node {self.node} could not host sandboxes: "
                                             f"{_last_line(e)} (every node needs obsspec and Ray: "
                                             f"{INSTALL_HINT})") from None
            raise SandboxLost(f"the Ray worker holding this sandbox on node {self.node} was lost: "
                              f"{_first_line(e)}") from None

    def _running(self) -> None:
        if self._host is None:
            raise SandboxError("sandbox is not running (call start() first)")

    async def _release(self) -> None:
        watch, self._watch = self._watch, None
        if watch is None:
            return
        watch.users -= 1
        if watch.users == 0 and watch.task is not None:
            task, watch.task = watch.task, None
            task.cancel()
            await asyncio.wait({task})


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _last_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[-1] if lines else type(e).__name__
