# obsspec sandbox janitor: run by the supervisor (PID 1) at `reset`, after every agent process is
# dead and before the verifier runs. It undoes what the agent may have left for the verifier:
#   - /tests, /logs, the harness's state dir (and /dev/shm when sandboxed) are emptied;
#   - symlinks under the workspace (and /tmp, HOME when sandboxed) that lead into the verifier's
#     files, the harness's state or /proc are removed;
#   - sandboxed, whatever the agent added to / itself (a small tmpfs) is removed.
# The agent runs as our uid, so it can chmod a directory to 000, 100 or 555 to make its contents
# undeletable or unlistable by a plain `rm`/`find` (a planted /logs/verifier/reward.txt survived
# that way). We own every such directory, so we open it (u+rwx), do the work, and put back the
# modes of the workspace's directories (a verifier may check those). Anything still there
# afterwards is reported and exits 4: the harness scores the episode 0 (tampering), it never
# lets the verifier read it. Python and no forked helper per entry: tens of thousands of
# entries take a fraction of a second (one `rm` per entry made `reset` time out: an infra error
# the agent could cause at will).
#
# Usage (stdin: the NUL-separated paths / held before the agent's first command):
#   python3 -I -c "$OBSSPEC_JANITOR" sandboxed|host TESTS LOGS STATE WORKDIR HOME

import os
import shutil
import stat
import sys

FORBIDDEN = ("/tests", "/logs", "/proc", "/dev/fd", "/run")  # where a link must not lead
opened: list[tuple[str, int]] = []  # directories we opened, with their mode before
problems: list[str] = []


def note(path: str, error: OSError) -> None:
    problems.append(f"{path}: {error.strerror or error}")


def open_dir(path: str) -> bool:
    """Is `path` a directory we can now list, enter and change (opened if it was locked)?"""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o700 != 0o700:
        try:
            os.chmod(path, mode | 0o700)
        except OSError as e:
            note(path, e)
            return False
        opened.append((path, mode))
    return True


def children(path: str) -> list[os.DirEntry]:
    if not open_dir(path):
        return []
    try:
        return list(os.scandir(path))
    except OSError as e:
        note(path, e)
        return []


def is_dir_on(entry: os.DirEntry, dev: int) -> bool:
    """A directory (not a link to one) on filesystem `dev`: mounts are not ours to walk."""
    try:
        return entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_dev == dev
    except OSError:
        return False


def remove(path: str) -> None:
    """Remove `path` and everything below it, opening locked directories first (iterative:
    how deep a tree goes is up to the agent)."""
    stack = [(path, False)]
    while stack:
        p, emptied = stack.pop()
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        except OSError as e:
            note(p, e)
            continue
        if not stat.S_ISDIR(st.st_mode):
            try:
                os.unlink(p)
            except OSError as e:
                note(p, e)
        elif not emptied:
            stack.append((p, True))
            stack.extend((entry.path, False) for entry in children(p))
        else:
            try:
                os.rmdir(p)
            except OSError as e:
                note(p, e)


def open_path(path: str) -> None:
    """Open every directory from / down to `path`: a locked /run would hide the state dir."""
    parts = path.strip("/").split("/")
    for i in range(len(parts) + 1):
        open_dir("/" + "/".join(parts[:i]))


def wipe(path: str) -> None:
    for entry in children(path):
        remove(entry.path)
    try:
        if os.listdir(path):
            problems.append(f"{path} is not empty")
    except OSError as e:
        note(path, e)


def walk(top: str):
    """Every entry below `top` on top's filesystem, parents before children (iterative: depth
    is up to the agent)."""
    try:
        dev = os.lstat(top).st_dev
    except OSError:
        return
    stack = [top]
    while stack:
        for entry in children(stack.pop()):
            yield entry
            if is_dir_on(entry, dev):
                stack.append(entry.path)


def unlink_aliases(roots: list[str]) -> None:
    for root in roots:
        for entry in walk(root):
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if any(target == f or target.startswith(f + "/") for f in FORBIDDEN):
                    try:
                        os.unlink(entry.path)
                    except OSError as e:
                        note(entry.path, e)
                    if os.path.lexists(entry.path):
                        problems.append(f"{entry.path} still leads to {target}")


def sweep_root(original: set[str]) -> None:
    dev = os.lstat("/").st_dev
    stack = ["/"]
    while stack:
        for entry in children(stack.pop()):
            if entry.path not in original:
                remove(entry.path)
                if os.path.lexists(entry.path):
                    problems.append(f"{entry.path} (added to /) could not be removed")
            elif is_dir_on(entry, dev):
                stack.append(entry.path)


def restore_modes(workdir: str, fresh: tuple[str, ...]) -> None:
    """Put back the modes of the workspace's directories we opened (a verifier may check them);
    the emptied places (`fresh`) start over as the sandbox made them, 0755 (a /tests the agent
    set to 000 must take the verifier's files), and the rest (/, /run, /tmp, HOME: the
    harness's and the agent's scratch, no task's) stay open for the verifier to pass through."""
    for path, mode in reversed(opened):  # children before parents
        if path != workdir and not path.startswith(workdir + "/"):
            continue
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                os.chmod(path, mode)
        except FileNotFoundError:
            pass  # removed meanwhile
        except OSError as e:
            note(path, e)
    for path in fresh:
        try:
            os.chmod(path, 0o755)
        except OSError as e:
            note(path, e)


def main(argv: list[str]) -> int:
    where, tests, logs, state, workdir, home = argv
    sandboxed = where == "sandboxed"
    original = set(sys.stdin.buffer.read().decode("utf-8", "surrogateescape").split("\0")) - {""}
    emptied = (tests, logs, state) + (("/dev/shm",) if sandboxed else ())
    link_roots = [workdir, "/tmp", home] if sandboxed else [workdir]
    if sandboxed:
        for path in (*emptied, *link_roots):
            open_path(path)
    for path in emptied:
        wipe(path)
    # (unsandboxed, /tmp and HOME are the host's: only the workspace is ours to look at)
    unlink_aliases(link_roots)
    if sandboxed:
        sweep_root(original)
    restore_modes(workdir.rstrip("/") or "/", emptied)
    for line in problems[:20]:
        print(line)
    return 4 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
