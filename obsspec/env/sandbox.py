"""Bubblewrap sandboxes: one private, deterministic terminal per episode.

    sandbox = Sandbox(SandboxConfig(), workdir="/app")
    await sandbox.start(files={"notes.txt": "hi\\n"}, setup="mkdir -p data")
    result = await sandbox.run("cd data && ls -la")      # ExecResult: output bytes + exit code
    await sandbox.close()                                  # kills everything, removes workspace

What an episode gets (DESIGN.md section 5):
- a private workspace (a host temp dir) mounted at `workdir`; read-only /usr and /etc; its own
  /tmp, HOME, hostname, user (`agent`, uid 1000), PID, IPC, UTS and network namespaces (no
  network, only loopback); nothing from the host's home or project, nor other episodes;
- a persistent shell: cwd, variables, functions, aliases and options carry over between commands
  (see scripts/runner.sh for how, and why each command still runs in its own process);
- limits: a per-command timeout that kills every process the episode started (the shell state
  survives), an output cap, address-space, file-size and process-count limits, and the whole PID
  namespace dies with the episode;
- determinism: fixed TZ, locale, hostname, user, HOME and umask; files the setup creates get one
  fixed time; libfaketime pins the wall clock to a logical clock (`clock_start` + turn *
  `turn_seconds`), and files a command changed are re-stamped to that logical time afterwards
  (the kernel stamps real times, which libfaketime cannot change).

When the harness runs as root, the sandbox runs as `nobody` on the host, so that process limits
apply (the kernel exempts root from RLIMIT_NPROC) and nothing inside has host privileges.
"""

from __future__ import annotations

import asyncio
import glob
import os
import secrets
import shutil
import signal
import tempfile
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from obsspec.fields import doc
from obsspec.chat import capture_bytes_for

NOBODY = 65534
SANDBOX_UID = 1000
# Any file time after this is a real (kernel) time, not one of ours, and gets re-stamped.
HORIZON_SECONDS = 10_000_000


class SandboxError(RuntimeError):
    """The sandbox itself failed (an infrastructure failure, never the agent's fault)."""


class SandboxUnavailable(SandboxError):
    """bubblewrap is not installed (or cannot create namespaces) on this machine."""


@dataclass(frozen=True)
class SandboxConfig:
    """How episodes are isolated and limited. Every field is a recipe key under `sandbox:`."""

    isolation: str = doc("bwrap", "'bwrap' (default) or 'none': run commands UNSANDBOXED on "
                                   "this host (explicit opt-in only; warns).")
    timeout_s: float = doc(30.0, "Per-command timeout, seconds; the command and everything it "
                                  "started are killed, the shell state survives.")
    output_cap: int = doc(4096, "Characters of output an observation keeps; the rest is cut "
                                 "with a marker.")
    memory_mb: int = doc(4096, "Address-space limit per process (ulimit -v), MiB.")
    max_procs: int = doc(256, "Process limit for the whole episode (RLIMIT_NPROC in its own "
                               "user namespace).")
    max_file_mb: int = doc(1024, "Largest file a command may write (ulimit -f), MiB.")
    tmp_mb: int = doc(512, "Size of the episode's /tmp (a tmpfs), MiB.")
    deterministic: bool = doc(True, "Pin clock, file times, hostname, user and locale.")
    clock_start: int = doc(1_704_067_200, "Logical clock at episode start, epoch seconds "
                                           "(2024-01-01T00:00:00Z).")
    turn_seconds: int = doc(60, "How far the logical clock moves per command, seconds.")
    hostname: str = doc("sandbox", "Hostname inside the sandbox.")
    workspace_root: str = doc("", "Host directory under which episode workspaces are created "
                                   "('' = the system temp dir).")

    def __post_init__(self) -> None:
        if self.isolation not in ("bwrap", "none"):
            raise ValueError(f"sandbox.isolation must be 'bwrap' or 'none', not {self.isolation!r}")
        for name in ("timeout_s", "output_cap", "memory_mb", "max_procs", "max_file_mb", "tmp_mb"):
            if getattr(self, name) <= 0:
                raise ValueError(f"sandbox.{name} must be positive")


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


# ---------------------------------------------------------------------------------------------
# Host-side files shared by every sandbox of this process


def _script(name: str) -> str:
    return resources.files("obsspec.env").joinpath("scripts", name).read_text()


@lru_cache(maxsize=1)
def _faketime_lib() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else ""


@lru_cache(maxsize=None)
def _etc_dir(hostname: str) -> str:
    """/etc/passwd, group and hostname for the sandbox, so `ls -l` and `whoami` say `agent`."""
    path = tempfile.mkdtemp(prefix="obsspec-etc-")
    os.chmod(path, 0o755)
    files = {
        "passwd": f"root:x:0:0:root:/root:/bin/bash\nagent:x:{SANDBOX_UID}:{SANDBOX_UID}:agent:"
        f"/home/agent:/bin/bash\nnobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nagent:x:{SANDBOX_UID}:\nnogroup:x:{NOBODY}:\n",
        "hostname": hostname + "\n",
        "hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n",
    }
    for name, text in files.items():
        with open(os.path.join(path, name), "w") as f:
            f.write(text)
        os.chmod(os.path.join(path, name), 0o644)
    return path


