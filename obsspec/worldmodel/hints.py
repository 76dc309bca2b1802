"""Workspace hints: after each call, the spans of the task's initial workspace that the command
names, for the world model to copy from right where it writes (`world_model.hint_tokens`).

    hint = command_hints(fmt, snapshot_text, budget=256)   # command -> ids (empty: nothing named)
    hint("cat data/a.txt")   # ids of "<|im_start|>system\\n<workspace>\\n==> data/a.txt <==\\n...</workspace><|im_end|>\\n"

A tiny world model learns to copy a span placed next to the call, but not to find it in a whole
snapshot ahead of the context (docs/WORLDMODEL.md, "Copying listings"). The spans are those of the
rendered snapshot (obsspec/worldmodel/snapshot.py `render`, parsed by `copies.spans`): a
folder's block of the `ls -lR` listing for a folder the command names (the top folder for a bare
`ls`, every folder below it too for a recursive command), a file's section for a file it names,
globs matched against the workspace's paths. Paths are read from the task's working folder: after
an earlier `cd`, a relative path names what it named before (a hint may then show the wrong
span, never a wrong observation). A hint is a pure function of the command and the
task's initial workspace, so the same hints are rebuilt after every past call of a history, in
training rows and in drafts alike (`tokens.WorldView`). It shows the workspace as it was before
the first command: a file the episode has changed no longer matches its hint, which the world
model learns from its rows. It only changes what the world model reads: drafts are still
verified token for token, so speculation stays lossless with hints on or off.
"""

from __future__ import annotations

import fnmatch
import functools
import shlex
from collections.abc import Callable

from obsspec.worldmodel.copies import spans
from obsspec.worldmodel.snapshot import snapshot_ids

# commands that print what lies below a folder, not only in it
_RECURSIVE = {"find", "du", "tree", "grep", "rgrep"}
_RECURSIVE_FLAGS = ("-R", "-r", "--recursive")
_LISTS = {"ls", "find", "du", "tree"}  # with no folder named, these look at the working folder
_PATTERN_OPTIONS = {"-name", "-iname", "-path", "-ipath", "-regex", "-e", "--include", "--exclude"}


def hint_text(command: str, folders: dict[str, str], files: dict[str, str]) -> str:
    """The spans `command` names, in the order it names them, each once ("" when none).
    `folders` and `files` are `copies.spans` of the task's rendered snapshot."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:  # unbalanced quotes: the shell will say so, and no span helps
        return ""
    if not words:
        return ""
    recursive = words[0] in _RECURSIVE or any(w in _RECURSIVE_FLAGS or (w.startswith("-") and not w.startswith("--")
                                                                      and "R" in w) for w in words[1:])
    named: list[str] = []

    def folder(path: str) -> None:
        below = [f for f in folders if recursive and (not path or f.startswith(path + "/"))]
        for f in [path, *sorted(below)]:
            if f in folders and folders[f] not in named:
                named.append(folders[f])

    looked = False
    for before, word in zip(words, words[1:]):
        if word.startswith("-") or word in ("|", "&&", "||", ";", ">", ">>", "<") or before in _PATTERN_OPTIONS:
            continue
        path = _relative(word)
        if path is None:
            continue
        if any(c in path for c in "*?["):
            for f in sorted(files):
                if _glob(f, path) and files[f] not in named:
                    named.append(files[f])
            continue
        if path in folders:
            folder(path)
            looked = True
        elif path in files and files[path] not in named:
            named.append(files[path])
    if not looked and words[0] in _LISTS and not named:
        folder("")
    return "".join(named)


def _glob(path: str, pattern: str) -> bool:
    """Whether the shell's glob `pattern` names `path` (a `*` never crosses a `/`)."""
    parts, pats = path.split("/"), pattern.split("/")
    return len(parts) == len(pats) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pats))


def _relative(word: str) -> str | None:
    """A word as a path relative to the working folder ("" for it), or None for one outside it."""
    if word.startswith(("/", "~", "$")):
        return None
    path = word.rstrip("/")
    while path.startswith("./"):
        path = path[2:]
    return "" if path in (".", "") else path


def command_hints(fmt, text: str, budget: int) -> Callable[[str], list[int]]:
    """command -> the hint's ids for the task whose rendered snapshot is `text`: `hint_text` framed
    as a system turn of at most `budget` tokens (cut with a visible marker), or [] when the
    command names no span. Cached per command."""
    folders, files = spans(text)

    @functools.lru_cache(maxsize=512)
    def hint(command: str) -> tuple[int, ...]:
        body = hint_text(command, folders, files)
        return tuple(snapshot_ids(fmt, body, budget)) if body else ()

    return lambda command: list(hint(command))
