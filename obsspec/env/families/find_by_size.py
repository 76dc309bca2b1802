"""find-by-size: select files by size (`find -size`, `ls -l`, `du`, `stat`).

Sizes are made exact in setup with `head -c`. No file lies within 1 KiB of the threshold, so
`find -size +Nk` rounding and `-size +Nc` give the same answer. Variants: list the files larger
than the threshold, list the ones smaller than it, or name the single largest file.
"""

from __future__ import annotations

import random

from obsspec.env.families._text_helpers import DIR_NAMES, FILE_STEMS, one_of, verify_lines
from obsspec.env.task import Task

NAME = "find-by-size"


def generate(rng: random.Random, task_id: str) -> Task:
    root = one_of(rng, ["uploads", "storage", "media", "dump", "assets", "downloads"])
    dirs = [root] + sorted({f"{root}/{d}" for d in rng.sample(DIR_NAMES, rng.randint(1, 4))})
    if rng.random() < 0.5:
        dirs.append(f"{rng.choice(dirs[1:])}/{rng.choice(DIR_NAMES)}")
    kib = rng.randint(2, 6)
    in_kib = rng.random() < 0.5
    threshold = kib * 1024 if in_kib else rng.randint(20, 60) * 100
    mode = rng.choice(["larger", "smaller", "largest"])

    # at least one file on each side of the threshold
    sizes = [rng.randint(1, threshold - 1024), rng.randint(threshold + 1024, 12000)]
    n = rng.randint(7, 12)
    while len(sizes) < n:
        s = rng.choice([0, rng.randint(1, 400), rng.randint(400, threshold - 1024),
                        rng.randint(threshold + 1024, 12000)])
        if s not in sizes:  # distinct sizes: the largest file is unambiguous
            sizes.append(s)
    paths: list[str] = []
    while len(paths) < n:
        p = f"{rng.choice(dirs)}/{rng.choice(FILE_STEMS)}{rng.randint(1, 99)}." \
            f"{rng.choice(['bin', 'dat', 'img', 'txt', 'pdf', 'zip'])}"
        if p not in paths:
            paths.append(p)
    lines = [f"mkdir -p {' '.join(dirs)}"]
    for p, s in zip(paths, sizes):
        lines.append(f"head -c {s} /dev/zero > {p}")
    setup = "\n".join(lines) + "\n"

    limit = f"{kib} KiB ({threshold} bytes)" if in_kib else f"{threshold} bytes"
    out = rng.choice(["answer.txt", "result.txt", f"{mode}.txt"])
    if mode == "largest":
        expected = [max(zip(sizes, paths))[1]]
        instruction = (f"Which regular file anywhere under /app/{root} is the largest? Write its "
                       f"path relative to /app (like `{root}/dir/file`) as the only line of "
                       f"/app/{out}.")
        act = f"find {root} -type f -printf '%s %p\\n' | sort -n | tail -1 | cut -d' ' -f2 > {out}"
        look = f"find {root} -type f -printf '%s %p\\n' | sort -n"
    else:
        expected = sorted(p for p, s in zip(paths, sizes)
                          if (s > threshold if mode == "larger" else s < threshold))
        lead = rng.choice([f"Find all regular files under /app/{root} (at any depth) that are "
                           f"{mode} than {limit}.",
                           f"Some files in /app/{root} and its subdirectories are {mode} than "
                           f"{limit}; I need to know which ones."])
        instruction = (f"{lead} Write their paths relative to /app (like `{root}/dir/file`), one "
                       f"per line, sorted, to /app/{out} (leave it empty if there are none).")
        sign = "+" if mode == "larger" else "-"
        act = f"find {root} -type f -size {sign}{threshold}c | sort > {out}"
        look = rng.choice([f"ls -lR {root}", f"find {root} -type f -exec ls -l {{}} +"])
    return Task(task_id=task_id, family=NAME, instruction=instruction, setup=setup,
                verify=f"test -f {out}\n" + verify_lines(out, expected, order="sorted",
                                                         strip_dot=True),
                solution=[look, act, f"cat {out}"])