async def preflight(config: SandboxConfig) -> None:
    """Fail fast, with one clear line, when sandboxes cannot start on this machine at all."""
    sandbox = Sandbox(config)
    try:
        await sandbox.start()
        await sandbox.run("true")
    except SandboxUnavailable:
        raise
    except SandboxError as e:
        raise SandboxUnavailable(f"cannot start a bubblewrap sandbox here: {e}") from None
    finally:
        await sandbox.close()


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

    def __init__(self, config: SandboxConfig, workdir: str = "/app"):
        if not workdir.startswith("/") or workdir in ("/", "/usr", "/etc", "/proc", "/dev"):
            raise ValueError(f"task workdir must be an absolute, non-system path, not {workdir!r}")
        self.config = config
        self.workdir = workdir
        self.turn = 0
        self.host_root = ""  # host dir holding workspace/, tests/ and logs/
        self._proc: asyncio.subprocess.Process | None = None
        self._supervisor_pid = 0
        self._lock = asyncio.Lock()

    # -- paths on the host ----------------------------------------------------------------------
    @property
    def workspace(self) -> str:
        return os.path.join(self.host_root, "workspace")

    @property
    def tests_dir(self) -> str:
        return os.path.join(self.host_root, "tests")

    @property
    def logs_dir(self) -> str:
        return os.path.join(self.host_root, "logs")

    # -- life cycle -------------------------------------------------------------------------------
    async def start(self, files: dict[str, str] | None = None, setup: str = "") -> None:
        """Create the workspace, write `files`, start the shell and run `setup` in it."""
        cfg = self.config
        root = cfg.workspace_root or None
        if root:
            os.makedirs(root, exist_ok=True)
        self.host_root = tempfile.mkdtemp(prefix="obsspec-ep-", dir=root)
        for sub in ("workspace", "tests", "logs/verifier"):
            os.makedirs(os.path.join(self.host_root, sub))
        for rel, text in (files or {}).items():
            _write_file(self.workspace, rel, text)
        if os.geteuid() == 0 and cfg.isolation == "bwrap":
            _chown_tree(self.host_root, NOBODY)
        env = self._env()
        if cfg.isolation == "bwrap":
            argv = self._bwrap_argv()
        else:
            warnings.warn("sandbox.isolation=none: agent commands run UNSANDBOXED on this host")
            env["OBSSPEC_WORKDIR"] = self.workspace
            env["HOME"] = self.workspace
            env["OBSSPEC_STATE_DIR"] = os.path.join(self.host_root, "state")
            os.makedirs(env["OBSSPEC_STATE_DIR"])
            argv = ["bash", "--noprofile", "--norc", "-c", _script("supervisor.sh")]
        # a new session: the harness's own terminal signals never reach the episode
        self._proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
            cwd=self.workspace, limit=1 << 20,
        )
        self._supervisor_pid = self._proc.pid if cfg.isolation == "none" else 0
        setup_result = await self._request("raw", setup or ":", cfg.clock_start, cfg.timeout_s * 4)
        if setup_result.exit_code != 0:
            tail = setup_result.output[-500:].decode("utf-8", "replace")
            raise SandboxError(f"task setup failed (exit {setup_result.exit_code}): {tail}")

    async def close(self) -> None:
        """Kill every process of the episode and remove its files. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await proc.wait()
        if self.host_root:
            shutil.rmtree(self.host_root, ignore_errors=True)
            self.host_root = ""

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- commands ---------------------------------------------------------------------------------
    async def run(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Run one agent command in the episode's persistent shell; the logical clock ticks."""
        self.turn += 1
        clock = self.config.clock_start + self.turn * self.config.turn_seconds
        return await self._request("run", command, clock, timeout_s or self.config.timeout_s)

    async def run_script(self, script: str, timeout_s: float | None = None) -> ExecResult:
        """Run a harness script (not an agent command) in a fresh bash with cwd = workdir."""
        clock = self.config.clock_start + self.turn * self.config.turn_seconds
        return await self._request("raw", script, clock, timeout_s or self.config.timeout_s)

    async def verify(self, script: str, files: dict[str, str] | None = None,
                     timeout_s: float | None = None) -> float:
        """Run a task's verifier; return its reward in [0, 1] (Harbor's reward.txt, else exit code)."""
        # /tests is mounted read-only and empty during the episode; /logs is cleared here so that
        # a reward the agent planted does not count. (Empty the dirs, don't replace them: the
        # sandbox's bind mounts point at these very inodes.)
        _empty_dir(self.tests_dir)
        _empty_dir(self.logs_dir)
        os.makedirs(os.path.join(self.logs_dir, "verifier"))
        for rel, text in (files or {}).items():
            _write_file(self.tests_dir, rel, text)
        if os.geteuid() == 0 and self.config.isolation == "bwrap":
            _chown_tree(self.tests_dir, NOBODY)
            _chown_tree(self.logs_dir, NOBODY)
        result = await self.run_script(script, timeout_s or self.config.timeout_s * 4)
        reward_file = os.path.join(self.logs_dir, "verifier", "reward.txt")
        if os.path.exists(reward_file):
            try:
                reward = float(open(reward_file).read().strip())
            except ValueError:
                return 0.0
            return min(1.0, max(0.0, reward))
        return 1.0 if result.exit_code == 0 and not result.timed_out else 0.0

    async def _request(self, op: str, script: str, clock: int, timeout_s: float) -> ExecResult:
        if self._proc is None:
            raise SandboxError("sandbox is not running (call start() first)")
        if "\0" in script:
            raise ValueError("a command cannot contain NUL bytes")
        async with self._lock:  # one command at a time per episode, as in a terminal
            payload = script.encode("utf-8", "surrogateescape")
            nonce = secrets.token_hex(8)
            header = f"{op} {nonce} {len(payload)} {clock}\n".encode()
            t0 = time.monotonic()
            try:
                self._proc.stdin.write(header + payload)
                await self._proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as e:
                raise await self._died("stdin closed") from e
            reader = _OutputReader(self._proc.stdout, nonce, capture_bytes_for(self.config.output_cap))
            timed_out = False
            try:
                rc = await asyncio.wait_for(asyncio.shield(reader.task), timeout_s)
            except asyncio.TimeoutError:
                timed_out = True
                await self._interrupt()
                try:
                    rc = await asyncio.wait_for(reader.task, 10)
                except asyncio.TimeoutError:
                    raise await self._died("did not recover from a timeout") from None
            if rc is None:
                raise await self._died("output closed")
            seconds = time.monotonic() - t0
            return ExecResult(
                output=bytes(reader.captured), total_bytes=reader.total,
                exit_code=-1 if timed_out else rc, timed_out=timed_out, seconds=seconds,
            )

    async def _interrupt(self) -> None:
        """Ask the supervisor (PID 1 inside) to kill every other process of the episode."""
        pid = self._supervisor_pid or _find_supervisor(self._proc.pid)
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

    # -- how the sandbox is built -------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        cfg = self.config
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
            "HOME": "/home/agent", "USER": "agent", "LOGNAME": "agent", "SHELL": "/bin/bash",
            "HOSTNAME": cfg.hostname, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
            "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
            "OBSSPEC_WORKDIR": self.workdir,
            "OBSSPEC_STATE_DIR": "/run/obsspec-state",
            "OBSSPEC_RUNNER": _script("runner.sh"),
            "OBSSPEC_MAX_PROCS": str(cfg.max_procs),
            "OBSSPEC_MEMORY_KB": str(cfg.memory_mb * 1024),
            "OBSSPEC_FILE_BLOCKS": str(cfg.max_file_mb * 2048),  # ulimit -f counts 512-byte blocks
            "OBSSPEC_DETERMINISTIC": "1" if cfg.deterministic else "0",
            "OBSSPEC_HORIZON": str(cfg.clock_start + HORIZON_SECONDS),
            "OBSSPEC_FAKETIME_LIB": _faketime_lib() if cfg.deterministic else "",
        }

    def _bwrap_argv(self) -> list[str]:
        cfg = self.config
        etc = _etc_dir(cfg.hostname)
        argv = []
        if os.geteuid() == 0:
            argv += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
        argv += [check_bwrap(), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                 "--new-session", "--as-pid-1", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
                 "--hostname", cfg.hostname, "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
            host = os.path.join("/", name)
            if os.path.islink(host):
                argv += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                argv += ["--ro-bind", host, host]
        argv += ["--ro-bind", "/etc", "/etc"]
        for name in ("passwd", "group", "hostname", "hosts"):
            argv += ["--ro-bind", os.path.join(etc, name), f"/etc/{name}"]
        argv += ["--proc", "/proc", "--dev", "/dev",
                 "--size", str(cfg.tmp_mb << 20), "--tmpfs", "/tmp",
                 "--dir", "/home/agent", "--dir", "/run/obsspec-state",
                 "--bind", self.workspace, self.workdir,
                 "--ro-bind", self.tests_dir, "/tests",
                 "--bind", self.logs_dir, "/logs",
                 "--chdir", self.workdir,
                 "bash", "--noprofile", "--norc", "-c", _script("supervisor.sh")]
        return argv


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
                return int(rest[: rest.index(b"\0")])
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


def _write_file(base: str, rel: str, text: str) -> None:
    path = os.path.normpath(os.path.join(base, rel))
    if not path.startswith(base + os.sep):
        raise ValueError(f"task file path escapes the workspace: {rel!r}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def _empty_dir(path: str) -> None:
    for name in os.listdir(path):
        child = os.path.join(path, name)
        if os.path.isdir(child) and not os.path.islink(child):
            shutil.rmtree(child)
        else:
            os.unlink(child)


def _chown_tree(path: str, uid: int) -> None:
    os.chown(path, uid, uid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
