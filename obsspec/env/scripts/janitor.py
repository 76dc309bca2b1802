# obsspec sandbox janitor: run by the supervisor (PID 1) at `reset`, after every agent process is
# dead and before the verifier runs. It undoes what the agent may have left for the verifier:
#   - /tests, /logs, the harness's state dir (and /dev/shm when sandboxed) are emptied;
#   - symlinks under the workspace (and /tmp, HOME when sandboxed) that lead into the verifier's
#     files, the harness's state or /proc are removed;
#   - sandboxed, whatever the agent added to / itself (a small tmpfs) is removed.
#   - the places emptied must then be empty for the kernel too: a tmpfs that still counts blocks
#     or inodes holds a file the agent unlinked but kept alive past its own death (a descriptor
#     in flight in a unix-socket cycle): the harness could not write the verifier there.
# Exit 0: done. Exit 4: something could not be undone, or the janitor failed or ran past its
# budget: the harness then scores the episode 0 without running the verifier. Only the agent
# shapes these trees, so a failure here must never become an infrastructure error (an episode
# excluded from the advantage at the agent's will).
#
# Why it is written this way (each was an attack that worked):
# - The agent runs as our uid and can chmod a directory to 000/100/555: a planted
#   /logs/verifier/reward.txt survived `find -delete`. We own every such directory, so we open
#   it (u+rwx) and put its mode back when we are done (a verifier may check modes). A link that
#   runs into a directory still locked at the time we look at it is removed: we may open that
#   directory later, and did (a link through a locked /tmp/d reached /tests: reward 1).
# - Trees can be deeper than PATH_MAX and wider than memory allows as full paths: we walk by
#   changing into each directory and use short relative names, one directory listing at a time.
# - Link chains can be long, deep or lead through /dev/stdin into /proc: each link is resolved as
#   the kernel would, a component at a time from directory handles, watching every step.
# - Millions of entries: the walk is in-process (no fork per entry) and has a budget counted in
#   entries and link steps, not seconds: the same trees get the same verdict on a busy machine
#   and an idle one (45,000 links beside a busy neighbour ran a wall-clock budget out: an infra
#   error at will). Its CPU need is bounded, so the harness can wait for it generously.
#
# Usage (stdin: the NUL-separated paths / held before the agent's first command):
#   python3 -I -c "$OBSSPEC_JANITOR" sandboxed|container|host TESTS LOGS STATE WORKDIR HOME
# (container: sandboxed in a podman container, whose / is read-only: nothing there to sweep)
#   python3 -I -c "$OBSSPEC_JANITOR" harbor UPPER ROOT before|after [WORK]
# (Harbor semantics: the agent owns its whole root ROOT, an overlay whose upper dir UPPER holds
# everything it changed; the verifier's /tests and /logs are its own, out of the agent's sight.
# Only the links remain to undo: every link the agent made that leads the verifier into /tests,
# /logs or /proc (also through /dev/fd, /dev/stdin) is removed, resolved in the verifier's view
# (class View: its /dev, /sys, system directories and /etc settings are not the agent's). Agent
# processes live on while the verifier runs, so the sweep runs again `after` it: a link found
# then was made meanwhile, and the episode scores 0; else the reward file under WORK is printed,
# read without following links (exit 3: there is none).)

import errno
import fcntl
import os
import stat
import sys

# Entries visited and link components resolved: ~2 us each here (45,000 links of 62 steps each, 2.8
# million steps, took 6.6 s), so under 2 s of CPU. Past it, the agent's trees were too much to
# undo: the episode scores 0.
BUDGET_STEPS = 1_000_000
steps = 0
problems: list[str] = []
reopened: list[tuple[str, int]] = []  # (absolute path, mode before) of directories opened by path


class OutOfBudget(Exception):
    pass


def tick() -> None:
    global steps
    steps += 1
    if steps > BUDGET_STEPS:
        raise OutOfBudget


def note(where: str, error: OSError) -> None:
    problems.append(f"{where}: {error.strerror or error}")


