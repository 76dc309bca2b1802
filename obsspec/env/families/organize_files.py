"""organize-files: sort a flat directory of files into a directory layout: one subdirectory per
extension, category folders from an extension map (with an "other" bucket), or YYYY/MM folders
from a date prefix in the names. The verifier checks the exact resulting tree and contents."""

from __future__ import annotations

import random

from obsspec.env.families._data_helpers import WORDS, py_verify, unique_words
from obsspec.env.task import Task

NAME = "organize-files"

CATEGORIES = {"images": ["jpg", "png", "gif"], "documents": ["pdf", "txt", "md", "docx"],
              "audio": ["mp3", "wav"], "archives": ["zip", "gz"], "code": ["py", "sh", "js"]}


def generate(rng: random.Random, task_id: str) -> Task:
    src = rng.choice(["downloads", "inbox", "unsorted", "dump"])
    kind = rng.choice(["ext", "category", "date"])
    words = unique_words(rng, rng.randint(7, 14))
    moves: dict[str, str] = {}  # file name in src -> new path relative to the destination root
    dest = src
    if kind == "ext":
        exts = rng.sample(sorted(e for es in CATEGORIES.values() for e in es), rng.randint(3, 5))
        for w in words:
            e = rng.choice(exts)
            moves[f"{w}.{e}"] = f"{e}/{w}.{e}"
        ask = (f"Move every file in /app/{src} into a subdirectory of /app/{src} named after its extension "
               f"(e.g. /app/{src}/{next(iter(moves.values()))}).")
        sol = f'cd {src} && for f in *.*; do e="${{f##*.}}"; mkdir -p "$e" && mv -- "$f" "$e/"; done'
    elif kind == "category":
        cats = rng.sample(sorted(CATEGORIES), rng.randint(2, 3))
        known = {e: c for c in cats for e in CATEGORIES[c]}
        extra = [e for c in sorted(CATEGORIES) if c not in cats for e in CATEGORIES[c]]
        for i, w in enumerate(words):
            e = rng.choice(sorted(known)) if i % 4 else rng.choice(extra)
            moves[f"{w}.{e}"] = f"{known.get(e, 'other')}/{w}.{e}"
        rules = "; ".join(f"{c}/ for {', '.join('.' + e for e in CATEGORIES[c])}" for c in cats)
        ask = (f"Organise /app/{src} by type: move each file into one of these subdirectories of /app/{src}: "
               f"{rules}; everything else goes into other/.")
        case = " ".join(f"{'|'.join('*.' + e for e in CATEGORIES[c])}) d={c};;" for c in cats)
        sol = (f'cd {src} && for f in *.*; do case "$f" in {case} *) d=other;; esac; '
               'mkdir -p "$d" && mv -- "$f" "$d/"; done')
    else:
        dest = rng.choice(["archive", "sorted", "by-date"])
        for w in words:
            y, m, d = rng.randint(2021, 2024), rng.randint(1, 12), rng.randint(1, 28)
            name = f"{y}-{m:02d}-{d:02d}_{w}.{rng.choice(['txt', 'csv', 'pdf', 'log'])}"
            moves[name] = f"{y}/{m:02d}/{name}"
        ask = (f"The files in /app/{src} start with a date (YYYY-MM-DD_...). Move each one into "
               f"/app/{dest}/YYYY/MM/ according to that date, keeping the file name, e.g. "
               f"/app/{dest}/{next(iter(moves.values()))}. /app/{src} should end up with no files in it.")
        sol = (f'for f in {src}/*; do b=$(basename "$f"); t={dest}/${{b:0:4}}/${{b:5:2}}; '
               'mkdir -p "$t" && mv -- "$f" "$t/"; done')
    files = {f"{src}/{name}": f"{name}: {rng.choice(WORDS)} {rng.randint(1, 9999)}\n" for name in sorted(moves)}
    expected = {moves[n]: files[f"{src}/{n}"] for n in sorted(moves)}
    check = f"got = walk({dest!r})\nif got != {expected!r}:\n    fail('tree is %r' % sorted(got))\n"
    if dest != src:
        check += f"if walk({src!r}):\n    fail('{src} still has files')\n"
    return Task(
        task_id=task_id, kind=kind, family=NAME, instruction=ask + " Do not rename or change the files.", files=files,
        verify=py_verify(check),
        solution=[f"ls {src}", sol, f"find {'.' if dest == src else dest} -type f | sort"],
    )
