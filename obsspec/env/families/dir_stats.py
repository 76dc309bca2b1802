"""dir-stats: one number about the files of /app/data (`ls | wc -l`, `cat | wc -l/-w/-c`, `grep -c`).

The paths are always the same (/app/data in, /app/answer.txt out): only the question changes,
and it decides the command. This is the family a small policy can learn first, because solving it
takes reading one word of the instruction rather than copying names out of it; the other
families build on the same commands with names to copy.
"""

from __future__ import annotations

import random

from obsspec.env.families._text_helpers import FILE_STEMS, WORDS, verify_lines
from obsspec.env.task import Task

NAME = "dir-stats"

LEVELS = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"]

# question -> (phrasings, the command that answers it)
QUESTIONS = {
    "files": (["How many files are there in /app/data?",
               "Count the files in /app/data."],
              "ls data | wc -l > answer.txt"),
    "lines": (["How many lines do the files in /app/data contain in total?",
               "Count all lines of all files in /app/data together."],
              "cat data/* | wc -l > answer.txt"),
    "words": (["How many whitespace-separated words do the files in /app/data contain in total?",
               "Count all words of all files in /app/data together."],
              "cat data/* | wc -w > answer.txt"),
    "bytes": (["How many bytes do the files in /app/data hold in total?",
               "What is the total size in bytes of the files in /app/data?"],
              "cat data/* | wc -c > answer.txt"),
    "errors": (["How many lines of the files in /app/data contain the word `ERROR`?",
                "Count the lines with `ERROR` in all files in /app/data together."],
               "cat data/* | grep -c ERROR > answer.txt"),
}


def _line(rng: random.Random) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
    return f"{rng.choice(LEVELS)} {words}"


def generate(rng: random.Random, task_id: str) -> Task:
    names = sorted({rng.choice(FILE_STEMS) for _ in range(rng.randint(2, 8))})
    files = {f"data/{name}.{rng.choice(['log', 'txt'])}":
             "\n".join(_line(rng) for _ in range(rng.randint(1, 25))) + "\n" for name in names}
    text = "".join(files[p] for p in sorted(files))
    kind = rng.choice(sorted(QUESTIONS))
    phrasings, act = QUESTIONS[kind]
    expected = {"files": len(files), "lines": text.count("\n"), "words": len(text.split()),
                "bytes": len(text.encode()),
                "errors": sum("ERROR" in line for line in text.splitlines())}[kind]
    ask = rng.choice(phrasings) + " Write just the number to /app/answer.txt."
    return Task(task_id=task_id, kind=kind, family=NAME, instruction=ask, files=files,
                verify=verify_lines("answer.txt", [str(expected)]),
                solution=["ls -l data", act, "cat answer.txt"])
