"""count-lines: line, word and match counts (`wc -l`, `wc -w`, `grep -c`, loops over files).

Variants: total lines over the files of one extension (others are decoys), lines of one file that
contain a word, whitespace-separated words in one file, and a per-file `name count` table.
Every file ends with a newline and has no blank lines, so "lines" is unambiguous.
"""

from __future__ import annotations

import random

from obsspec.env.families._text_helpers import FILE_STEMS, WORDS, one_of, verify_lines
from obsspec.env.task import Task

NAME = "count-lines"

LEVELS = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"]


def _line(rng: random.Random) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7)))
    return f"{rng.choice(LEVELS)} {rng.choice(FILE_STEMS)}: {words}"


def generate(rng: random.Random, task_id: str) -> Task:
    folder = one_of(rng, ["logs", "data", "text", "input", "corpus"])
    ext, other = rng.sample(["log", "txt", "csv", "md", "out"], 2)
    names = sorted({rng.choice(FILE_STEMS) for _ in range(rng.randint(3, 7))})
    files: dict[str, str] = {}
    for name in names:
        files[f"{folder}/{name}.{ext}"] = "\n".join(
            _line(rng) for _ in range(rng.randint(3, 60))) + "\n"
    for name in rng.sample(FILE_STEMS, 2):  # decoys with another extension
        files[f"{folder}/{name}.{other}"] = "\n".join(
            _line(rng) for _ in range(rng.randint(3, 30))) + "\n"
    target = f"{folder}/{rng.choice(names)}.{ext}"
    body = files[target].splitlines()
    mode = rng.choice(["total", "matching", "words", "table"])
    out = rng.choice(["answer.txt", "count.txt", "result.txt"])
    pick = [p for p in sorted(files) if p.endswith("." + ext)]

    if mode == "total":
        expected = [str(sum(files[p].count("\n") for p in pick))]
        ask = f"How many lines are there in total across all `*.{ext}` files in /app/{folder}?"
        act = f"cat {folder}/*.{ext} | wc -l > {out}"
        look = f"wc -l {folder}/*"
    elif mode == "matching":
        word = rng.choice(["ERROR", "WARN", "DEBUG"])
        expected = [str(sum(word in line for line in body))]
        ask = (f"How many lines of /app/{target} contain the word `{word}` (case-sensitive)?")
        act = f"grep -c '{word}' {target} > {out}"
        look = f"head -20 {target}"
    elif mode == "words":
        expected = [str(sum(len(line.split()) for line in body))]
        ask = f"How many whitespace-separated words does /app/{target} contain?"
        act = f"wc -w < {target} > {out}"
        look = f"head -5 {target}"
    else:
        expected = [f"{p.split('/')[-1]} {files[p].count(chr(10))}" for p in pick]
        ask = (f"For every `*.{ext}` file in /app/{folder}, count its lines. Write one line per "
               f"file, `<file name> <line count>` (name without the directory, separated by a "
               f"space), sorted by file name, to /app/{out}.")
        act = (f"cd {folder} && for f in *.{ext}; do echo \"$f $(wc -l < \"$f\")\"; done "
               f"| sort > ../{out} && cd ..")
        look = f"ls -l {folder}"
    if mode != "table":
        ask += rng.choice([f" Write just the number to /app/{out}.",
                           f" Put the number (digits only) in /app/{out}."])
    return Task(task_id=task_id, family=NAME, instruction=ask, files=files,
                verify=verify_lines(out, expected, order="sorted" if mode == "table" else "exact"),
                solution=[look, act, f"cat {out}"])
