# obsspec Harbor-semantics worlds: run by PID 1 of a Harbor container (scripts/supervisor_harbor.sh)
# from the image's own read-only root, as the container's root with the harness's capabilities.
#
#   python3 -I -c "$OBSSPEC_WORLD" agent    UPPER ROOT WORKDIR    (exec: the agent world's init)
#   python3 -I -c "$OBSSPEC_WORLD" verifier ROOT WORK WORKDIR     (exec: the verifier, script on fd 3)
#
# agent: ROOT, the agent's writable overlay (lower: the image, upper: UPPER, a tmpfs of the
#   task's storage size), is mounted where the harness sees it too; then a mount and PID
#   namespace whose root is ROOT, with a fresh /proc (podman's masks put back), a /dev of its own
#   (make_dev: a tmpfs holding the container's device nodes, bound, and its own /dev/shm), the
#   container's /sys, and a small tmpfs for the shell's state. Its PID 1 is this process, become
#   the image's USER with the agent's capabilities: the spawner (`serve`), which never executes
#   anything itself, made non-dumpable so that no agent process can trace it, and, being the
#   namespace's PID 1, deaf to every signal from inside it that it has no handler for:
#     fd 3: requests from PID 1 (scripts/supervisor_harbor.sh): OP NONCE NBYTES ARG\n<payload>,
#           OP = run (an agent command, with the shell state of scripts/runner.sh) or raw (the
#           task's setup script, cwd = workdir);
#     fd 4: `ready`, then one line `NONCE RC` per request when its command has returned;
#     fd 5: the episode's terminal: every command's stdout and stderr (the relay reads it).
#   Background processes live on when their command returns (services); on SIGUSR1 (a timeout)
#   the command's shell is killed and what it started lives on, as in a terminal. The image's ENTRYPOINT/CMD starts first, as a
#   service, as `docker run IMAGE` starts it, its output discarded.
#   No process in this world can see the harness (PID 1, the relay, the verifier) or its files.
# verifier: a mount and PID namespace of its own whose root is built here, in WORK/root: every top
#   entry of ROOT (the agent's files, live) bound in through a handle (an agent's symlink is
#   copied, never followed), except the system directories (/usr, /bin, /sbin, /lib*), which are the
#   image's own with a private writable layer, and /etc's settings that make a program load, run or
#   fetch code (OBSSPEC_ETC_PRISTINE: the loader's, NSS, interpreters', OpenSSL's, git's, apt's,
#   PAM's, the shell's, name resolution), which are the image's unless the task's tests name them
#   (OBSSPEC_ETC_AGENT); /dev is a fresh one (make_dev); /tests and /logs are WORK/tests and
#   WORK/logs, which no agent process ever sees; /proc is the container's (the verifier sees the
#   agent's processes; it cannot signal them, being in a PID namespace below). The script, on fd
#   3, runs with bash --noprofile --norc /proc/self/fd/3 as root, as Harbor runs its verifiers
#   (with root's HOME: the agent's too unless the image names another USER), with the agent's
#   capabilities. Just before it execs, it writes one byte to fd 4: PID 1 then lets the agent's
#   processes (stopped since the janitor's sweep) run again.
# Everything is loaded before the new root is entered: nothing of the agent's is executed or
# imported by this process (the final exec is of the image's own bash, through its own loader).

