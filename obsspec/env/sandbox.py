"""Bubblewrap sandboxes: one private, deterministic terminal per episode.

    sandbox = Sandbox(SandboxConfig(), workdir="/app")
    await sandbox.start(files={"notes.txt": "hi\\n"}, setup="mkdir -p data")
    result = await sandbox.run("cd data && ls -la")      # ExecResult: output bytes + exit code
    reward = await sandbox.verify(task.verify, task.verify_files,
                                  reward_file=task.reward_file)
    await sandbox.close()                                  # kills everything, frees everything

What an episode gets (docs/ENVIRONMENT.md):
- a private workspace at `workdir` (a size-limited tmpfs: the quota on all the agent writes
  there), read-only /usr, /etc and /; its own /tmp, HOME, hostname, user (`agent`, uid 1000),
  PID, IPC, UTS and network namespaces (no network); nothing of the host's temp dirs, home or
  project, nor other episodes (how: obsspec/env/bwrap.py);
- a persistent shell: cwd, variables, functions, aliases and options carry over between commands
  (scripts/runner.sh), while each command runs in its own process tree, which is killed when the
  command ends: background jobs do not outlive their command;
- limits: a per-command timeout (the tool call's `timeout`, clamped to `timeout_s`), an output
  cap, address-space, file-size and process-count limits, and tmpfs sizes for every writable dir;
- determinism: fixed TZ, locale, hostname, user, HOME and umask; files the setup creates get one
  fixed time; libfaketime pins the wall clock to a logical clock (`clock_start` + turn *
  `turn_seconds`), and files a command changed are re-stamped to that logical time afterwards;
  stderr is line-buffered (libstdbuf) and the episode is pinned to one CPU;
- a verifier the agent cannot touch: before it runs, every agent process is killed (and checked
  gone), /tests, /logs and the harness's state are emptied, the verifier runs with an empty HOME
  and a Python that ignores cwd and the agent's site-packages, and the reward is read by PID 1.

When the harness runs as root, the sandbox runs as `nobody` on the host, so that process limits
apply (the kernel exempts root from RLIMIT_NPROC) and nothing inside has host privileges.

Tasks with Harbor semantics (obsspec/env/semantics.py) run in a container whose PID 1 is
scripts/supervisor_harbor.sh: the same protocol, other guarantees (services live on, root in the
container, one HOME and the real clock; docs/ENVIRONMENT.md, "Harbor semantics").
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import secrets
import shutil
import signal
import tempfile
import time
import warnings
from dataclasses import dataclass

from obsspec.env import bwrap, images, podman
from obsspec.env.placement import PLACEMENTS, RayPlacement
from obsspec.fields import doc, to_dict
from obsspec.chat import capture_bytes_for
from obsspec.env.semantics import HARBOR
from obsspec.env.task import check_workdir


# The least a recipe may set: what the harness needs in every sandbox, with a margin (the
# built-in verifiers passed at 48 MB and 4 processes here; at 8 MB none could start).
MIN_MEMORY_MB = 128
MIN_PROCS = 16
MIN_TIMEOUT_S = 0.1
MAX_CLOCK = 4_102_444_800       # 2100-01-01
MAX_TURN_SECONDS = 86_400 * 366  # a year a turn

TAMPERED = 4  # the supervisor's `reset` status when the agent left what cannot be undone
# The kill loop (up to ~10 s) and the janitor, whose work is bounded by a count of entries (its
# CPU need is a few seconds at most here), waiting their turn among every other episode on the
# machine: 16 episodes spinning on 2 cores is an 8x slowdown, and this leaves 10x on top.
RESET_TIMEOUT_S = 120.0


class SandboxError(RuntimeError):
    """The sandbox itself failed (an infrastructure failure, never the agent's fault)."""


class SandboxUnavailable(SandboxError):
    """bubblewrap is not installed (or cannot create namespaces) on this machine."""


@dataclass(frozen=True)
class SandboxConfig:
    """How episodes are isolated and limited. Every field is a recipe key under `sandbox:`."""

    isolation: str = doc("bwrap", "'bwrap' (default) or 'none': run commands UNSANDBOXED on "
                                   "this host (explicit opt-in only; warns).")
    backend: str = doc("bwrap", "What isolates tasks that name no image: 'bwrap' (bubblewrap, "
                                 "the host's /usr) or 'podman' (a container of the local Debian 12 "
                                 "base image). Tasks with an image (a Harbor Dockerfile), or "
                                 "with Harbor semantics, always run in podman.")
    timeout_s: float = doc(30.0, "Per-command timeout, seconds (the upper bound of the tool "
                                  "call's `timeout`); the command and everything it started are "
                                  "killed, the shell state survives.")
    max_verify_s: float = doc(600.0, "Longest a verifier may run, seconds: a task's own limit "
                                      "(Harbor's `timeout_sec`) is clamped to it; without one, "
                                      "4 x timeout_s.")
    output_cap: int = doc(4096, "Characters of output an observation keeps; the rest is cut "
                                 "with a marker.")
    memory_mb: int = doc(4096, "Address-space limit per process (ulimit -v), MiB.")
    max_procs: int = doc(256, "Process limit for the whole episode (RLIMIT_NPROC in its own "
                               "user namespace).")
    max_file_mb: int = doc(1024, "Largest file a command may write (ulimit -f), MiB.")
    workspace_mb: int = doc(1024, "Size of the workspace (a tmpfs): the quota on everything the "
                                   "agent keeps there, MiB.")
    tmp_mb: int = doc(512, "Size of the episode's /tmp (a tmpfs), MiB.")
    home_mb: int = doc(64, "Size of the agent's HOME and of /tests (tmpfs each), MiB.")
    deterministic: bool = doc(True, "Pin clock, file times, hostname, user, locale, stderr "
                                     "buffering and CPU.")
    clock_start: int = doc(1_704_067_200, "Logical clock at episode start, epoch seconds "
                                           "(2024-01-01T00:00:00Z).")
    turn_seconds: int = doc(60, "How far the logical clock moves per command, seconds.")
    hostname: str = doc("sandbox", "Hostname inside the sandbox.")
    harbor_services: str = doc("auto", "Harbor semantics: do the agent's processes run beside the "
                                       "verifier? 'auto' (when the task's tests talk to a service, "
                                       "or its image starts one: semantics.needs_services), 'live' "
                                       "(always, as in Harbor) or 'stopped' (never: stopped from the "
                                       "janitor's sweep to the episode's end).")
    workspace_root: str = doc("", "Host directory for workspaces with isolation=none only "
                                   "('' = the system temp dir).")
    placement: str = doc("local", "Where sandboxes run: 'local' (this machine) or 'ray' (workers of the "
                                  "Ray cluster sandbox.ray names, each with the CPUs and memory its task "
                                  "asks for; docs/PLACEMENT.md, \"Sandboxes on other machines\").")
    ray: RayPlacement = doc(RayPlacement(), "With placement=ray: the cluster, each sandbox's reservation "
                                            "and the retries of episodes whose worker was lost.")

    def __post_init__(self) -> None:
        if self.isolation not in ("bwrap", "none"):
            raise ValueError(f"sandbox.isolation must be 'bwrap' or 'none', not {self.isolation!r}")
        if self.backend not in ("bwrap", "podman"):
            raise ValueError(f"sandbox.backend must be 'bwrap' or 'podman', not {self.backend!r}")
        if self.harbor_services not in ("auto", "live", "stopped"):
            raise ValueError(f"sandbox.harbor_services must be auto, live or stopped, not {self.harbor_services!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"sandbox.placement must be 'local' or 'ray', not {self.placement!r}")
        if self.placement == "ray" and self.isolation == "none":
            raise ValueError("sandbox.isolation=none runs commands on this host: it cannot go with "
                             "sandbox.placement=ray (set one or the other)")
        if self.backend == "podman" and self.isolation == "none":
            raise ValueError("sandbox.backend=podman runs containers: it cannot go with "
                             "sandbox.isolation=none (set one or the other)")
        for name in ("timeout_s", "max_verify_s", "output_cap", "memory_mb", "max_procs", "max_file_mb",
                     "workspace_mb", "tmp_mb", "home_mb"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"sandbox.{name} must be a positive number, not {value!r}")
        # What the harness itself needs inside every sandbox (its janitor and the verifiers are
        # Python; a verifier forks a few processes): below these, no episode can be verified.
        for name, least, why in (
                ("memory_mb", MIN_MEMORY_MB, "the harness's own Python must start in every sandbox"),
                ("max_procs", MIN_PROCS, "the harness and a verifier run a few processes at once"),
                ("timeout_s", MIN_TIMEOUT_S, "no command can start and answer faster"),
                ("max_verify_s", MIN_TIMEOUT_S, "no verifier can start and answer faster")):
            if getattr(self, name) < least:
                raise ValueError(f"sandbox.{name} must be at least {least} ({why}), not {getattr(self, name)!r}")
        for name, most in (("clock_start", MAX_CLOCK), ("turn_seconds", MAX_TURN_SECONDS)):
            if not 0 <= getattr(self, name) <= most:
                raise ValueError(f"sandbox.{name} must be in 0..{most} (the pinned clock must stay a "
                                 f"date every tool can print), not {getattr(self, name)!r}")
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})", self.hostname):
            raise ValueError(f"sandbox.hostname must be a host name (letters, digits, '-'), got {self.hostname!r}")


