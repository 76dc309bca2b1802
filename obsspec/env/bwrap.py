"""How an episode's bubblewrap sandbox is built: its command line, mounts and environment.

Nothing of the host's temp dirs is mounted: every writable place (/ itself, the workspace, /tmp,
HOME, the harness's state, /tests, /logs, /dev/shm) is a size-limited tmpfs inside the sandbox, so the
agent's writes are bounded in total and `/proc/self/mountinfo` names no host path. Small files
(/etc/passwd, ...) and the supervisor's shell come in through file descriptors (`--ro-bind-data`).

The supervisor (PID 1) runs from an execute-only copy of bash: a process whose executable it
cannot read is made non-dumpable by the kernel, so the agent (same uid) can neither ptrace it nor
read or write its memory through /proc/1/mem — it cannot stop, steer or impersonate PID 1.
"""

from __future__ import annotations

import fcntl
import glob
import io
import itertools
import os
import posixpath
import random
import shutil
import stat
import tarfile
from functools import lru_cache
from importlib import resources

from obsspec.env import seccomp
from obsspec.env.task import check_relative, file_bytes

NOBODY = 65534
SANDBOX_UID = 1000
# When the harness is root, each live sandbox runs as a host uid of its own from this range: the
# kernel keeps some counters per host uid (inotify instances, pipe buffer pages, processes), and
# episodes sharing one uid could pass an answer through them (one holds n instances, a sibling
# counts what is left). A lock file per uid, held while the sandbox lives, keeps two sandboxes,
# of this process or of another, from ever running as the same uid at once.
HOST_UID_BASE = 2_100_000_000
HOST_UID_SLOTS = 1 << 16
# A container with Harbor semantics maps 65,536 uids (root included) onto a host range of its
# own from here, so that nothing in it runs as a host uid any other live sandbox uses.
HOST_RANGE_BASE = 2_200_000_000
HOST_RANGE_SIZE = 1 << 16
HOST_RANGE_SLOTS = 1 << 14
UID_LOCKS = "/run/obsspec-uids"  # (root only: /run is root's)
# Any file time after this is a real (kernel) time, not one of ours, and gets re-stamped.
HORIZON_SECONDS = 10_000_000
STATE_DIR = "/run/obsspec-state"
SUPERVISOR = "/run/obsspec/bash"
HARNESS_TMPFS_MB = 16  # the state dir and /logs: small files of ours (shell state, reward)
SHM_MB = 64
ROOT_TMPFS_MB = 4

# (from this process's PID: every sandbox host of a node is a process of its own, and each must
# not start at the same CPU)
_cpus = itertools.count(os.getpid())


def script(name: str) -> str:
    return resources.files("obsspec.env").joinpath("scripts", name).read_text()


@lru_cache(maxsize=1)
def faketime_lib() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else ""


@lru_cache(maxsize=1)
def stdbuf_lib() -> str:
    found = sorted(glob.glob("/usr/libexec/coreutils/libstdbuf.so") +
                   glob.glob("/usr/lib/*/coreutils/libstdbuf.so"))
    return found[0] if found else ""


