"""find-by-name: locate files in a nested tree by a name pattern (`find -name` / `-iname`).

The tree mixes matching files with decoys: near-miss extensions (`x.log.gz`, `x.logs`),
directories whose names would match, and (for the case-sensitive variant) upper-case names.
The answer is the list of matching paths relative to /app, one per line, sorted.
"""

from __future__ import annotations

import random

from obsspec.env.families._text_helpers import DIR_NAMES, FILE_STEMS, one_of, verify_lines
from obsspec.env.task import Task

NAME = "find-by-name"

EXTS = ["bak", "cfg", "csv", "json", "log", "md", "py", "sh", "tmp", "txt", "yaml"]


def _tree_dirs(rng: random.Random, root: str) -> list[str]:
    dirs = [root]
    for _ in range(rng.randint(3, 7)):
        parent = rng.choice(dirs)
        if parent.count("/") < rng.randint(1, 4):
            dirs.append(f"{parent}/{rng.choice(DIR_NAMES)}")
    return sorted(set(dirs))


def generate(rng: random.Random, task_id: str) -> Task:
    root = one_of(rng, ["project", "data", "repo", "workspace", "srv", "home"])
    dirs = _tree_dirs(rng, root)
    mode = rng.choice(["ext", "prefix", "contains"])
    ci = rng.random() < 0.3
    ext = rng.choice(EXTS)
    key = rng.choice(FILE_STEMS)
    others = [s for s in FILE_STEMS if s != key and key not in s and s not in key]
    other_exts = [e for e in EXTS if e != ext]

    def matching_name() -> str:
        stem = rng.choice(others)
        if mode == "ext":
            return f"{stem}{rng.randint(1, 99)}.{ext}"
        if mode == "prefix":
            return f"{key}_{stem}.{rng.choice(EXTS)}"
        return f"{stem}-{key}-{rng.randint(1, 9)}.{rng.choice(EXTS)}"

    def decoy_name() -> str:
        stem = rng.choice(others)
        if mode == "ext":
            return rng.choice([f"{stem}.{ext}.gz", f"{stem}.{ext}s",
                               f"{ext}_{stem}.{rng.choice(other_exts)}",
                               f"{stem}.{rng.choice(other_exts)}"])
        if mode == "prefix":
            return rng.choice([f"old_{key}_{stem}.txt", f"{stem}_{key}.{rng.choice(EXTS)}",
                               f"{stem}.{rng.choice(EXTS)}"])
        return rng.choice([f"{stem}.{rng.choice(EXTS)}", f"{stem}_{key[:-1]}.txt"])

    files: dict[str, str] = {}
    expected: list[str] = []
    for i in range(rng.randint(3, 7)):
        name = matching_name()
        if ci and i % 2 == 1:
            name = name.upper()
        path = f"{rng.choice(dirs)}/{name}"
        if path not in files:
            files[path] = f"{rng.choice(others)} {i}\n"
            expected.append(path)
    for i in range(rng.randint(5, 12)):
        name = decoy_name()
        if not ci and rng.random() < 0.25:
            name = matching_name().upper()  # would only match case-insensitively
        path = f"{rng.choice(dirs)}/{name}"
        files.setdefault(path, f"decoy {i}\n")
    # a directory whose own name matches: `-type f` must skip it
    decoy_dir = {"ext": f"old.{ext}", "prefix": f"{key}_dir", "contains": f"x-{key}-y"}[mode]
    setup = f"mkdir -p {rng.choice(dirs)}/{decoy_dir}\n"
    expected = sorted(expected)

    pattern = {"ext": f"*.{ext}", "prefix": f"{key}*", "contains": f"*{key}*"}[mode]
    desc = {"ext": f"whose name ends with `.{ext}`",
            "prefix": f"whose name starts with `{key}`",
            "contains": f"whose name contains `{key}`"}[mode]
    case = (" Treat the match as case-insensitive (upper-case names count too)." if ci
            else " The match is case-sensitive.")
    lead = rng.choice([f"Find every file under /app/{root} {desc}.",
                       f"I need a list of all regular files in /app/{root} (at any depth) {desc}.",
                       f"Search the /app/{root} tree recursively for files {desc}."])
    out = rng.choice(["answer.txt", "matches.txt", "found.txt"])
    instruction = (f"{lead}{case} Write their paths relative to /app (like `{root}/dir/file`), "
                   f"one per line, sorted, to /app/{out}.")
    test = "-iname" if ci else "-name"
    solution = [f"find {root} | head -50",
                f"find {root} -type f {test} '{pattern}' | sort > {out}",
                f"cat {out}"]
    return Task(task_id=task_id, family=NAME, instruction=instruction, files=files, setup=setup,
                verify=verify_lines(out, expected, order="sorted", strip_dot=True),
                solution=solution)
