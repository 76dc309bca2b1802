"""archive-create: pack a selection of files from a directory tree (all files with a given
extension, optionally skipping one subdirectory) into a tar.gz or zip archive with paths relative
to /app. The verifier opens the archive with tarfile/zipfile and checks members and contents."""

from __future__ import annotations

import random

from obsspec.env.families._data_helpers import WORDS, py_verify, text_body, unique_words
from obsspec.env.task import Task

NAME = "archive-create"

EXTS = ["log", "txt", "conf", "csv", "py", "md", "json"]


def generate(rng: random.Random, task_id: str) -> Task:
    root = rng.choice(["srv", "project", "data", "var/app", "home/deploy"])
    ext = rng.choice(EXTS)
    others = rng.sample([e for e in EXTS if e != ext], 3)
    subdirs = unique_words(rng, rng.randint(2, 4))
    files: dict[str, str] = {}
    for sub in subdirs:
        depth = rng.choice(["", "", f"{rng.choice(['old', 'current', 'v2', 'daily'])}/"])
        for name in unique_words(rng, rng.randint(2, 5)):
            e = ext if rng.random() < 0.5 else rng.choice(others)
            path = f"{root}/{sub}/{depth if rng.random() < 0.5 else ''}{name}.{e}"
            files[path] = text_body(rng, e, path)
    for sub in subdirs[:2]:  # every instance has matches in at least two places
        path = f"{root}/{sub}/{rng.choice(WORDS)}_main.{ext}"
        files[path] = text_body(rng, ext, path)
    files[f"{root}/README.md" if ext != "md" else f"{root}/NOTES.txt"] = "Archive me selectively.\n"
    skip = rng.choice(subdirs) if rng.random() < 0.4 else None
    chosen = sorted(p for p in files if p.endswith(f".{ext}") and not (skip and p.startswith(f"{root}/{skip}/")))
    fmt = rng.choice(["tar.gz", "zip"])
    out = f"{rng.choice(['', 'backup/', 'dist/'])}{rng.choice([ext + 's', 'selected', rng.choice(WORDS)])}.{fmt}"
    excl = f", except the ones under /app/{root}/{skip}/" if skip else ""
    instruction = rng.choice([
        f"Create the archive /app/{out} containing every .{ext} file under /app/{root} (recursively){excl}, "
        f"and nothing else. Store the paths relative to /app (like {chosen[0]}).",
        f"Pack all *.{ext} files found anywhere below /app/{root}{excl + ',' if skip else ''} into a {fmt} archive at /app/{out}. "
        f"No other files may be in it; member paths must be relative to /app, e.g. {chosen[-1]}.",
    ])
    find = f"find {root} -type f -name '*.{ext}'" + (f" ! -path '{root}/{skip}/*'" if skip else "")
    mk = f"mkdir -p {out.rsplit('/', 1)[0]} && " if "/" in out else ""
    pack = (f"{find} | sort | tar -czf {out} -T -", f"tar -tzf {out}") if fmt == "tar.gz" else \
        (f"{find} | sort | zip -q {out} -@", f"unzip -l {out}")
    check = f"""
import tarfile, zipfile
exp = {{p: t for p, t in {files!r}.items() if p in {chosen!r}}}
got = {{}}
try:
    if {fmt!r} == "zip":
        with zipfile.ZipFile({out!r}) as z:
            got = {{i.filename: z.read(i).decode() for i in z.infolist() if not i.is_dir()}}
    else:
        with tarfile.open({out!r}, "r:gz") as t:
            got = {{m.name: t.extractfile(m).read().decode() for m in t.getmembers() if m.isfile()}}
except Exception as e:
    fail("cannot read {out}: %s" % e)
got = {{k[2:] if k.startswith("./") else k.lstrip("/"): v for k, v in got.items()}}
if sorted(got) != sorted(exp):
    fail("members %r, expected %r" % (sorted(got), sorted(exp)))
if got != exp:
    fail("member contents differ")
"""
    return Task(
        task_id=task_id, family=NAME, instruction=instruction, files=files,
        verify=py_verify(check),
        solution=[f"find {root} -type f | sort", f"{mk}{pack[0]}", pack[1]],
    )
