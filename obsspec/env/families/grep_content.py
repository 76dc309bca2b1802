"""grep-content: which files contain a string or match a pattern (`grep -l`, `-L`, `-i`, `^`).

Every file holds filler text; some hold the target, others near misses (a neighbouring number,
a different separator, the wrong case, or the keyword in the middle of a line when the task asks
for lines that start with it). The answer is the sorted list of matching files.
"""

from __future__ import annotations

import random

from obsspec.env.families._text_helpers import FILE_STEMS, FIRST_NAMES, WORDS, one_of, verify_lines
from obsspec.env.task import Task

NAME = "grep-content"


def _target(rng: random.Random) -> tuple[str, list[str]]:
    """A target string and near misses that do not contain it."""
    n = rng.randint(1, 98)
    kind = rng.choice(["host", "code", "user"])
    if kind == "host":
        w = rng.choice(WORDS)
        return f"{w}-{n:02d}.internal", [f"{w}-{n + 1:02d}.internal", f"{w}{n:02d}.internal",
                                         f"{w}-{n:02d}.external"]
    if kind == "code":
        return f"ERR-{n:04d}", [f"ERR-{n + 1:04d}", f"ERR {n:04d}", f"ERR_{n:04d}"]
    name, other = rng.sample(FIRST_NAMES, 2)
    return f"user={name}", [f"user={other}", f"username={name}", f"user: {name}"]


def _filler(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))


def generate(rng: random.Random, task_id: str) -> Task:
    folder = one_of(rng, ["notes", "logs", "docs", "reports", "mail", "configs"])
    mode = rng.choice(["fixed", "ci", "start", "absent"])
    if mode == "start":
        target = rng.choice(["FATAL", "ERROR", "WARN", "PANIC"])
        misses = [f"INFO retry after {target} cleared", f"DEBUG saw {target} earlier",
                  f"{target.lower()}: not really", f" {target} indented"]
    else:
        target, misses = _target(rng)
        if mode != "ci":
            misses.append(target.upper() if target.upper() != target else target.lower())
    ext = "log" if folder == "logs" else "txt"
    names = sorted({f"{rng.choice(FILE_STEMS)}_{rng.randint(1, 30)}.{ext}"
                    for _ in range(rng.randint(8, 14))})
    hits = set(rng.sample(names, rng.randint(2, max(2, len(names) // 2))))
    files: dict[str, str] = {}
    for name in names:
        lines = [_filler(rng) for _ in range(rng.randint(3, 9))]
        if name in hits:
            hit = target if mode != "ci" or rng.random() < 0.5 else target.upper()
            line = (f"{hit}: {_filler(rng)}" if mode == "start"
                    else f"{_filler(rng)} {hit} {rng.choice(WORDS)}")
            lines.insert(rng.randint(0, len(lines)), line)
        if rng.random() < 0.7:
            miss = rng.choice(misses)
            miss = miss if mode == "start" else f"{_filler(rng)} {miss}"
            lines.insert(rng.randint(0, len(lines)), miss)
        files[f"{folder}/{name}"] = "\n".join(lines) + "\n"

    expected = sorted(set(names) - hits if mode == "absent" else hits)
    with_dir = rng.random() < 0.5
    if with_dir:
        expected = [f"{folder}/{n}" for n in expected]
    what = {"fixed": f"contain the exact text `{target}` (case-sensitive)",
            "ci": f"contain `{target}`, ignoring case",
            "start": f"have at least one line that begins with `{target}` (case-sensitive)",
            "absent": f"do NOT contain the text `{target}` anywhere"}[mode]
    form = (f"their paths relative to /app (like `{folder}/name`)" if with_dir
            else "just their file names (no directory)")
    out = rng.choice(["answer.txt", "hits.txt", "files.txt"])
    instruction = rng.choice([f"Which files in /app/{folder} {what}?",
                              f"Find the files in the /app/{folder} directory that {what}."])
    instruction += f" Write {form}, one per line, sorted, to /app/{out}."
    flag = {"fixed": "-lF", "ci": "-liF", "start": "-l", "absent": "-LF"}[mode]
    pattern = f"^{target}" if mode == "start" else target
    grep = f"grep {flag} '{pattern}'"
    act = (f"{grep} {folder}/* | sort > {out}" if with_dir
           else f"cd {folder} && {grep} * | sort > ../{out} && cd ..")
    peek = f"grep -rn{'i' if mode == 'ci' else ''} '{target}' {folder} | head -30"
    solution = [f"ls {folder}", peek, act, f"cat {out}"]
    return Task(task_id=task_id, kind=mode, family=NAME, instruction=instruction, files=files,
                verify=verify_lines(out, expected, order="sorted"), solution=solution)
