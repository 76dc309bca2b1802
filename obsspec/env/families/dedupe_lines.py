"""dedupe-lines: remove duplicate lines (`awk '!seen[$0]++'`, `sort -u`, `cat a b | ...`).

Variants: dedupe one file into a new file keeping the first occurrence of each line in its
original order, do the same in place, merge several files in a given order keeping first
occurrences, or merge them into one sorted list without duplicates. Near duplicates (another
case, another number) are distinct lines and must be kept.
"""

from __future__ import annotations

import random

from obsspec.env.families._text_helpers import CITIES, FIRST_NAMES, WORDS, verify_lines
from obsspec.env.task import Task

NAME = "dedupe-lines"


def _items(rng: random.Random, kind: str, n: int) -> list[str]:
    made: list[str] = []
    while len(made) < n:
        if kind == "emails":
            x = f"{rng.choice(FIRST_NAMES)}{rng.choice(['', str(rng.randint(1, 9))])}@" \
                f"{rng.choice(['example.com', 'mail.org', 'corp.net'])}"
        elif kind == "hosts":
            x = f"{rng.choice(WORDS)}-{rng.randint(1, 4)}.{rng.choice(CITIES)}.lan"
        else:
            x = f"{rng.choice(WORDS)}=={rng.randint(0, 3)}.{rng.randint(0, 9)}"
        if made and rng.random() < 0.15:
            x = made[-1].capitalize()  # differs from its twin only by case: still distinct
        if x not in made:
            made.append(x)
    return made


def _with_dups(rng: random.Random, items: list[str]) -> list[str]:
    seq = list(items)
    for _ in range(rng.randint(2, max(3, len(items)))):
        i = rng.randrange(len(seq))
        seq.insert(rng.randint(i + 1, len(seq)), seq[i])
    return seq


def generate(rng: random.Random, task_id: str) -> Task:
    kind = rng.choice(["emails", "hosts", "packages"])
    noun = {"emails": "e-mail addresses", "hosts": "host names", "packages": "package pins"}[kind]
    mode = rng.choice(["first", "inplace", "merge", "merge_sorted"])
    if mode in ("first", "inplace"):
        items = _items(rng, kind, rng.randint(6, 25))
        path = {"emails": "subscribers.txt", "hosts": "hosts.txt",
                "packages": "requirements.txt"}[kind]
        files = {path: "\n".join(_with_dups(rng, items)) + "\n"}
        expected = items
        if mode == "first":
            out = rng.choice(["unique.txt", "deduped.txt", "clean.txt"])
            ask = (f"/app/{path} lists {noun}, one per line, with some repeated. Write the list "
                   f"without duplicates to /app/{out}: keep the first occurrence of each line, in "
                   f"the original order. Lines that differ in any way (even only in case) are "
                   f"different.")
            act = f"awk '!seen[$0]++' {path} > {out}"
        else:
            out = path
            ask = (f"Remove the duplicate lines from /app/{path} ({noun}, one per line) in place, "
                   f"keeping the first occurrence of each line and the original order. Lines that "
                   f"differ in any way (even only in case) are different.")
            act = f"awk '!seen[$0]++' {path} > {path}.new && mv {path}.new {path}"
        look = f"wc -l {path}; head {path}"
    else:
        k = rng.randint(2, 3)
        items = _items(rng, kind, rng.randint(10, 30))
        names = rng.sample(["a.txt", "b.txt", "old.txt", "new.txt", "extra.txt", "jan.txt",
                            "feb.txt"], k)
        parts = [_with_dups(rng, rng.sample(items, rng.randint(3, len(items) // 2 + 2)))
                 for _ in names]
        files = {f"lists/{n}": "\n".join(p) + "\n" for n, p in zip(names, parts)}
        seen: list[str] = []
        for line in (x for p in parts for x in p):
            if line not in seen:
                seen.append(line)
        out = rng.choice(["merged.txt", "all.txt", "combined.txt"])
        paths = [f"/app/lists/{n}" for n in names]
        order = ", ".join(paths[:-1]) + " and " + paths[-1]
        ask = f"Merge the {noun} in {order} (one per line) into /app/{out} without duplicates"
        src = " ".join(f"lists/{n}" for n in names)
        if mode == "merge":
            expected = seen
            ask += (", keeping the first occurrence of each line: the lines of the files in that "
                    "order, skipping any line already written.")
            act = f"cat {src} | awk '!seen[$0]++' > {out}"
        else:
            expected = sorted(seen)
            ask += ", sorted."
            act = f"sort -u {src} > {out}"
        ask += " Lines that differ in any way (even only in case) are different."
        look = f"wc -l {src}"
    return Task(task_id=task_id, family=NAME, instruction=ask, files=files,
                verify=verify_lines(out, expected, squeeze=False,
                                    order="sorted" if mode == "merge_sorted" else "exact"),
                solution=[look, act, f"cat {out}"])
