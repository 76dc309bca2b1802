"""cut-columns: extract and reorder columns of a delimited file (`cut -d -f`, `awk -F -v OFS`).

The file has a header naming its columns; the delimiter is one of , TAB ; | :. The task names
2-3 columns, possibly in an order `cut` cannot produce, says whether to keep the header, and
which delimiter the output uses.
"""

from __future__ import annotations

import random

from obsspec.env.families._text_helpers import CITIES, FIRST_NAMES, one_of, verify_lines
from obsspec.env.task import Task

NAME = "cut-columns"

DELIMS = {",": "a comma", "\t": "a tab", ";": "a semicolon", "|": "a pipe (`|`)", ":": "a colon"}
COLUMNS = {
    "id": lambda rng, i: str(100 + i),
    "name": lambda rng, i: rng.choice(FIRST_NAMES),
    "email": lambda rng, i: f"{rng.choice(FIRST_NAMES)}{rng.randint(1, 99)}@example.com",
    "city": lambda rng, i: rng.choice(CITIES),
    "age": lambda rng, i: str(rng.randint(18, 80)),
    "dept": lambda rng, i: rng.choice(["ops", "sales", "eng", "hr", "legal", "finance"]),
    "salary": lambda rng, i: str(rng.randint(30, 150) * 1000),
    "joined": lambda rng, i: f"20{rng.randint(10, 24)}-{rng.randint(1, 12):02d}-"
                             f"{rng.randint(1, 28):02d}",
}


def _awk_sep(d: str) -> str:
    return "\\t" if d == "\t" else d


def generate(rng: random.Random, task_id: str) -> Task:
    delim = rng.choice(sorted(DELIMS))
    out_delim = delim if rng.random() < 0.6 else ","
    cols = rng.sample(sorted(COLUMNS), rng.randint(4, 7))
    rows = [cols] + [[COLUMNS[c](rng, i) for c in cols] for i in range(rng.randint(6, 25))]
    ext = {",": "csv", "\t": "tsv"}.get(delim, "txt")
    path = f"{one_of(rng, ['people', 'staff', 'members', 'employees', 'export'])}.{ext}"
    text = "\n".join(delim.join(r) for r in rows) + "\n"

    want = rng.sample(cols, rng.randint(2, 3))
    if rng.random() < 0.4:
        want.sort(key=cols.index)  # file order: plain `cut` works
    idx = [cols.index(c) for c in want]
    header = rng.random() < 0.6
    body = rows if header else rows[1:]
    expected = [out_delim.join(r[i] for i in idx) for r in body]

    out = rng.choice(["out", "columns", "extract", "selected"])
    out += "." + ext if out_delim == delim else ".csv"
    names = ", ".join(f"`{c}`" for c in want)
    ask = rng.choice([f"/app/{path} is a table whose fields are separated by {DELIMS[delim]}, with "
                      f"a header line naming the columns.",
                      f"The first line of /app/{path} names its columns; fields are separated by "
                      f"{DELIMS[delim]}."])
    ask += (f" Create /app/{out} containing only the columns {names}, in exactly that order, "
            f"separated by {DELIMS[out_delim]}, for every row of the file, "
            + ("keeping the header line (with just those column names)." if header
               else "without the header line (data rows only)."))
    fields = ", ".join(f"${i + 1}" for i in idx)
    cond = "" if header else "NR > 1 "
    act = (f"awk -F'{_awk_sep(delim)}' -v OFS='{_awk_sep(out_delim)}' '{cond}{{print {fields}}}' "
           f"{path} > {out}")
    return Task(task_id=task_id, family=NAME, instruction=ask, files={path: text},
                verify=verify_lines(out, expected, squeeze=False),
                solution=[f"head -5 {path}", act, f"head -5 {out}"])