def opened(name: str, st: os.stat_result) -> int | None:
    """Make directory `name` (relative to the cwd) ours to list, enter and change; return the
    mode it had if we changed it."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o700 == 0o700:
        return None
    os.chmod(name, mode | 0o700)
    return mode


def remove(name: str) -> None:
    """Remove `name` (relative to the cwd) and everything below it; the cwd is kept."""
    tick()
    try:
        st = os.lstat(name)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name)
        return
    opened(name, st)
    os.chdir(name)
    path = [name]
    listings = [iter(os.listdir("."))]
    while listings:
        tick()
        child = next(listings[-1], None)
        if child is None:  # this directory is empty now
            listings.pop()
            os.chdir("..")
            os.rmdir(path.pop())
            continue
        cst = os.lstat(child)
        if stat.S_ISDIR(cst.st_mode) and cst.st_dev == st.st_dev:
            opened(child, cst)
            os.chdir(child)
            path.append(child)
            listings.append(iter(os.listdir(".")))
        elif stat.S_ISDIR(cst.st_mode):
            raise OSError(0, f"a mount inside {name} ({child})")
        else:
            os.unlink(child)


def open_path(path: str) -> None:
    """Open every directory from / down to `path` (a locked /run would hide the state dir)."""
    parts = path.strip("/").split("/")
    for i in range(len(parts) + 1):
        p = "/" + "/".join(parts[:i])
        st = os.lstat(p)
        if st.st_uid != os.geteuid():  # (a container's read-only / and /run: not the agent's to lock)
            continue
        mode = opened(p, st)
        if mode is not None:
            reopened.append((p, mode))


def wipe(path: str) -> None:
    os.chdir(path)
    for name in os.listdir("."):
        try:
            remove(name)
        except OSError as e:
            note(f"{path}/{name}", e)
        os.chdir(path)
    if os.listdir("."):
        problems.append(f"{path} is not empty")


MAX_HOPS = 40  # symlinks the kernel follows in one path before it gives up (ELOOP)


class Forbidden:
    """Where a link must not lead: into the verifier's files (/tests, /logs), the harness's
    state, or /proc (magic links such as /proc/self/fd/N or /proc/self/root/tests, and /dev/fd
    or /dev/stdin, which lead there). Told by inode, so that no path has to be put together."""

    def __init__(self, dirs: list[str], proc: str):
        self.dirs = {(st.st_dev, st.st_ino) for st in map(os.stat, dirs)}
        self.proc_dev = os.stat(proc).st_dev

    def hit(self, st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino) in self.dirs or st.st_dev == self.proc_dev


def reaches(name: str, forbidden: Forbidden) -> bool:
    """Does following symlink `name` (in the cwd) pass through a forbidden place? The link is
    resolved the way the kernel resolves it, one component and one link at a time from
    directory handles (no path is ever longer than a component, however deep the tree)."""
    here = os.open(".", os.O_PATH | os.O_DIRECTORY)
    todo = [name]  # components still to resolve, the next one last
    hops = 0
    try:
        while todo:
            tick()
            part = todo.pop()
            if part in ("", "."):
                continue
            st = os.stat(part, dir_fd=here, follow_symlinks=False)
            if forbidden.hit(st):
                return True
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_HOPS:
                    return False  # the kernel would give up too: it leads nowhere
                target = os.readlink(part, dir_fd=here)
                todo.extend(reversed(target.split("/")))
                if target.startswith("/"):
                    os.close(here)
                    here = os.open("/", os.O_PATH | os.O_DIRECTORY)
            elif stat.S_ISDIR(st.st_mode):
                step = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=here)
                os.close(here)
                here = step
            elif todo and any(p not in ("", ".") for p in todo):
                return False  # a file in the middle of a path: ENOTDIR for the verifier too
        return forbidden.hit(os.stat(here))
    except (FileNotFoundError, NotADirectoryError):
        return False  # a dead end for us is a dead end for the verifier (same uid, same tree)
    except OSError as e:  # ELOOP: the kernel gives up too; anything else (a directory locked
        return e.errno != errno.ELOOP  # now that a later step of ours opens): the link goes
    finally:
        os.close(here)


def unlink_aliases(root: str, forbidden: Forbidden) -> None:
    """Remove every symlink below `root` that leads to a forbidden place, putting back the modes
    of the directories opened on the way as it leaves them."""
    os.chdir(root)
    dev = os.lstat(".").st_dev
    listings = [iter(os.listdir("."))]
    modes: list[int | None] = [None]  # per level: the mode to put back on leaving it
    names = [""]
    while listings:
        tick()
        child = next(listings[-1], None)
        if child is None:
            listings.pop()
            mode, name = modes.pop(), names.pop()
            if listings:
                os.chdir("..")
                if mode is not None:
                    os.chmod(name, mode)
            continue
        try:
            st = os.lstat(child)
            if stat.S_ISLNK(st.st_mode):
                if reaches(child, forbidden):
                    os.unlink(child)
            elif stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
                mode = opened(child, st)
                os.chdir(child)
                listings.append(iter(os.listdir(".")))
                modes.append(mode)
                names.append(child)
        except OSError as e:
            note(f"{root}/.../{child}", e)


def sweep_root(original: set[str]) -> None:
    """Remove what the agent added to / (only the root tmpfs itself: mounts are not walked)."""
    dev = os.lstat("/").st_dev
    pending = ["/"]
    while pending:
        tick()
        here = pending.pop()
        os.chdir(here)
        for name in os.listdir("."):
            tick()
            path = os.path.join(here, name)
            st = os.lstat(name)
            if path not in original:
                try:
                    remove(name)
                except OSError as e:
                    note(path, e)
                os.chdir(here)
            elif stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
                mode = opened(name, st)
                if mode is not None:
                    reopened.append((path, mode))
                pending.append(path)


# ---------------------------------------------------------------------------------------------
# Harbor semantics: links resolved in the verifier's view (scripts/world.py `verifier` builds it)

FORBIDDEN_TOP = {"tests", "logs", "proc"}  # in the verifier's view: its own files, and /proc
FORBIDDEN_DEV = {"fd", "stdin", "stdout", "stderr"}  # /dev entries that lead into /proc
# What world.py's verifier puts at its / other than the agent's own entries (kept in step with it)
SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
NOT_CARRIED = {"pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "conftest.py"}
DEV = {"null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm"} | FORBIDDEN_DEV
ETC_PRISTINE = tuple(n for n in os.environ.get("OBSSPEC_ETC_PRISTINE", "").split(",") if n)


def pristine_etc(name: str) -> bool:
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in ETC_PRISTINE)


class LeadsIn(Exception):
    """A link's path reached a forbidden place of the verifier's view."""


class View:
    """The verifier's view of the agent's files, for resolving a link as the verifier will: at
    its /, `tests`, `logs` and `proc` are forbidden; `dev` is a fresh /dev whose fd, stdin, stdout
    and stderr lead into /proc; `sys` and the system directories are the container's (the
    image's: not what the agent made of them); /etc is the agent's but for the settings the image
    keeps; pytest's configuration files at / are not there; every other name is ROOT's.

    A place is a stack of (directory handle, tag) from the view's /: `..` pops it, as the kernel
    takes `..` to the parent of the directory it came down from (a stack entry is only ever the
    child of the one below it)."""

    def __init__(self, root: str):
        self.root = os.open(root, os.O_PATH | os.O_DIRECTORY)
        self.image = os.open("/", os.O_PATH | os.O_DIRECTORY)

    def top(self) -> list:
        return [(self.root, "/")]

    def lookup(self, stack: list, part: str):
        """(kind, value) of `part` in the directory on top of `stack`: ('dir', (fd, tag)) with a
        new handle, ('link', target), ('other', None); FileNotFoundError when it is not there,
        LeadsIn when it is a forbidden place."""
        fd, tag = stack[-1]
        base = fd
        if tag == "/":
            if part in FORBIDDEN_TOP:
                raise LeadsIn
            if part in NOT_CARRIED:
                raise FileNotFoundError(part)
            if part in ("dev", "sys") or part in SYSTEM:
                base = self.image
            elif part == "etc":
                try:
                    etc = os.open("etc", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.root)
                except OSError:
                    etc = -1
                return "dir", (etc, "etc")  # (always a directory in the view)
        elif tag == "etc":
            base = self.image if pristine_etc(part) else fd
        elif tag == "dev":
            if part in FORBIDDEN_DEV:
                raise LeadsIn
            if part not in DEV:
                raise FileNotFoundError(part)
        if base < 0:
            raise FileNotFoundError(part)
        name = f"etc/{part}" if tag == "etc" and base == self.image else part
        st = os.stat(name, dir_fd=base, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            return "link", os.readlink(name, dir_fd=base)
        if stat.S_ISDIR(st.st_mode):
            child = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=base)
            return "dir", (child, "dev" if tag == "/" and part == "dev" else "")
        return "other", None

    def reaches(self, base: list, name: str) -> bool:
        """Does following link `name` (in the directory on top of `base`) pass through a
        forbidden place of the view? Resolved a component and a link at a time, as the kernel
        resolves it there. A dead end followed by `..` counts as reaching: what is missing now
        (a directory the agent removed, or will make) must not decide it."""
        stack = list(base)
        owned: list[int] = []  # handles opened here (the base's belong to the caller)
        todo = [name]
        hops = 0

        def drop(entry) -> None:
            if entry[0] in owned:
                owned.remove(entry[0])
                if entry[0] >= 0:
                    os.close(entry[0])

        try:
            while todo:
                tick()
                part = todo.pop()
                if part in ("", "."):
                    continue
                if part == "..":
                    if len(stack) > 1:
                        drop(stack.pop())
                    continue
                try:
                    kind, value = self.lookup(stack, part)
                except (FileNotFoundError, NotADirectoryError):
                    return ".." in todo
                if kind == "link":
                    hops += 1
                    if hops > MAX_HOPS:
                        return False  # the kernel gives up too: it leads nowhere
                    todo.extend(reversed(value.split("/")))
                    if value.startswith("/"):
                        while len(stack) > 1:
                            drop(stack.pop())
                elif kind == "dir":
                    owned.append(value[0])
                    stack.append(value)
                elif any(p not in ("", ".") for p in todo):
                    return False  # a file in the middle of a path: ENOTDIR for the verifier too
            return False
        except LeadsIn:
            return True
        except OSError as e:  # (ELOOP: the kernel gives up too; anything else: the link goes)
            return e.errno != errno.ELOOP
        finally:
            for fd in owned:
                if fd >= 0:
                    os.close(fd)


def harbor(upper: str, root: str, when: str = "before", work: str = "") -> int:
    """Remove every link under UPPER (what the agent made) that the verifier's view would follow
    into a forbidden place (View.reaches); the link is removed through ROOT, the agent's merged
    view, at the same place. Links the verifier cannot see (under the image's system directories,
    the /etc settings the image keeps) are left alone. `after` the verifier, finding one is itself
    the problem: an agent process made it while the verifier ran (it may have read its own file
    through it); then the reward the verifier wrote is printed (reward())."""
    view = View(root)
    os.chdir(upper)
    dev = os.lstat(".").st_dev
    listings = [iter(os.listdir("."))]
    stack = view.top()  # the same directories in the view
    while listings:
        tick()
        child = next(listings[-1], None)
        if child is None:
            listings.pop()
            if len(stack) > 1:
                fd = stack.pop()[0]
                if fd >= 0:
                    os.close(fd)
            if listings:
                os.chdir("..")
            continue
        tag = stack[-1][1]
        if (tag == "/" and (child in SYSTEM or child in NOT_CARRIED or child in FORBIDDEN_TOP
                            or child in ("dev", "sys"))) or (tag == "etc" and pristine_etc(child)):
            continue  # (not in the verifier's view)
        try:
            st = os.lstat(child)
            if stat.S_ISLNK(st.st_mode):
                if view.reaches(stack, child):
                    os.unlink(child, dir_fd=stack[-1][0])
                    if when == "after":
                        problems.append(f"a link into the verifier's files appeared while it ran: {child}")
            elif stat.S_ISDIR(st.st_mode) and st.st_dev == dev:
                kind, entry = view.lookup(stack, child)
                if kind != "dir" or entry[0] < 0:
                    continue
                os.chdir(child)
                listings.append(iter(os.listdir(".")))
                stack.append(entry)
        except OSError as e:  # (a live agent process removed or replaced it meanwhile: skipped)
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                note(f"{root}/.../{child}", e)
    if when == "after" and work and not problems:
        return reward(work)
    return 0


def reward(work: str) -> int:
    """Print the reward file the verifier wrote (its first 64 bytes), reached from WORK one
    component at a time without following any link: code of the agent's that the verifier ran
    could have made /logs/verifier a link, which leads somewhere else in our view than in the
    verifier's (the agent's file, not the one test.sh wrote). A link on the way, or anything but
    a regular file at the end, is a problem; no file at all is exit 3."""
    fd = os.open(work, os.O_PATH | os.O_DIRECTORY)
    parts = ["logs", "verifier", "reward.txt"]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        try:
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return 3
        if stat.S_ISLNK(st.st_mode) or not (stat.S_ISREG(st.st_mode) if last else stat.S_ISDIR(st.st_mode)):
            problems.append(f"/logs/{'/'.join(parts[1:i + 1])} is not a plain {'file' if last else 'directory'}")
            return 0
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK if last else os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
        step = os.open(part, flags, dir_fd=fd)
        os.close(fd)
        fd = step
    sys.stdout.buffer.write(os.read(fd, 64))
    sys.stdout.flush()
    return 0


def main(argv: list[str]) -> None:
    where, tests, logs, state, workdir, home = argv
    # The output pipe is shared with every command the agent ran: a non-blocking or
    # signal-driven mode it left there must not reach our output (or PID 1's markers).
    flags = fcntl.fcntl(1, fcntl.F_GETFL)
    fcntl.fcntl(1, fcntl.F_SETFL, flags & ~(os.O_NONBLOCK | os.O_ASYNC))
    sandboxed = where in ("sandboxed", "container")
    original = set(sys.stdin.buffer.read().decode("utf-8", "surrogateescape").split("\0")) - {""}
    emptied = [tests, logs, state] + (["/dev/shm"] if sandboxed else [])
    # (unsandboxed, /tmp and HOME are the host's: only the workspace is ours to look at)
    link_roots = [workdir, "/tmp", home] if sandboxed else [workdir]
    if sandboxed:
        for path in emptied + link_roots:
            open_path(path)
    forbidden = Forbidden([tests, logs, state], "/proc")
    for path in emptied:
        wipe(path)
    for root in link_roots:
        unlink_aliases(root, forbidden)
    if where == "sandboxed":
        sweep_root(original)
    # Every mode we changed is put back (a verifier may check modes anywhere: a Harbor task can
    # ask for a read-only /tmp/shared), except the emptied places, which start over as the
    # sandbox made them (a /tests set to 000 must take the verifier's files).
    for path, mode in reversed(reopened):
        if path not in emptied:
            os.chmod(path, mode)
    for path in emptied:
        os.chmod(path, 0o755)
        clear_acls(path)
        if sandboxed:
            check_empty(path)


def check_empty(path: str) -> None:
    """An emptied tmpfs holds no block and no inode but its root, or something the agent left
    still pins it (its processes are all gone: only a descriptor in flight can)."""
    st = os.statvfs(path)
    blocks, inodes = st.f_blocks - st.f_bfree, st.f_files - st.f_ffree
    if blocks or inodes > 1:
        problems.append(f"{path} still holds {blocks * st.f_frsize >> 10} KiB in {inodes - 1} "
                        "unlinked files kept alive by the agent")


def clear_acls(path: str) -> None:
    """Drop POSIX ACLs the agent set (chmod leaves them): a default ACL of `---` on /tests made
    every directory the verifier's files unpacked into unreadable (an infra error at will)."""
    for attr in ("system.posix_acl_default", "system.posix_acl_access"):
        try:
            os.removexattr(path, attr)
        except OSError as e:
            if e.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
                note(path, e)


if __name__ == "__main__":
    try:  # the memory the agent's files hold is full: we, not PID 1, are the one to go (rc 137)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    code = 0
    try:
        if sys.argv[1:2] == ["harbor"]:
            code = harbor(*sys.argv[2:])
        else:
            main(sys.argv[1:])
    except OutOfBudget:
        problems.append(f"more than {BUDGET_STEPS} entries and link steps of the agent's to go through")
    except BaseException as e:  # whatever the agent's trees did to us: scored, not infra
        problems.append(f"janitor failed: {type(e).__name__}: {e}")
    for line in problems[:20]:
        print(line)
    sys.exit(4 if problems else code)