@dataclass(frozen=True)
class ExecResult:
    output: bytes
    """The first `capture_bytes` bytes of stdout+stderr, interleaved as a terminal shows them."""
    total_bytes: int
    """How many bytes the command printed in all (output is a prefix of them)."""
    exit_code: int
    """The shell's exit status; -1 when the command timed out."""
    timed_out: bool
    seconds: float
    """Wall-clock time of the command, as the agent waited for it."""
    timeout_s: float = 0.0
    """The time limit it ran under."""
    hop_s: float = 0.0
    """Of `seconds`, what reaching a sandbox on another machine added (0 for a local one)."""


def output_settings(config: SandboxConfig) -> dict:
    """The settings that decide what a sandbox prints (where it runs does not): for cache keys."""
    return {k: v for k, v in to_dict(config).items() if k not in ("placement", "ray")}


def check_bwrap() -> str:
    """Path of bwrap, or a SandboxUnavailable that says how to install it."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: run `sudo apt-get install bubblewrap` "
            "(or `make install`), or set sandbox.isolation=none to run commands unsandboxed"
        )
    return path


# ---------------------------------------------------------------------------------------------


class Sandbox:
    """One episode's sandbox. Use `start()` once, `run()` per command, `close()` at the end."""

    def __init__(self, config: SandboxConfig, workdir: str = "/app",
                 environment: podman.Environment | None = None):
        """`environment`: the task's container image and resources (it then runs in podman)."""
        check_workdir(workdir)
        self.config = config
        self.workdir = workdir
        self.environment = environment
        self.container = ""  # podman only: the episode's container name
        self.turn = 0
        self.host_root = ""  # isolation=none only: host dir holding workspace/, tests/, logs/
        self._proc: asyncio.subprocess.Process | None = None
        self._supervisor_pid = 0
        self._uid: bwrap.HostUid | None = None
        self._lock = asyncio.Lock()

    @property
    def supervisor_pid(self) -> int:
        """Host PID of the sandbox's PID 1 (0 before start, or when not known)."""
        return self._supervisor_pid

    # -- life cycle -------------------------------------------------------------------------------
    async def start(self, files: dict[str, str] | None = None, setup: str = "") -> None:
        """Start the shell, write `files` into the workspace and run `setup` there."""
        cfg = self.config
        harbor = self.environment is not None and self.environment.semantics == HARBOR
        if cfg.deterministic and not harbor and not bwrap.faketime_lib():
            # (without it the pinned clock would silently be the real one)
            raise SandboxUnavailable("sandbox.deterministic needs libfaketime: run `sudo apt-get install "
                                     "faketime` (or `make install`), or set sandbox.deterministic=false")
        archive = bwrap.tar_files(files or {}, cfg.clock_start)  # checks paths before anything starts
        env = bwrap.env(cfg, self.workdir)
        fds: list[int] = []
        in_podman = self.environment is not None or cfg.backend == "podman"
        if in_podman and cfg.isolation == "none":
            raise ValueError("this task needs a container image: it cannot run with sandbox.isolation=none")
        if in_podman:
            argv = await asyncio.to_thread(self._podman_argv, env)
            cwd, env = "/", podman.env()  # (the supervisor's environment is in argv)
        elif cfg.isolation == "bwrap":
            path = check_bwrap()
            if os.geteuid() == 0:
                try:
                    self._uid = bwrap.HostUid()
                except OSError as e:
                    raise SandboxUnavailable(f"cannot give the sandbox a host uid of its own: {e}") from None
            argv, fds = bwrap.argv(cfg, self.workdir, path, self._uid and self._uid.uid)
            cwd = "/"
        else:
            warnings.warn("sandbox.isolation=none: agent commands run UNSANDBOXED on this host")
            root = cfg.workspace_root or None
            if root:
                os.makedirs(root, exist_ok=True)
            self.host_root = tempfile.mkdtemp(prefix="obsspec-ep-", dir=root)
            for sub in ("workspace", "tests", "logs", "state", "home"):
                os.makedirs(os.path.join(self.host_root, sub))
            dirs = {k: os.path.join(self.host_root, v) for k, v in
                    (("WORKDIR", "workspace"), ("STATE_DIR", "state"), ("TESTS_DIR", "tests"),
                     ("LOGS_DIR", "logs"))}
            env.update({f"OBSSPEC_{k}": v for k, v in dirs.items()})
            env["HOME"] = os.path.join(self.host_root, "home")
            argv, cwd = ["bash", "--noprofile", "--norc", "-c", bwrap.script("supervisor.sh")], dirs["WORKDIR"]
        try:
            # a new session: the harness's own terminal signals never reach the episode
            self._proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
                cwd=cwd, limit=1 << 20, pass_fds=fds,
            )
        finally:
            for fd in fds:
                os.close(fd)
        self._supervisor_pid = self._proc.pid if cfg.isolation == "none" else 0
        untar = await self._request("untar", archive, "workspace", cfg.timeout_s * 4)
        if untar.exit_code != 0:
            raise SandboxError(f"could not write the task files: {_tail(untar)}")
        if self.container:
            self._supervisor_pid = await asyncio.to_thread(podman.host_pid, self.container)
        elif cfg.isolation == "bwrap":
            self._supervisor_pid = _find_supervisor(self._proc.pid)
        setup_result = await self._request("raw", _encode(setup or ":"), cfg.clock_start, cfg.timeout_s * 4)
        if setup_result.exit_code != 0:
            raise SandboxError(f"task setup failed (exit {setup_result.exit_code}): {_tail(setup_result)}")

    def _podman_argv(self, env: dict[str, str]) -> list[str]:
        """The `podman run` command line (building the image first if it is missing)."""
        cfg, environment = self.config, self.environment or podman.Environment()
        try:
            podman.sweep_once()  # containers an earlier, crashed harness left
            image = images.ensure_image(environment, self.workdir, bwrap.etc_files(cfg.hostname))
        except podman.PodmanMissing as e:
            raise SandboxUnavailable(str(e)) from None
        if environment.semantics == HARBOR:
            return self._harbor_argv(image, environment)
        memory_mb = environment.memory_mb or cfg.memory_mb
        # Process limits are the container's pids cgroup: every container runs as the same host
        # uid, so a per-uid RLIMIT_NPROC would count the processes of every episode together.
        env.update(OBSSPEC_MAX_PROCS=str(podman.nproc_limit()), OBSSPEC_MEMORY_KB=str(memory_mb * 1024),
                   OBSSPEC_ROOT="readonly")
        self.container = podman.container_name()
        return podman.argv(cfg, self.workdir, image, environment, self.container, env,
                           bwrap.next_cpu() if cfg.deterministic else None, bwrap.script("supervisor.sh"))

    def _harbor_argv(self, image: str, environment: podman.Environment) -> list[str]:
        """`podman run` for Harbor semantics (obsspec/env/semantics.py): the image's own user,
        entrypoint and environment; a host uid range of its own when the harness is root."""
        cfg, config = self.config, images.image_config(image)
        if os.geteuid() == 0:
            try:
                self._uid = bwrap.HostUid(base=bwrap.HOST_RANGE_BASE, slots=bwrap.HOST_RANGE_SLOTS,
                                          size=bwrap.HOST_RANGE_SIZE)
            except OSError as e:
                raise SandboxUnavailable(f"cannot give the container a host uid range of its own: {e}") from None
        env = podman.harbor_env(cfg, self.workdir, config, environment)
        self.container = podman.container_name()
        return podman.harbor_argv(cfg, self.workdir, image, environment, self.container, env,
                                  bwrap.script("supervisor_harbor.sh"), self._uid and self._uid.uid)

    async def close(self) -> None:
        """Kill every process of the episode and free its files. Safe to call twice.

        Killing PID 1 from the host makes the kernel kill the rest of its PID namespace, and
        bwrap exits only once its PID 1 is reaped, i.e. once nothing of the episode is left."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            inner = self._supervisor_pid if self._supervisor_pid != proc.pid else 0
            try:
                if inner:
                    _kill(inner)
                    try:
                        await asyncio.wait_for(asyncio.shield(proc.wait()), 5)
                    except asyncio.TimeoutError:
                        pass
            finally:  # (also when cancelled meanwhile: the episode's processes die regardless)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            await proc.wait()
        if self.container:  # the podman client is gone; the container may not be (conmon keeps it)
            name, self.container = self.container, ""
            # (shielded: cancelled meanwhile, the removal still finishes in its thread)
            await asyncio.shield(asyncio.to_thread(podman.remove, name))
        if self._uid is not None:  # nothing of the episode runs as it any more
            self._uid.release()
            self._uid = None
        if self.host_root:
            shutil.rmtree(self.host_root, ignore_errors=True)
            self.host_root = ""

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- commands ---------------------------------------------------------------------------------
    async def run(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Run one agent command in the episode's persistent shell; the logical clock ticks.
        `timeout_s` (the tool call's) is clamped to the configured limit."""
        self.turn += 1
        clock = self.config.clock_start + self.turn * self.config.turn_seconds
        limit = min(timeout_s, self.config.timeout_s) if timeout_s else self.config.timeout_s
        return await self._request("run", _encode(command), clock, limit)

    async def verify(self, script: str, files: dict[str, str] | None = None,
                     timeout_s: float | None = None, *, reward_file: bool = False) -> float:
        """Run a task's verifier; return its reward in [0, 1]: its exit status, or with
        `reward_file` (Harbor's convention) what it wrote to /logs/verifier/reward.txt. A
        verifier that does not use that file must not be judged by it: only the agent's code,
        run by the verifier, could have written it there.

        No agent process is alive when it starts (PID 1 kills them all and checks), /tests, /logs
        and the harness's state are emptied first, so nothing the agent planted there counts
        (scripts/janitor.py). What the agent left that cannot be undone scores 0: only the agent
        can lock its own files away from us, and a verifier must never read them."""
        cfg = self.config
        clock = cfg.clock_start + self.turn * cfg.turn_seconds
        reset = await self._request("reset", b"", clock, RESET_TIMEOUT_S)
        if reset.exit_code == TAMPERED:
            return 0.0
        if reset.exit_code != 0:
            raise SandboxError("agent processes survived the kill before verification" if reset.exit_code == 1
                               else f"could not clean up before verification: {_tail(reset)}")
        untar = await self._request("untar", bwrap.tar_files(files or {}, cfg.clock_start), "tests", 30)
        if untar.exit_code != 0:  # (/tests was checked empty: its size is ours to get right)
            raise SandboxError(f"could not write the verifier's files: {_tail(untar)}")
        limit = min(timeout_s or cfg.timeout_s * 4, cfg.max_verify_s)
        result = await self._request("verify", _encode(script), clock, limit)
        harbor = self.environment is not None and self.environment.semantics == HARBOR
        if reward_file or harbor:  # (Harbor semantics: the janitor looks again after the verifier)
            written = await self._request("reward", b"", clock, RESET_TIMEOUT_S if harbor else 30)
            if written.exit_code == TAMPERED:
                return 0.0
            if reward_file:  # (no reward file, or an unreadable one, is 0 whatever test.sh exited with)
                if written.exit_code != 0:
                    return 0.0
                try:
                    value = float(written.output.decode("ascii", "replace").strip())
                except ValueError:
                    return 0.0
                return min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0
        return 1.0 if result.exit_code == 0 and not result.timed_out else 0.0

    async def _request(self, op: str, payload: bytes, arg, timeout_s: float) -> ExecResult:
        if self._proc is None:
            raise SandboxError("sandbox is not running (call start() first)")
        async with self._lock:  # one command at a time per episode, as in a terminal
            nonce = secrets.token_hex(8)
            header = f"{op} {nonce} {len(payload)} {arg}\n".encode()
            t0 = time.monotonic()
            try:
                self._proc.stdin.write(header + payload)
                await self._proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as e:
                raise await self._died("stdin closed") from e
            reader = _OutputReader(self._proc.stdout, nonce, capture_bytes_for(self.config.output_cap))
            timed_out = False
            try:
                try:
                    rc = await asyncio.wait_for(asyncio.shield(reader.task), timeout_s)
                except asyncio.TimeoutError:
                    timed_out = True
                    await self._interrupt()
                    try:
                        rc = await asyncio.wait_for(reader.task, 10)
                    except asyncio.TimeoutError:
                        raise await self._died("did not recover from a timeout") from None
            except asyncio.CancelledError:
                # The episode is being cancelled mid-command: the protocol is out of step now,
                # so this sandbox cannot serve another request. Kill it; nothing is left running.
                reader.task.cancel()
                await self.close()
                raise
            if rc is None:
                raise await self._died("output closed")
            seconds = time.monotonic() - t0
            return ExecResult(
                output=bytes(reader.captured), total_bytes=reader.total,
                exit_code=-1 if timed_out else rc, timed_out=timed_out, seconds=seconds,
                timeout_s=timeout_s,
            )

    async def _interrupt(self) -> None:
        """Ask the supervisor (PID 1 inside) to kill every other process of the episode."""
        pid = self._supervisor_pid or (0 if self.container else _find_supervisor(self._proc.pid))
        self._supervisor_pid = pid
        if pid:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    async def _died(self, why: str) -> SandboxError:
        err = b""
        if self._proc is not None and self._proc.stderr is not None:
            try:
                err = await asyncio.wait_for(self._proc.stderr.read(2000), 1)
            except asyncio.TimeoutError:
                pass
        await self.close()
        return SandboxError(f"sandbox died ({why}): {err.decode('utf-8', 'replace').strip()}")


