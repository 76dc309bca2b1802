"""Command classes: which kind of shell command produced an observation, for per-class figures.

    command_class("cat notes.txt | sort", "b\\na\\n\\n(exit_code=0)")   -> "cat"
    command_class("mv a b", "(no output)\\n(exit_code=0)")             -> "no_output"
    command_class("cat nope", "cat: nope: No such ...\\n(exit_code=1)") -> "error"

The class is decided by the observation first (no output at all, or a non-zero exit code: those
are where a world model's job differs most), then by the first program of the command line
(after `cd DIR &&` and variable assignments). Hit rates per class show *what* a world model
predicts, not only how often.
"""

from __future__ import annotations

import re

from obsspec import chat

# program -> class; anything else is "other"
_CLASSES = {
    "ls": "ls", "tree": "ls", "stat": "ls", "du": "ls",
    "cat": "cat", "head": "cat", "tail": "cat", "less": "cat", "nl": "cat",
    "grep": "grep", "egrep": "grep", "rg": "grep",
    "find": "find",
    "wc": "wc",
    "awk": "text", "sed": "text", "cut": "text", "sort": "text", "uniq": "text", "tr": "text",
    "join": "text", "paste": "text", "comm": "text", "column": "text", "jq": "text",
    "python3": "python", "python": "python",
    "tar": "archive", "unzip": "archive", "zip": "archive", "gzip": "archive", "zcat": "archive",
    "sqlite3": "sqlite",
    "echo": "echo", "printf": "echo",
}
CLASSES = (*sorted(set(_CLASSES.values())), "no_output", "error", "other")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
_EXIT = re.compile(r"\(exit_code=(-?\d+)\)$")


def first_program(command: str) -> str:
    """The first program a command line runs, skipping `cd X &&` / `cd X;` and assignments."""
    words = command.replace("&&", " && ").replace(";", " ; ").split()
    i = 0
    while i < len(words):
        if words[i] == "cd":
            i += 1
            while i < len(words) and words[i] not in ("&&", ";"):
                i += 1
            i += 1
        elif _ASSIGNMENT.match(words[i]) or words[i] in ("sudo", "time", "env"):
            i += 1
        else:
            return words[i].rsplit("/", 1)[-1]
    return ""


def program_class(command: str) -> str:
    """The class of a command before its output is known: its first program's (or "other")."""
    return _CLASSES.get(first_program(command), "other")


def command_class(command: str, body: str) -> str:
    """The class of one step: `no_output`, `error` (non-zero exit), or the program's class."""
    if body.startswith(chat.NO_OUTPUT + "\n"):
        return "no_output"
    exit_code = _EXIT.search(body)
    if exit_code is None or exit_code.group(1) != "0":
        return "error"
    return program_class(command)
