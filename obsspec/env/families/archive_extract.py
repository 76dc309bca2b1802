"""archive-extract: an archive (tar.gz, tar.bz2, tar.xz or zip, built in setup) must be
inspected or unpacked: extract one member to a given place, unpack all of it into a directory,
count members of a kind, or find which member contains a string."""

from __future__ import annotations

import random

from obsspec.env.families._data_helpers import WORDS, py_verify, text_body, unique_words
from obsspec.env.task import Task

NAME = "archive-extract"

FORMATS = {"tar.gz": ("z", "gzip"), "tar.bz2": ("j", "bzip2"), "tar.xz": ("J", "xz"), "zip": ("", "zip")}
EXTS = ["py", "md", "conf", "txt", "json", "sh"]


def generate(rng: random.Random, task_id: str) -> Task:
    proj = f"{rng.choice(WORDS)}-{rng.randint(1, 4)}.{rng.randint(0, 12)}"
    tree: dict[str, str] = {}
    for sub in ["", *unique_words(rng, rng.randint(2, 3), ["src", "conf", "docs", "scripts", "lib", "tests"])]:
        for name in unique_words(rng, rng.randint(2, 4)):
            ext = rng.choice(EXTS)
            path = f"{proj}/{sub + '/' if sub else ''}{name}.{ext}"
            tree[path] = text_body(rng, ext, path)
    fmt = rng.choice(sorted(FORMATS))
    flag, _ = FORMATS[fmt]
    arc = f"{rng.choice(['', 'downloads/', 'incoming/'])}{proj}.{fmt}"
    files = {f".stage/{p}": t for p, t in tree.items()}
    pack = (f"(cd .stage && find {proj} | sort | zip -q -X ../{proj}.zip -@)" if fmt == "zip" else
            f"tar --sort=name --owner=0 --group=0 --numeric-owner -C .stage -c{flag}f {proj}.{fmt} {proj}")
    mv = f"mkdir -p {arc.rsplit('/', 1)[0]} && mv {proj}.{fmt} {arc}\n" if "/" in arc else ""
    setup = f"find .stage -exec touch -d '2024-02-03 04:05:06' {{}} +\n{pack}\n{mv}rm -rf .stage\n"
    listing = f"unzip -l {arc}" if fmt == "zip" else f"tar -t{flag}vf {arc}"
    kind = rng.choice(["member", "all", "count", "grep"])
    if kind == "member":
        member = rng.choice(sorted(tree))
        dest = rng.choice(["", "restored/"]) + member.rsplit("/", 1)[1]
        ask = (f"Extract only the file {member} from it and save it as /app/{dest}. Do not unpack anything "
               f"else (in particular /app/{proj} must not exist afterwards).")
        mk = f"mkdir -p {dest.split('/')[0]} && " if "/" in dest else ""
        get = f"unzip -p {arc} {member}" if fmt == "zip" else f"tar -x{flag}Of {arc} {member}"
        sol = [f"{mk}{get} > {dest}", f"cat {dest}"]
        check = (f"if read_text({dest!r}) != {tree[member]!r}:\n    fail('wrong content')\n"
                 f"if os.path.exists({proj!r}):\n    fail('unpacked too much')")
    elif kind == "all":
        dest = rng.choice(["unpacked", "release", "extracted", "build/src"])
        ask = f"Unpack the whole archive into /app/{dest}/ so that the files end up under /app/{dest}/{proj}/."
        get = f"unzip -q {arc} -d {dest}" if fmt == "zip" else f"tar -x{flag}f {arc} -C {dest}"
        sol = [f"mkdir -p {dest} && {get}", f"find {dest} -type f | sort"]
        check = f"if walk({dest!r}) != {tree!r}:\n    fail('unpacked tree differs')"
    elif kind == "count":
        ext = rng.choice(sorted({p.rsplit('.', 1)[1] for p in tree}))
        ask = (f"How many .{ext} files does it contain (in any directory)? Write just the number to "
               "/app/answer.txt.")
        names = f"unzip -Z1 {arc}" if fmt == "zip" else f"tar -t{flag}f {arc}"
        sol = [f"{names} | grep -c '\\.{ext}$' > answer.txt", "cat answer.txt"]
        check = f"expect_lines('answer.txt', [{str(sum(p.endswith('.' + ext) for p in tree))!r}])"
    else:
        member = rng.choice(sorted(tree))
        needle = f"{rng.choice(['TOKEN', 'KEY', 'MARK'])}-{rng.randint(10000, 99999)}"
        tree[member] += f"secret = {needle}\n"
        files[f".stage/{member}"] = tree[member]
        ask = (f"Exactly one file in it contains the string {needle}. Write that file's path as stored in "
               f"the archive (e.g. {min(p for p in tree if p != member)}) to /app/answer.txt.")
        get = f"unzip -q ../{arc} -d ." if fmt == "zip" else f"tar -x{flag}f ../{arc}"
        sol = [f"mkdir -p scratch && cd scratch && {get}",
               f"grep -rl '{needle}' . | sed 's|^\\./||' > ../answer.txt; cd ..", "cat answer.txt"]
        check = f"expect_lines('answer.txt', [{member!r}])"
    instruction = rng.choice([f"The archive /app/{arc} was just downloaded. ", f"You are given /app/{arc}. "]) + ask
    return Task(task_id=task_id, kind=kind, family=NAME, instruction=instruction, files=files, setup=setup,
                verify=py_verify(check), solution=[listing, *sol])
