"""text-join: combine two files on a key (`join`, `paste`, `awk 'NR == FNR {...}'`).

Variants: inner join of two unsorted key/value files (only keys in both), left join filling
missing values with NA, pasting two line-aligned files side by side, and enriching each record
of one file with a looked-up value from another (many-to-one, original order kept).
"""

from __future__ import annotations

import random

from obsspec.env.families._text_helpers import CITIES, FIRST_NAMES, WORDS, verify_lines
from obsspec.env.task import Task

NAME = "text-join"

FIELDS = {"name": FIRST_NAMES, "city": CITIES, "team": WORDS,
          "plan": ["free", "basic", "pro", "business", "enterprise"]}
PLURAL = {"name": "names", "city": "cities", "team": "teams", "plan": "plans"}


def generate(rng: random.Random, task_id: str) -> Task:
    mode = rng.choice(["inner", "left", "paste", "enrich"])
    sep = rng.choice([",", " "]) if mode in ("inner", "left") else ","
    sep_name = "a comma" if sep == "," else "a single space"
    f1, f2 = rng.sample(sorted(FIELDS), 2)
    prefix = rng.choice(["u", "id", "c", "emp"])
    ids = [f"{prefix}{n:03d}" for n in rng.sample(range(1, 1000), rng.randint(8, 20))]
    v1 = {i: rng.choice(FIELDS[f1]) for i in ids}
    v2 = {i: rng.choice(FIELDS[f2]) for i in ids}
    a, b = f"{PLURAL[f1]}.txt", f"{PLURAL[f2]}.txt"
    out = rng.choice(["joined.txt", "merged.txt", "combined.txt", "report.txt"])

    if mode in ("inner", "left"):
        in_a = sorted(rng.sample(ids, rng.randint(5, len(ids) - 2)))
        in_b = sorted(rng.sample(ids, rng.randint(5, len(ids) - 2)))
        if not set(in_a) & set(in_b):
            in_b = sorted(in_b + [in_a[-1]])
        if mode == "left" and set(in_a) <= set(in_b):  # make sure some key needs the NA filler
            in_b.remove(in_a[0])
        rows_a, rows_b = [f"{i}{sep}{v1[i]}" for i in in_a], [f"{i}{sep}{v2[i]}" for i in in_b]
        rng.shuffle(rows_a)
        rng.shuffle(rows_b)
        files = {a: "\n".join(rows_a) + "\n", b: "\n".join(rows_b) + "\n"}
        keys = [i for i in in_a if mode == "left" or i in in_b]
        expected = [f"{i},{v1[i]},{v2[i] if i in in_b else 'NA'}" for i in keys]
        which = ("for every id that appears in both files" if mode == "inner" else
                 f"for every id in /app/{a}, using `NA` as the {f2} when /app/{b} has no line "
                 f"for it")
        ask = (f"Each line of /app/{a} holds an id and a {f1}, and each line of /app/{b} an id and "
               f"a {f2}, separated by {sep_name} (no header, not sorted). Produce /app/{out} "
               f"with one line `id,{f1},{f2}` "
               f"(comma-separated) {which}, sorted by id.")
        t = "-t, " if sep == "," else ""
        k = "-t, -k1,1" if sep == "," else "-k1,1"
        opts = "" if mode == "inner" else "-a1 -e NA -o 0,1.2,2.2 "
        act = f"join {t}{opts}<(sort {k} {a}) <(sort {k} {b})"
        act += f" > {out}" if sep == "," else f" | tr ' ' ',' > {out}"
        verify = verify_lines(out, expected, order="sorted", squeeze=False)
        look = f"head -3 {a} {b}"
    elif mode == "paste":
        files = {a: "\n".join(v1[i] for i in ids) + "\n", b: "\n".join(v2[i] for i in ids) + "\n"}
        delim, dname = rng.choice([(",", "a comma"), (":", "a colon"), (";", "a semicolon")])
        ask = (f"Line N of /app/{a} and line N of /app/{b} belong to the same record. Write "
               f"/app/{out} where line N is `<{f1}>{delim}<{f2}>` (the two lines joined by "
               f"{dname}), for every line, in the original order.")
        expected = [f"{v1[i]}{delim}{v2[i]}" for i in ids]
        act = f"paste -d'{delim}' {a} {b} > {out}"
        verify = verify_lines(out, expected, squeeze=False)
        look = f"wc -l {a} {b}; head -3 {a} {b}"
    else:
        orders = [(f"o{n}", rng.choice(ids), rng.randint(5, 500))
                  for n in sorted(rng.sample(range(1000, 9999), rng.randint(8, 25)))]
        files = {"orders.csv": "\n".join(f"{o},{u},{amt}" for o, u, amt in orders) + "\n",
                 a: "\n".join(f"{i},{v1[i]}" for i in ids) + "\n"}
        ask = (f"/app/orders.csv has lines `order_id,customer_id,amount` and /app/{a} has lines "
               f"`customer_id,{f1}` (no headers). Write /app/{out} with one line per order, in the "
               f"same order as orders.csv, as `order_id,{f1},amount` (the customer's {f1} in place "
               f"of the customer id).")
        expected = [f"{o},{v1[u]},{amt}" for o, u, amt in orders]
        act = (f"awk -F, -v OFS=, 'NR == FNR {{v[$1] = $2; next}} {{print $1, v[$2], $3}}' "
               f"{a} orders.csv > {out}")
        verify = verify_lines(out, expected, squeeze=False)
        look = f"head -3 orders.csv {a}"
    return Task(task_id=task_id, family=NAME, instruction=ask, files=files, verify=verify,
                solution=[look, act, f"head {out}"])