import ctypes
import errno
import grp
import os
import platform
import pwd
import resource
import select
import shlex
import signal
import stat
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_NOATIME, MS_BIND = 1, 2, 4, 8, 32, 1024, 4096
MS_REC, MS_PRIVATE = 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
NR = {"x86_64": {"pivot_root": 155}, "aarch64": {"pivot_root": 41}}[platform.machine()]
# The agent's capabilities: Docker's default set (what Harbor's containers have) and NET_ADMIN
# over the container's own network namespace (iptables); the harness holds SYS_ADMIN on top, so
# no agent process may trace or inspect it (the kernel wants the tracer's capabilities to cover
# the tracee's).
AGENT_CAPS = {0, 1, 3, 4, 5, 6, 7, 8, 10, 12, 13, 18, 27, 29, 31}
SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# /etc entries the verifier takes from the image, not the agent (podman.harbor_env: semantics.py's
# ETC_PRISTINE less those the task's tests name); an entry ending in '*' is a prefix
ETC_PRISTINE = tuple(n for n in os.environ.get("OBSSPEC_ETC_PRISTINE", "").split(",") if n)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"}
NOT_CARRIED = {"proc", "sys", "dev", "tests", "logs",
               # read by a pytest verifier as its rootdir's configuration and plugins
               "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "conftest.py"}
# podman's masked and read-only /proc paths, put back on the agent's fresh /proc
PROC_MASKED = ("acpi", "kcore", "keys", "latency_stats", "timer_list", "timer_stats", "sched_debug", "scsi")
PROC_READONLY = ("asound", "bus", "fs", "irq", "sys", "sysrq-trigger")
SIGPENDING = 64  # queued real-time signals (and POSIX timers) per user of the agent's
SETTLE_S = 3.0  # longest the agent's first command waits for the image's service to listen


def pristine_etc(name: str) -> bool:
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in ETC_PRISTINE)


def check(result: int, what: str) -> int:
    if result < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return result


def mount(src, target, fstype, flags: int, data=None) -> None:
    enc = lambda v: v.encode() if isinstance(v, str) else v  # noqa: E731
    check(libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def bind(dirfd: int, name: str, target: str, recursive: bool = False) -> None:
    """Bind `name` (relative to dirfd) onto `target`: through a handle opened without following
    a symlink, so that what is bound is the entry that was looked at, whatever its path has
    become since."""
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dirfd)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise OSError(errno.ELOOP, f"{name} became a symlink")
        mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | (MS_REC if recursive else 0))
    finally:
        os.close(fd)