def next_cpu() -> int | None:
    """The CPU for the next episode, round robin over the ones this process may use.

    One CPU per episode: its processes then run one at a time, which takes most of the
    scheduling races out of pipelines (which stage's error line comes first) and keeps an
    episode from taking more than one core. It is a determinism measure, not a security one:
    the agent may widen its own affinity again (`taskset`)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return cpus[next(_cpus) % len(cpus)] if cpus else None


def etc_files(hostname: str) -> dict[str, str]:
    """/etc/passwd, group, hostname and hosts, so `ls -l` and `whoami` say `agent`."""
    return {
        "passwd": f"root:x:0:0:root:/root:/bin/bash\nagent:x:{SANDBOX_UID}:{SANDBOX_UID}:agent:"
        f"/home/agent:/bin/bash\nnobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nagent:x:{SANDBOX_UID}:\nnogroup:x:{NOBODY}:\n",
        "hostname": hostname + "\n",
        "hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n",
    }


def data_fd(data: bytes) -> int:
    """A file descriptor to read `data` from (a pipe; the data must fit in its buffer)."""
    r, w = os.pipe()
    try:
        os.write(w, data)
    finally:
        os.close(w)
    return r


class HostUid:
    """A host uid (with `size` > 1: a range of `size` uids from `uid`) that no other live
    sandbox runs as, held until `release()`."""

    def __init__(self, folder: str = UID_LOCKS, base: int = HOST_UID_BASE, slots: int = HOST_UID_SLOTS,
                 size: int = 1) -> None:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            # (another user's folder could hold links that make us create files where they say)
            raise OSError(f"{folder} must be a directory of ours that no one else can write to")
        start = random.randrange(slots)
        for i in range(slots):
            uid = base + (start + i) % slots * size
            fd = os.open(os.path.join(folder, str(uid)),
                         os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise OSError(f"all {slots} sandbox uids are in use")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # (the lock goes with the descriptor)
            self._fd = -1


def argv(config, workdir: str, bwrap: str, host_uid: int | None = None) -> tuple[list[str], list[int]]:
    """(command line, file descriptors it reads) for one episode's sandbox; `host_uid` (the
    harness is root) is the host uid it runs as."""
    fds: list[int] = []
    out: list[str] = []
    cpu = next_cpu()
    if cpu is not None and shutil.which("taskset"):
        out += ["taskset", "-c", str(cpu)]
    if host_uid is not None:
        # the kernel exempts root from RLIMIT_NPROC, and nothing inside keeps host privileges
        out += ["setpriv", f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "--"]
    out += [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
            "--new-session", "--as-pid-1", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--hostname", config.hostname,
            # a small tmpfs as / itself, before anything is mounted on it: the mount points stay
            # re-stampable (the logical clock), and what the agent writes to / stays tiny
            "--size", str(ROOT_TMPFS_MB << 20), "--tmpfs", "/", "--ro-bind", "/usr", "/usr"]
    blob = seccomp.sandbox_filter()  # obsspec/env/seccomp.py: calls that reach past the agent
    if blob:
        fds.append(data_fd(blob))
        out += ["--seccomp", str(fds[-1])]
    for name in ("bin", "lib", "lib32", "lib64", "libx32", "sbin"):
        # Mount points, never symlinks (merged /usr makes them links on the host): the agent
        # owns / and could rename its own link over /lib64, and every program the harness starts
        # afterwards, the verifier included, would load the agent's dynamic loader (reward 1).
        host = os.path.join("/", name)
        if os.path.isdir(host):
            out += ["--ro-bind", os.path.realpath(host), host]
    out += ["--ro-bind", "/etc", "/etc"]
    for name, text in etc_files(config.hostname).items():
        fds.append(data_fd(text.encode()))
        out += ["--ro-bind-data", str(fds[-1]), f"/etc/{name}"]
    fds.append(os.open(os.path.realpath(shutil.which("bash") or "/bin/bash"), os.O_RDONLY))
    out += ["--perms", "0111", "--ro-bind-data", str(fds[-1]), SUPERVISOR]

    def tmpfs(mb: int, path: str) -> list[str]:
        return ["--size", str(mb << 20), "--tmpfs", path]

    out += ["--proc", "/proc", "--dev", "/dev", *tmpfs(SHM_MB, "/dev/shm"), "--remount-ro", "/dev",
            *tmpfs(config.tmp_mb, "/tmp"), *tmpfs(config.home_mb, "/home/agent"),
            *tmpfs(HARNESS_TMPFS_MB, STATE_DIR), *tmpfs(config.workspace_mb, workdir),
            *tmpfs(config.home_mb, "/tests"), *tmpfs(HARNESS_TMPFS_MB, "/logs"),
            "--chdir", workdir,
            SUPERVISOR, "--noprofile", "--norc", "-c", script("supervisor.sh")]
    return out, fds


def env(config, workdir: str) -> dict[str, str]:
    """The supervisor's environment (the runner removes the OBSSPEC_ variables for commands)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
        "HOME": "/home/agent", "USER": "agent", "LOGNAME": "agent", "SHELL": "/bin/bash",
        "HOSTNAME": config.hostname, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
        "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0",
        "OBSSPEC_WORKDIR": workdir,
        "OBSSPEC_STATE_DIR": STATE_DIR, "OBSSPEC_TESTS_DIR": "/tests", "OBSSPEC_LOGS_DIR": "/logs",
        "OBSSPEC_RUNNER": script("runner.sh"),
        "OBSSPEC_JANITOR": script("janitor.py"),
        "OBSSPEC_MAX_PROCS": str(config.max_procs),
        "OBSSPEC_MEMORY_KB": str(config.memory_mb * 1024),
        "OBSSPEC_FILE_BLOCKS": str(config.max_file_mb * 2048),  # ulimit -f counts 512-byte blocks
        "OBSSPEC_DETERMINISTIC": "1" if config.deterministic else "0",
        "OBSSPEC_CLOCK_START": str(config.clock_start),
        "OBSSPEC_HORIZON": str(config.clock_start + HORIZON_SECONDS),
        "OBSSPEC_FAKETIME_LIB": faketime_lib() if config.deterministic else "",
        "OBSSPEC_STDBUF_LIB": stdbuf_lib() if config.deterministic else "",
    }


def tar_files(files: dict, mtime: int) -> bytes:
    """A tar archive of task files (text, bytes or blobs; paths relative to the directory it is
    extracted into), every entry stamped `mtime`, directories included, so that nothing carries a
    real time."""
    buf = io.BytesIO()
    dirs: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for rel, text in sorted(files.items()):
            check_relative(rel)
            path = posixpath.normpath(rel)
            parts = path.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    tar.addfile(_entry(d, tarfile.DIRTYPE, 0o755, mtime))
            data = file_bytes(text)
            info = _entry(path, tarfile.REGTYPE, 0o644, mtime)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _entry(name: str, kind: bytes, mode: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = kind, mode, mtime
    return info
