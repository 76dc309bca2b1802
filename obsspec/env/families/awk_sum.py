"""awk-sum: aggregate a numeric column grouped by a key (`awk '{s[$k] += $v} END {...}'`).

A sales table (CSV with a header, or whitespace-separated without one) with shuffled columns.
Variants: sum, average (2 decimals) or maximum per key, or the total for one key. Values are
integers or have cents; the checker compares numbers with a tolerance of half a cent.
"""

from __future__ import annotations

import random
from decimal import Decimal

from obsspec.env.families._text_helpers import CITIES, FIRST_NAMES, WORDS, one_of, verify_numbers
from obsspec.env.task import Task

NAME = "awk-sum"


def generate(rng: random.Random, task_id: str) -> Task:
    key = rng.choice(["region", "product", "rep"])
    val = rng.choice(["units", "amount"])
    cols = ["date", "region", "product", "rep", "units", "amount"]
    rng.shuffle(cols)
    keys = {"region": rng.sample(CITIES, rng.randint(3, 6)),
            "product": rng.sample(WORDS, rng.randint(3, 6)),
            "rep": rng.sample(FIRST_NAMES, rng.randint(3, 6))}
    cents = rng.random() < 0.5
    rows = []
    for _ in range(rng.randint(12, 40)):
        r = {k: rng.choice(v) for k, v in sorted(keys.items())}
        r["date"] = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        r["units"] = str(rng.randint(1, 60))
        r["amount"] = f"{rng.randint(100, 99999) / 100:.2f}" if cents else str(rng.randint(5, 2000))
        rows.append(r)
    csv = rng.random() < 0.6
    sep = "," if csv else " "
    path = one_of(rng, ["sales", "orders", "ledger", "transactions"]) + (".csv" if csv else ".txt")
    lines = ([",".join(cols)] if csv else []) + [sep.join(r[c] for c in cols) for r in rows]
    k, v = cols.index(key) + 1, cols.index(val) + 1

    groups: dict[str, list[Decimal]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(Decimal(r[val]))
    mode = rng.choice(["sum", "avg", "max", "one"])
    out = rng.choice(["answer.txt", "totals.txt", "report.txt", "summary.txt"])
    desc = (f"/app/{path} is a CSV file with a header line" if csv else
            f"/app/{path} has no header; its whitespace-separated columns are: {' '.join(cols)}")
    fs, skip = ("-F, ", "NR > 1") if csv else ("", "")
    dec = mode == "avg" or (cents and val == "amount")
    num = "%.2f" if dec else "%d"
    two = " Use 2 decimal places." if dec and mode != "avg" else ""
    tol, order = 0.006, "sorted"
    if mode == "one":
        target = rng.choice(sorted(groups))
        expected = [("", sum(groups[target]))]
        ask = (f"{desc}. What is the total `{val}` over all rows whose `{key}` is `{target}`? "
               f"Write just the number to /app/{out}.{two}")
        cond = f"{skip} && " if skip else ""
        act = (f"awk {fs}'{cond}${k} == \"{target}\" {{s += ${v}}} END {{printf \"{num}\\n\", s}}' "
               f"{path} > {out}")
        order = "exact"
    else:
        func = {"sum": sum, "max": max, "avg": lambda xs: sum(xs) / len(xs)}[mode]
        expected = [(g, func(xs)) for g, xs in sorted(groups.items())]
        what = {"sum": f"the total `{val}`", "max": f"the largest `{val}`",
                "avg": f"the average `{val}` (rounded to 2 decimal places)"}[mode]
        ask = (f"{desc}. For each distinct `{key}`, compute {what}. Write one line per {key} to "
               f"/app/{out} as `<{key}> <value>` separated by a space, sorted by {key}.{two}")
        agg, res = {
            "sum": (f"s[${k}] += ${v}", "s[g]"),
            "max": (f"if (!(${k} in s) || ${v} > s[${k}]) s[${k}] = ${v}", "s[g]"),
            "avg": (f"s[${k}] += ${v}; n[${k}]++", "s[g] / n[g]")}[mode]
        act = (f"awk {fs}'{skip + ' ' if skip else ''}{{{agg}}} END "
               f"{{for (g in s) printf \"%s {num}\\n\", g, {res}}}' "
               f"{path} | sort > {out}")
    files = {path: "\n".join(lines) + "\n"}
    return Task(task_id=task_id, family=NAME, instruction=ask, files=files,
                verify=verify_numbers(out, expected, tol=tol, order=order),
                solution=[f"head -5 {path}", act, f"cat {out}"])
