"""word-frequency: the top-N most frequent values (`sort | uniq -c | sort -rn | head`).

The values come one per line, as words of free text, or as one column of a CSV file. Counts of the
top N are distinct and above every other count, so the ranking has no ties. The answer is the
ranking, most frequent first, either `value count` or just the values.
"""

from __future__ import annotations

import random

from obsspec.env.families._text_helpers import (CITIES, FIRST_NAMES, WORDS, distinct_counts,
                                                one_of, verify_lines)
from obsspec.env.task import Task

NAME = "word-frequency"


def generate(rng: random.Random, task_id: str) -> Task:
    mode = rng.choice(["lines", "words", "column"])
    pool = {"lines": FIRST_NAMES, "words": WORDS, "column": CITIES}[mode]
    top = rng.randint(3, 6)
    items = rng.sample(pool, top + rng.randint(3, 8))
    counts = distinct_counts(rng, top, 7, 30)
    counts += [rng.randint(1, counts[-1] - 1) for _ in items[top:]]
    values = [v for v, c in zip(items, counts) for _ in range(c)]
    rng.shuffle(values)

    if mode == "lines":
        path = one_of(rng, ["logins.txt", "visitors.txt", "senders.txt", "users.log"])
        text = "\n".join(values) + "\n"
        noun, where = "user names", f"/app/{path} (one name per line)"
        act = f"sort {path} | uniq -c | sort -rn | head -{top}"
    elif mode == "words":
        path = one_of(rng, ["essay.txt", "story.txt", "notes.txt", "transcript.txt"])
        lines, i = [], 0
        while i < len(values):
            n = rng.randint(4, 11)
            lines.append(" ".join(values[i:i + n]))
            i += n
        text = "\n".join(lines) + "\n"
        noun, where = "words", f"/app/{path} (lower-case words separated by single spaces)"
        act = f"tr ' ' '\\n' < {path} | sort | uniq -c | sort -rn | head -{top}"
    else:
        path = one_of(rng, ["orders.csv", "shipments.csv", "bookings.csv"])
        rows = [f"{1000 + i},{v},{rng.randint(5, 500)}" for i, v in enumerate(values)]
        text = "id,city,amount\n" + "\n".join(rows) + "\n"
        noun, where = "cities", f"the `city` column of /app/{path} (a CSV file with a header line)"
        act = f"tail -n +2 {path} | cut -d, -f2 | sort | uniq -c | sort -rn | head -{top}"

    with_counts = rng.random() < 0.6
    out = rng.choice(["top.txt", "answer.txt", f"top{top}.txt"])
    ask = rng.choice([f"Find the {top} most frequent {noun} in {where}.",
                      f"Which {top} {noun} occur most often in {where}?"])
    if with_counts:
        ask += (f" Write them to /app/{out}, most frequent first, one per line as `<value> "
                f"<count>` (separated by a space).")
        expected = [f"{v} {c}" for v, c in zip(items[:top], counts[:top])]
        act += f" | awk '{{print $2, $1}}' > {out}"
    else:
        ask += (f" Write just the {noun} (no counts) to /app/{out}, most frequent first, one "
                f"per line.")
        expected = items[:top]
        act += f" | awk '{{print $2}}' > {out}"
    return Task(task_id=task_id, family=NAME, instruction=ask, files={path: text},
                verify=verify_lines(out, expected), solution=[f"head {path}", act, f"cat {out}"])
