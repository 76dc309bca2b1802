"""Reference solutions with one mistake in them: what a sampled policy's failures look like.

    commands = with_mistake(task.solution, random.Random(seed))
    record = await run_scripted(task, commands, sandbox, verify=False)   # the real error messages

A policy sampled at temperature > 0 doubles a `>`, drops a word, swaps two, repeats one in the
wrong place, or misspells a name. Then bash or the program prints an error, and the steps after it
see the consequences (`cat: answer.txt: No such file or directory`). A world model trained only on
reference solutions has seen none of that and drafts `(no output)` for a failing command. Running
reference solutions with one such edit in a real sandbox gives it those messages, real ones, for
any suite whose tasks have solutions, without a policy in the loop.

The edits are the same for every program and every suite: shell words (split on whitespace) are
duplicated, deleted, swapped with a neighbour, replaced by another word of the same command, or
lose one character. They only rearrange what the reference solution already contains, so the
commands they make do nothing the solution could not; they run in the task's sandbox like any
other command.
"""

from __future__ import annotations

import random

EDITS = ("duplicate", "delete", "swap", "replace", "typo")


def mistake(command: str, rng: random.Random) -> str:
    """`command` with one edit (EDITS, picked by `rng`); a different string whenever the edit
    can make one (a one-word command of one character cannot lose it, say), else `command`."""
    words = command.split()
    if not words:
        return command
    for _ in range(8):  # an edit can be a no-op (swapping two equal words): try another
        edited = _edit(words, rng.choice(EDITS), rng)
        if edited and edited != words:
            return " ".join(edited)
    return command


def _edit(words: list[str], kind: str, rng: random.Random) -> list[str]:
    i = rng.randrange(len(words))
    if kind == "duplicate":
        return words[:i + 1] + [words[i]] + words[i + 1:]
    if kind == "delete":
        return words[:i] + words[i + 1:]
    if kind == "swap" and len(words) > 1:
        i = min(i, len(words) - 2)
        return words[:i] + [words[i + 1], words[i]] + words[i + 2:]
    if kind == "replace" and len(words) > 1:
        return words[:i] + [rng.choice(words[:i] + words[i + 1:])] + words[i + 1:]
    if kind == "typo" and len(words[i]) > 1:
        j = rng.randrange(len(words[i]))
        return words[:i] + [words[i][:j] + words[i][j + 1:]] + words[i + 1:]
    return words


def with_mistake(solution: list[str], rng: random.Random) -> list[str]:
    """`solution` with one of its commands (picked by `rng`) carrying one `mistake`."""
    if not solution:
        return list(solution)
    i = rng.randrange(len(solution))
    return [mistake(c, rng) if j == i else c for j, c in enumerate(solution)]
