"""Reading a task folder someone else wrote, safely: every problem is a `Skip` with a one-line
reason and a kind (the import report counts them), never an exception that ends the import.

    check_tree(folder)          # before anything is read: links, sizes, depth, names
    read_text(folder, "task.toml"), read_tree(folder, "tests"), executable_files(folder, "tests")

A folder is refused when it holds a symlink leaving it (or to a directory, or to nothing), a FIFO
or device, more than MAX_TASK_BYTES of files (sizes from stat: a sparse terabyte is never read),
directories nested deeper than MAX_DEPTH (1,100 levels overflowed os.walk's recursion) or more
than MAX_ENTRIES entries, a name that is not UTF-8 or holds a control character (names are shown
on terminals and written in tar headers). A file of a task's trees (`read_tree`) is text, or, when
it is binary, not UTF-8 or over TEXT_MAX, a `Blob` (its sha256, size and path: obsspec/env/task.py).
task.toml, instruction.md, the Dockerfile and the scripts are read as text (`read_text`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from obsspec.env.task import Blob

MAX_TASK_BYTES = 256 * 1024 * 1024  # a task folder's files in all (images, databases, archives)
TEXT_MAX = 1024 * 1024                # a larger file is a blob even when it is text
MAX_DEPTH = 32          # directory levels in a task folder
MAX_ENTRIES = 5_000     # files and directories in a task folder


class Skip(Exception):
    """This task folder cannot be imported; the message says why, in one line, and `kind` names
    the class of reason (the import report counts tasks per kind)."""

    def __init__(self, message: str, kind: str = "files"):
        super().__init__(message)
        self.kind = kind


def one_line(text: str, limit: int = 300) -> str:
    """A reason fit for one terminal line: control characters escaped, at most `limit` characters."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _walk(base: Path):
    """(dirpath, dirnames, filenames) under `base`, top-down, without recursion (a deep tree
    overflowed os.walk's stack), never following directory links; a tree deeper than MAX_DEPTH
    or with more than MAX_ENTRIES entries is a skip."""
    stack, entries = [(str(base), 0)], 0
    while stack:
        top, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Skip(f"directories nested more than {MAX_DEPTH} deep")
        try:
            with os.scandir(top) as it:
                listing = sorted(it, key=lambda e: e.name)
        except OSError as e:
            raise Skip(f"cannot read {os.path.relpath(top, base)}: {e.strerror}") from None
        entries += len(listing)
        if entries > MAX_ENTRIES:
            raise Skip(f"more than {MAX_ENTRIES} files and directories")
        dirs = [e.name for e in listing if e.is_dir(follow_symlinks=False)]
        yield top, dirs, [e.name for e in listing if not e.is_dir(follow_symlinks=False)]
        stack += [(os.path.join(top, d), depth + 1) for d in reversed(dirs)]


def check_tree(folder: Path) -> None:
    """Skip folders with symlinks leaving the folder, or more than MAX_TASK_BYTES of files,
    names that are not UTF-8 or hold control characters, too deep or too many entries."""
    total = 0
    for dirpath, dirnames, filenames in _walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, folder)
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                raise Skip(f"{rel!r}: a file name that is not UTF-8") from None
            if not name.isprintable():  # (a name is shown on terminals and written in tar headers)
                raise Skip(f"{rel!r}: a file name with a control character")
            if os.path.islink(path):
                target = os.path.realpath(path)
                if os.path.commonpath([target, folder]) != str(folder):
                    raise Skip(f"{rel} is a symlink pointing outside the task folder "
                                f"(to {os.readlink(path)})")
                if not os.path.isfile(target):  # a directory link could loop; a broken one is a bug
                    raise Skip(f"{rel} is a symlink to a directory or to nothing (not supported)")
                path = target  # read once per link: its size counts each time
            if name in filenames:
                st = os.stat(path, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):  # a FIFO hung the import, /dev/zero's twin ate memory
                    raise Skip(f"{rel} is not a regular file (a FIFO, socket or device)")
                total += st.st_size  # (stat only: a sparse 1 TB file is never read)
    if total > MAX_TASK_BYTES:
        raise Skip(f"files too large ({total / 2**20:.1f} MB > "
                    f"{MAX_TASK_BYTES // 2**20} MB total)")


def file_names(base: Path) -> list[str]:
    """Relative paths of every file under `base`, sorted."""
    found = []
    for dirpath, _, filenames in _walk(base) if base.is_dir() else ():
        found += [os.path.relpath(os.path.join(dirpath, n), base) for n in filenames]
    return sorted(found)


def executable_files(folder: Path, sub: str) -> list[str]:
    """Paths (relative to sub) of the files under folder/sub that someone may execute."""
    return [rel for rel in file_names(folder / sub) if os.stat(folder / sub / rel).st_mode & 0o111]


def read_tree(folder: Path, sub: str, exclude: set[str] | tuple = ()) -> dict[str, str | Blob]:
    """Every file under folder/sub, as text or as a blob, keyed by its path relative to sub."""
    return {rel: read_file(folder, f"{sub}/{rel}")
            for rel in file_names(folder / sub) if rel not in exclude}


def read_file(folder: Path, rel: str) -> str | Blob:
    """A small UTF-8 text file as text; any other file as a blob of its bytes."""
    path = folder / rel
    try:
        if path.stat().st_size <= TEXT_MAX:
            data = path.read_bytes()
            if b"\0" not in data:
                try:
                    return data.decode("utf-8")
                except UnicodeDecodeError:
                    pass
        return Blob.of(os.path.realpath(path))
    except OSError as e:
        raise Skip(f"cannot read {rel}: {e.strerror}") from None


def read_text(folder: Path, rel: str) -> str:
    try:
        data = (folder / rel).read_bytes()
    except OSError as e:
        raise Skip(f"cannot read {rel}: {e.strerror}") from None
    if b"\0" in data:
        raise Skip(f"{rel} is a binary file (tasks hold text files only)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Skip(f"{rel} is not UTF-8 text (byte {e.start})") from None