# ---------------------------------------------------------------------------------------------


class _OutputReader:
    """Reads a command's output up to its end marker, keeping the first `keep` bytes."""

    def __init__(self, stream: asyncio.StreamReader, nonce: str, keep: int):
        self.marker = b"\0" + nonce.encode() + b" "
        self.keep = keep
        self.captured = bytearray()
        self.total = 0
        self.task = asyncio.ensure_future(self._read(stream))

    async def _read(self, stream: asyncio.StreamReader) -> int | None:
        pending = b""  # bytes that may be the start of the marker
        while True:
            chunk = await stream.read(1 << 16)
            if not chunk:
                return None
            data = pending + chunk
            at = data.find(self.marker)
            if at >= 0:
                self._take(data[:at])
                rest = data[at + len(self.marker):]
                while b"\0" not in rest:
                    more = await stream.read(64)
                    if not more:
                        return None
                    rest += more
                try:
                    return int(rest[: rest.index(b"\0")])
                except ValueError:  # not our marker's status: the protocol is broken
                    return None
            # keep a tail that could be a marker split across reads
            split = max(0, len(data) - len(self.marker) + 1)
            self._take(data[:split])
            pending = data[split:]

    def _take(self, data: bytes) -> None:
        self.total += len(data)
        room = self.keep - len(self.captured)
        if room > 0:
            self.captured += data[:room]


def _find_supervisor(bwrap_pid: int) -> int:
    """Host PID of the sandbox's PID 1: the deepest descendant chain of the setpriv/bwrap process."""
    pid = bwrap_pid
    for _ in range(4):  # setpriv execs bwrap (same pid); bwrap forks the sandbox's init
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            return 0
        if not kids:
            return pid if pid != bwrap_pid else 0
        pid = kids[0]
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("NSpid:") and line.split()[-1] == "1":
                        return pid
        except OSError:
            return 0
    return 0


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _encode(script: str) -> bytes:
    if "\0" in script:
        raise ValueError("a command cannot contain NUL bytes")
    return script.encode("utf-8", "surrogateescape")


def _tail(result: ExecResult) -> str:
    """The end of what a request printed, as one line (for an error message)."""
    lines = result.output[-500:].decode("utf-8", "replace").splitlines()
    return "; ".join(line.strip() for line in lines if line.strip()) or "(no output)"
