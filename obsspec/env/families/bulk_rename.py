"""bulk-rename: rename many files in one directory with a shell loop: change an extension, add a
prefix, lowercase names, zero-pad the numbers in names, or replace spaces with underscores.
Distractor files must be left alone; the verifier checks the exact name -> content mapping."""

from __future__ import annotations

import random

from obsspec.env.families._data_helpers import WORDS, py_verify, unique_words
from obsspec.env.task import Task

NAME = "bulk-rename"


def generate(rng: random.Random, task_id: str) -> Task:
    d = rng.choice(["photos", "notes", "inbox", "reports", "media", "docs/archive"])
    kind = rng.choice(["ext", "prefix", "lower", "pad", "spaces"])
    n = rng.randint(4, 9)
    words = unique_words(rng, n + 2)
    ren: dict[str, str] = {}  # old name -> new name (identity for files that stay)
    if kind == "ext":
        old, new = rng.choice([("txt", "md"), ("jpeg", "jpg"), ("htm", "html"), ("yml", "yaml"), ("log", "txt")])
        ren = {f"{w}.{old}": f"{w}.{new}" for w in words[:n]}
        ren.update({f"{w}.csv": f"{w}.csv" for w in words[n:]})
        ask = f"rename every *.{old} file to use the extension .{new} instead (keep the rest of each name)"
        loop = f'for f in *.{old}; do mv -- "$f" "${{f%.{old}}}.{new}"; done'
    elif kind == "prefix":
        ext = rng.choice(["jpg", "png", "pdf", "wav"])
        pre = rng.choice([f"{rng.randint(2015, 2024)}_", "archived-", f"{rng.choice(WORDS)}_", "old_"])
        ren = {f"{w}.{ext}": f"{pre}{w}.{ext}" for w in words[:n]}
        ren.update({f"{w}.txt": f"{w}.txt" for w in words[n:]})
        ask = f'add the prefix "{pre}" to the name of every .{ext} file (other files keep their names)'
        loop = f'for f in *.{ext}; do mv -- "$f" "{pre}$f"; done'
    elif kind == "lower":
        for w in words[:-1]:
            name = "".join(c.upper() if rng.random() < 0.4 else c for c in w)
            name = (name if name != w else w.capitalize()) + rng.choice([".TXT", ".Jpg", ".txt", ".PNG"])
            ren[name] = name.lower()
        ren[f"{words[-1]}.txt"] = f"{words[-1]}.txt"  # already lowercase: stays
        ask = "rename every file so that its whole name (including the extension) is lowercase"
        loop = ('for f in *; do lc=$(printf \'%s\' "$f" | tr \'A-Z\' \'a-z\'); '
                '[ "$f" = "$lc" ] || mv -- "$f" "$lc"; done')
    elif kind == "pad":
        stem, ext = rng.choice(["img_", "scan-", "page", "frame_"]), rng.choice(["png", "jpg", "txt"])
        width = rng.choice([3, 4])
        nums = sorted(rng.sample(range(1, 10 ** (width - 1)), n + 2))
        ren = {f"{stem}{k}.{ext}": f"{stem}{k:0{width}d}.{ext}" for k in nums}
        ask = (f"zero-pad the number in every file name to {width} digits "
               f"(for example {stem}{nums[0]}.{ext} becomes {stem}{nums[0]:0{width}d}.{ext})")
        loop = (f'for f in {stem}*.{ext}; do k=${{f#{stem}}}; k=${{k%.{ext}}}; '
                f'new=$(printf \'{stem}%0{width}d.{ext}\' "$k"); [ "$f" = "$new" ] || mv -- "$f" "$new"; done')
    else:
        ext = rng.choice(["txt", "pdf", "md"])
        ren = {}
        for i in range(n):
            parts = [words[i].title(), rng.choice(WORDS), str(rng.randint(1, 99))][: rng.randint(2, 3)]
            name = " ".join(parts) + f".{ext}"
            ren[name] = name.replace(" ", "_")
        ren.update({f"{w}_{i}.{ext}": f"{w}_{i}.{ext}" for i, w in enumerate(words[n:])})
        ask = "replace every space in the file names with an underscore"
        loop = 'for f in *\\ *; do mv -- "$f" "${f// /_}"; done'
    files = {f"{d}/{o}": f"{o} #{rng.randint(100, 999)}\n" for o in sorted(ren)}
    expected = {ren[o]: files[f"{d}/{o}"] for o in sorted(ren)}
    instruction = rng.choice([f"In /app/{d}, {ask}.", f"Files in /app/{d} need renaming: {ask}."])
    instruction += " Do not change file contents and do not create or delete other files."
    return Task(
        task_id=task_id, kind=kind, family=NAME, instruction=instruction, files=files,
        verify=py_verify(f"got = walk({d!r})\nif got != {expected!r}:\n    fail('files are now %r' % sorted(got))"),
        solution=[f"ls -l {d}", f"cd {d} && {loop}", "ls"],
    )