def make_dev(target: str, shm_mb: int) -> None:
    """A /dev of its own at `target`: a tmpfs holding the container's device nodes (bound: no
    process here can make device nodes), the usual links into /proc, the container's /dev/pts and
    a /dev/shm of its own. The container's /dev itself is the harness's alone: an agent that
    replaced /dev/fd there would have chosen what the verifier's `bash /dev/fd/3` ran."""
    mount("tmpfs", target, "tmpfs", MS_NOSUID, "size=1m,mode=0755")
    dev = os.open("/dev", os.O_PATH | os.O_DIRECTORY)
    for name in DEVICES:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dev)
        try:
            if not stat.S_ISCHR(os.fstat(fd).st_mode):
                raise OSError(errno.ENODEV, f"/dev/{name} is not a device")
            os.close(os.open(f"{target}/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
            mount(f"/proc/self/fd/{fd}", f"{target}/{name}", None, MS_BIND)
        finally:
            os.close(fd)
    for name, to in DEV_LINKS.items():
        os.symlink(to, f"{target}/{name}")
    os.mkdir(f"{target}/pts")
    bind(dev, "pts", f"{target}/pts")
    os.mkdir(f"{target}/shm")
    mount("tmpfs", f"{target}/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_mb}m,mode=1777")
    os.close(dev)


def new_namespaces() -> None:
    """Enter fresh mount and PID namespaces: the caller waits for a child, PID 1 of the new
    one, and exits with its status; only the child returns. Killing the caller kills the child,
    and with it every process of its PID namespace."""
    check(libc.unshare(CLONE_NEWNS | CLONE_NEWPID), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    pid = os.fork()
    if pid:
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def enter(root: str) -> None:
    """Make `root` (a mount point) this namespace's root; nothing of the old one stays."""
    os.chdir(root)
    check(libc.syscall(NR["pivot_root"], b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def identity(user: str) -> tuple[int, int, list[int], str, str]:
    """(uid, gid, groups, name, home) of a Dockerfile USER (name, uid, name:group, uid:gid; '' is
    root), read from the image's own passwd and group files."""
    name, _, group = (user or "root").partition(":")
    try:
        pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        uid, gid, login, home = pw.pw_uid, pw.pw_gid, pw.pw_name, pw.pw_dir
    except KeyError:
        if not name.isdigit():
            raise SystemExit(f"obsspec: the image's USER {name} is not in its /etc/passwd")
        uid, gid, login, home = int(name), int(name), name, "/"
    if group:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    groups = sorted({gid, *(g.gr_gid for g in grp.getgrall() if login in g.gr_mem)})
    return uid, gid, groups, login, home


def become(who: tuple[int, int, list[int], str, str]) -> dict:
    """Drop to the agent's capabilities and the identity `who` (resolved by identity() in the
    image's own root, never in a view the agent has written to); the identity's environment."""
    uid, gid, groups, login, home = who
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        if cap not in AGENT_CAPS:
            check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    os.setgroups(groups)
    os.setgid(gid)
    os.setuid(uid)  # (a non-root USER loses every capability here)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # (a change of user cleared it)
    return {"HOME": home, "USER": login, "LOGNAME": login}


def environment(extra: dict) -> dict:
    """The image's environment as PID 1 got it (without the harness's variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSSPEC_") and k != "LC_ALL"}
    if os.environ.get("OBSSPEC_LC_ALL"):
        env["LC_ALL"] = os.environ["OBSSPEC_LC_ALL"]
    env.setdefault("TERM", "dumb")
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return {**env, **extra}


# ---------------------------------------------------------------------------------------------


def agent(upper: str, root: str, workdir: str) -> None:
    user = os.environ.get("OBSSPEC_USER", "")
    for sub in ("u", "w"):
        os.makedirs(f"{upper}/{sub}", exist_ok=True)
    os.makedirs(root, exist_ok=True)
    mount("overlay", root, "overlay", 0, f"lowerdir=/,upperdir={upper}/u,workdir={upper}/w,userxattr")
    if os.environ.get("OBSSPEC_INTERNET") == "1" and os.path.isfile("/etc/resolv.conf"):
        target = f"{root}/etc/resolv.conf"  # (podman's, mounted over the image's: not in the lower layer)
        if os.path.lexists(target):
            os.unlink(target)
        with open("/etc/resolv.conf", "rb") as src, open(target, "wb") as dst:
            dst.write(src.read())
    new_namespaces()
    for name in ("proc", "dev", "sys", "run/obsspec-shell"):
        os.makedirs(os.path.join(root, name), exist_ok=True)
    mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_MASKED:
        path = f"{root}/proc/{name}"
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY, "size=0")
        elif os.path.exists(path):
            mount("/dev/null", path, None, MS_BIND)
    for name in PROC_READONLY:
        path = f"{root}/proc/{name}"
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_REC)
    slash = os.open("/", os.O_PATH | os.O_DIRECTORY)
    make_dev(f"{root}/dev", int(os.environ.get("OBSSPEC_SHM_MB") or 64))
    bind(slash, "sys", f"{root}/sys", recursive=True)
    who = identity(user)
    mount("tmpfs", f"{root}/run/obsspec-shell", "tmpfs", MS_NOSUID | MS_NODEV, f"size=16m,mode=0700,uid={who[0]},gid={who[1]}")
    enter(root)
    env = environment(become(who))
    try:
        os.chdir(workdir)
    except OSError:
        os.chdir("/")
    serve(env, workdir)


def serve(env: dict, workdir: str) -> None:
    """The spawner's loop (see the header): PID 1 of the agent's world."""
    libc.prctl(PR_SET_DUMPABLE, 0)
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE,
                signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)
    maxprocs = int(os.environ["OBSSPEC_MAX_PROCS"])
    resource.setrlimit(resource.RLIMIT_NPROC, (maxprocs, maxprocs))
    # Queued signals are charged to every user namespace's owner up to host root, whose count all
    # containers share: a few per process of the agent's (the hard limit: no capability of the
    # agent's raises it).
    resource.setrlimit(resource.RLIMIT_SIGPENDING, (SIGPENDING, SIGPENDING))
    runner = {**env, **{k: v for k, v in os.environ.items() if k.startswith("OBSSPEC_")},
              "OBSSPEC_STATE_DIR": "/run/obsspec-shell"}
    reaped: dict[int, int] = {}
    current = [0]

    def reap(*_) -> None:  # orphans come to us: reap them all, keep their statuses
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            reaped[pid] = status

    def interrupt(*_) -> None:
        # A command that runs past its time is left running, as a terminal leaves it (a server
        # started in the foreground keeps serving): only its shell ends, unsaved, and what it
        # started lives on, its later output dropped.
        if current[0]:
            try:
                os.kill(current[0], signal.SIGKILL)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGCHLD, reap)
    signal.signal(signal.SIGUSR1, interrupt)
    entrypoint = shlex.split(os.environ.get("OBSSPEC_ENTRYPOINT", ""))
    if entrypoint:
        before = listening()
        pid = start(entrypoint, env, os.environ.get("OBSSPEC_IMAGE_WORKDIR") or "/", stdin=None)
        # A service the image starts gets a moment to open its socket before the agent's first
        # command (in Harbor the agent's first model call gives it seconds): until it listens,
        # exits, or SETTLE_S pass.
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and pid not in reaped and listening() <= before:
            select.select([], [], [], 0.02)
    os.write(4, b"ready\n")
    requests = os.fdopen(3, "rb", buffering=0)
    while True:
        header = read_line(requests)
        if not header:
            return
        op, nonce, nbytes, _ = (header.decode("ascii", "replace").split(" ", 3) + ["", "", "0", ""])[:4]
        script = read_exact(requests, int(nbytes))
        try:
            if op == "run":  # (the shell's $RANDOM is seeded at random, as in a fresh bash)
                argv = ["bash", "--noprofile", "--norc", "-c", 'eval "$OBSSPEC_RUNNER"; eval "$__obsspec_run"',
                        "bash", str(int.from_bytes(os.urandom(2), "big"))]
                pid = start(argv, runner, None, stdin=script)
            elif op == "raw":
                pid = start(["bash", "--noprofile", "--norc", "/proc/self/fd/3"], runner, workdir, stdin=script)
            else:
                os.write(4, f"{nonce} 2\n".encode())
                continue
        except OSError as e:  # the agent's processes took every one the container may have
            os.write(5, f"obsspec: cannot start the command: {e.strerror}\n".encode())
            os.write(4, f"{nonce} 126\n".encode())
            continue
        current[0] = pid
        while pid not in reaped:
            try:
                _, status = os.waitpid(pid, 0)
                reaped[pid] = status
            except ChildProcessError:
                pass  # (reap() took it first)
        current[0] = 0
        status = reaped.pop(pid)
        rc = os.waitstatus_to_exitcode(status)
        os.write(4, f"{nonce} {rc if rc >= 0 else 128 - rc}\n".encode())
        reaped.clear()


def listening() -> int:
    """How many sockets listen in this network namespace (TCP, and unix ones accepting)."""
    count = 0
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{name}") as f:
                count += sum(line.split()[3] == "0A" for line in list(f)[1:])
        except OSError:
            pass
    try:
        with open("/proc/net/unix") as f:
            count += sum(line.split()[3] == "00010000" for line in list(f)[1:])
    except OSError:
        pass
    return count


def start(argv: list[str], env: dict, cwd: str | None, stdin: bytes | None) -> int:
    """Fork `argv` in a session of its own: output to the terminal (fd 5), or nowhere for a
    service (stdin None); `stdin` bytes reach it on fd 3, on a pipe."""
    r, w = os.pipe() if stdin is not None else (-1, -1)
    try:
        pid = os.fork()
    except OSError:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)
        raise
    if pid == 0:
        try:
            os.setsid()
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)
            out = 5 if stdin is not None else null
            os.dup2(out, 1)
            os.dup2(out, 2)
            if stdin is not None:
                os.dup2(r, 3)
            else:
                os.close(3)
            os.closerange(4, 1 << 16)
            for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE,
                        signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD, signal.SIGUSR1):
                signal.signal(sig, signal.SIG_DFL)
            try:  # out of memory, the kernel takes the agent's processes before the harness's
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("1000")
            except OSError:
                pass
            if cwd:
                os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    if stdin is not None:
        os.close(r)
        try:
            while stdin:
                stdin = stdin[os.write(w, stdin):]
        except BrokenPipeError:
            pass
        os.close(w)
    return pid


def read_line(f) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        c = f.read(1)
        if not c:
            return b""
        line += c
    return line[:-1]


def read_exact(f, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = f.read(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def verifier(root: str, work: str, workdir: str) -> None:
    new_namespaces()
    view = f"{work}/root"
    os.makedirs(view, exist_ok=True)
    mount(view, view, None, MS_BIND)  # (pivot_root wants a mount point)
    rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    slash = os.open("/", os.O_PATH | os.O_DIRECTORY)
    carry(rfd, view, skip=NOT_CARRIED | set(SYSTEM) | {"etc"})
    for name in SYSTEM:  # the image's own, whatever the agent made of them
        pristine = f"/{name}"
        if os.path.islink(pristine):
            os.symlink(os.readlink(pristine), f"{view}/{name}")
        elif os.path.isdir(pristine):
            for sub in ("up", "wk"):
                os.makedirs(f"{work}/{sub}/{name}", exist_ok=True)
            os.mkdir(f"{view}/{name}")
            mount("overlay", f"{view}/{name}", "overlay", 0,
                  f"lowerdir={pristine},upperdir={work}/up/{name},workdir={work}/wk/{name},userxattr")
    os.mkdir(f"{view}/etc")
    try:
        efd = os.open("etc", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=rfd)
    except OSError:
        efd = -1
    if efd >= 0:
        carry(efd, f"{view}/etc", skip=set(), keep=lambda name: not pristine_etc(name))
    etc = os.open("/etc", os.O_PATH | os.O_DIRECTORY)
    for name in os.listdir("/etc"):
        if pristine_etc(name):
            put(etc, name, f"{view}/etc/{name}", os.lstat(f"/etc/{name}"), agents=False)
    for name in ("proc", "sys"):
        os.mkdir(f"{view}/{name}")
        bind(slash, name, f"{view}/{name}", recursive=True)
    os.mkdir(f"{view}/dev")
    make_dev(f"{view}/dev", int(os.environ.get("OBSSPEC_SHM_MB") or 64))
    wfd = os.open(work, os.O_PATH | os.O_DIRECTORY)
    for name in ("tests", "logs"):
        os.mkdir(f"{view}/{name}")
        bind(wfd, name, f"{view}/{name}")
    who = identity("root")  # (Harbor runs its verifiers as root, whatever the image's USER)
    enter(view)
    env = environment(become(who))
    env.update(PYTHONNOUSERSITE="1", PYTHONSAFEPATH="1")
    try:
        os.chdir(workdir)
    except OSError as e:
        print(f"obsspec: the verifier cannot enter {workdir}: {e.strerror}", flush=True)
        os._exit(1)
    bash = "/bin/bash" if os.path.exists("/bin/bash") else "/usr/bin/bash"
    try:  # PID 1 lets the agent's processes run again (they were stopped for the sweep)
        os.write(4, b"v")
        os.close(4)
    except OSError:
        pass
    os.execve(bash, ["bash", "--noprofile", "--norc", "/proc/self/fd/3"], env)


def carry(dirfd: int, into: str, skip: set, keep=lambda name: True) -> None:
    """Put every entry of the directory `dirfd` into `into` (our own tmpfs directory): symlinks
    as copies, files and directories as binds made from the entry itself (never a path that
    could have become a symlink meanwhile)."""
    for name in os.listdir(dirfd):
        if name in skip or not keep(name):
            continue
        try:
            put(dirfd, name, f"{into}/{name}", os.lstat(name, dir_fd=dirfd))
        except OSError as e:  # changed while we looked: what the agent left half-made is not carried
            if e.errno not in (errno.ENOENT, errno.ELOOP, errno.EINVAL, errno.ENOTDIR):
                raise


def put(dirfd: int, name: str, target: str, st: os.stat_result, agents: bool = True) -> None:
    """One entry into the verifier's view; the agent's are bound without access times: reading
    through a link would otherwise move the link's atime, which a live agent process can poll to
    learn the moment the verifier has read it. (The image's own keep their locked flags.)"""
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=dirfd), target)
        return
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(target)
        bind(dirfd, name, target, recursive=True)
    else:  # a file, socket, FIFO or device: bound over an empty file
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
        bind(dirfd, name, target)
    if not agents:
        return
    kept = os.statvfs(target).f_flag & (MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)  # (a remount must keep them)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOATIME | kept)


if __name__ == "__main__":
    what, *args = sys.argv[1:]
    {"agent": agent, "verifier": verifier}[what](*args)
