"""csv-filter: select the rows of a CSV file that match a numeric threshold and/or a category,
and write them (header first, original order) to a new CSV file. Exercises head/awk -F, style
filtering with numeric comparison and string equality."""

from __future__ import annotations

import random

from obsspec.env.families._data_helpers import CITIES, FIRST_NAMES, WORDS, py_verify, unique_words
from obsspec.env.task import Task

NAME = "csv-filter"

# stem, name column, name pool, category column, categories, numeric columns (name, lo, hi, step)
DATASETS = [
    ("employees", "name", FIRST_NAMES, "department", ["sales", "engineering", "support", "finance", "marketing"],
     [("salary", 30000, 120000, 500), ("age", 21, 65, 1)]),
    ("products", "product", WORDS, "category", ["garden", "kitchen", "toys", "office", "sports"],
     [("price", 2, 400, 1), ("stock", 0, 250, 1)]),
    ("orders", "customer", FIRST_NAMES, "region", ["north", "south", "east", "west"],
     [("amount", 10, 2000, 5), ("units", 1, 40, 1)]),
    ("servers", "host", [f"{w}-{i}" for w in WORDS[:12] for i in (1, 2)], "datacenter",
     [c.lower() for c in CITIES[:5]], [("cpu_pct", 1, 99, 1), ("mem_gb", 2, 256, 2)]),
    ("students", "student", FIRST_NAMES, "class", ["7a", "7b", "8a", "8b", "9a"],
     [("score", 0, 100, 1), ("absences", 0, 20, 1)]),
]
OPS = {">": ("greater than", "__gt__"), ">=": ("at least", "__ge__"),
       "<": ("less than", "__lt__"), "<=": ("at most", "__le__")}


def generate(rng: random.Random, task_id: str) -> Task:
    stem, name_col, pool, cat_col, cats, nums = rng.choice(DATASETS)
    cats = unique_words(rng, rng.randint(3, len(cats)), cats)
    cols = [name_col, cat_col] + [n[0] for n in nums]
    rng.shuffle(cols)
    cols = ["id"] + cols
    n_rows = rng.randint(14, 36)
    rows = []
    for i in range(1, n_rows + 1):
        rec = {"id": str(i), name_col: rng.choice(pool), cat_col: rng.choice(cats)}
        for col, lo, hi, step in nums:
            rec[col] = str(rng.randrange(lo, hi + 1, step))
        rows.append(rec)
    kind = rng.choice(["num", "cat", "both"])
    col, *_ = rng.choice(nums)
    op = rng.choice(sorted(OPS))
    values = sorted(int(r[col]) for r in rows)
    thr = values[rng.randint(n_rows // 4, 3 * n_rows // 4)]
    cat = rng.choice(sorted({r[cat_col] for r in rows}))

    def keep(r: dict) -> bool:
        ok_num = getattr(int(r[col]), OPS[op][1])(thr)
        ok_cat = r[cat_col] == cat
        return {"num": ok_num, "cat": ok_cat, "both": ok_num and ok_cat}[kind]

    if not any(keep(r) for r in rows):  # make sure the answer is never just the header
        rows[rng.randrange(n_rows)].update({cat_col: cat, col: str(thr)})
        op = {">": ">=", "<": "<="}.get(op, op)
    ci, ni = cols.index(cat_col) + 1, cols.index(col) + 1
    cond = {"num": f"{col} is {OPS[op][0]} {thr}", "cat": f"{cat_col} is \"{cat}\"",
            "both": f"{cat_col} is \"{cat}\" and {col} is {OPS[op][0]} {thr}"}[kind]
    awk_cond = {"num": f"${ni} {op} {thr}", "cat": f'${ci} == "{cat}"',
                "both": f'${ci} == "{cat}" && ${ni} {op} {thr}'}[kind]

    src_dir = rng.choice(["", "data/", "exports/", "reports/2024/"])
    src = f"{src_dir}{stem}.csv"
    out_dir = rng.choice(["", "out/", "filtered/"])
    out = f"{out_dir}{stem}_{rng.choice(['selected', 'subset', 'filtered', 'matches'])}.csv"
    lines = [",".join(cols)] + [",".join(r[c] for c in cols) for r in rows]
    expected = [lines[0]] + [lines[i + 1] for i, r in enumerate(rows) if keep(r)]
    instruction = rng.choice([
        f"From /app/{src}, keep only the rows where {cond}. Write them to /app/{out} as CSV: the "
        "header line first, then the matching rows unchanged and in their original order.",
        f"I need the rows of /app/{src} whose {cond}. Save them, with the same header line, to "
        f"/app/{out} (keep the rows exactly as they are and in the same order).",
        f"Filter the CSV /app/{src}: select every row where {cond}, and write the result, "
        f"including the header, to /app/{out}. Row order and formatting must stay as in the input.",
    ]) + (f" Create /app/{out_dir.rstrip('/')} if it does not exist." if out_dir else "")
    mk = f"mkdir -p {out_dir} && " if out_dir else ""
    return Task(
        task_id=task_id, kind=kind, family=NAME, instruction=instruction,
        files={src: "\n".join(lines) + "\n"},
        verify=py_verify(f"expect_lines({out!r}, {expected!r})"),
        solution=[f"head -n 5 {src}", f"{mk}awk -F, 'NR == 1 || ({awk_cond})' {src} > {out}", f"cat {out}"],
    )
