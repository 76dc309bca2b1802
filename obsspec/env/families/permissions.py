"""permissions: fix file modes with chmod: make shell scripts executable, lock secrets down to
600, strip world-write from a shared tree (keeping the other bits), or make executable only the
files that start with a shebang. Files not covered by the request must keep their mode; the
verifier checks every file with stat."""

from __future__ import annotations

import random

from obsspec.env.families._data_helpers import WORDS, py_verify, unique_words
from obsspec.env.task import Task

NAME = "permissions"


def generate(rng: random.Random, task_id: str) -> Task:
    files: dict[str, str] = {}
    start: dict[str, str] = {}  # path -> initial mode
    want: dict[str, str] = {}  # path -> expected final mode
    asks, sols = [], []
    kinds = rng.sample(["scripts", "secrets", "shared", "shebang"], rng.randint(2, 3))
    pools = {"scripts": ["bin", "scripts", "deploy"], "secrets": ["secrets", "keys", "certs"],
             "shared": ["shared", "public", "uploads"], "shebang": ["tools", "hooks", "utils"]}

    def add(path: str, text: str, mode0: str, mode1: str) -> None:
        files[path], start[path], want[path] = text, mode0, mode1

    for kind in kinds:
        d = rng.choice(pools[kind])
        names = unique_words(rng, rng.randint(3, 5))
        if kind == "scripts":
            for n in names:
                add(f"{d}/{n}.sh", f"#!/bin/sh\necho {n}\n", rng.choice(["644", "640", "600"]), "755")
            add(f"{d}/README.txt", "Helper scripts.\n", "644", "644")
            asks.append(f"every .sh file in /app/{d}/ must have mode 755 (other files there stay as they are)")
            sols.append(f"chmod 755 {d}/*.sh")
        elif kind == "secrets":
            for n in names:
                ext = rng.choice(["key", "pem"])
                m0 = rng.choice(["644", "664", "640", "666"])
                add(f"{d}/{n}.{ext}", f"-----BEGIN {n.upper()} KEY-----\n", m0, "600")
            add(f"{d}/index.md", "Which key is which.\n", "644", "644")
            asks.append(f"every .key and .pem file in /app/{d}/ must have mode 600 (leave the other files alone)")
            sols.append(f"find {d} -type f \\( -name '*.key' -o -name '*.pem' \\) -exec chmod 600 {{}} +")
        elif kind == "shared":
            sub = rng.choice(WORDS)
            for i, n in enumerate(names + ["notes"]):
                m0 = rng.choice(["666", "777", "646", "664", "644", "775", "606"][: 2 if i == 0 else 7])
                add(f"{d}/{sub + '/' if i % 2 else ''}{n}.txt", f"{n}\n", m0, "%o" % (int(m0, 8) & ~0o002))
            asks.append(f"no file anywhere under /app/{d}/ may be writable by others: remove only the "
                        "write bit for others and keep every other permission bit unchanged")
            sols.append(f"find {d} -type f -perm -o=w -exec chmod o-w {{}} +")
        else:
            for i, n in enumerate(names):
                script = i == 0 or rng.random() < 0.5
                interp = rng.choice(["/bin/sh", "/usr/bin/env python3", "/bin/bash"])
                text = f"#!{interp}\n# {n}\n" if script else f"{n} = {rng.randint(1, 9)}\n"
                add(f"{d}/{n}", text, "644", "755" if script else "644")
            asks.append(f"in /app/{d}/, make exactly the files whose first line starts with #! executable "
                        "(mode 755); the rest must stay 644")
            sols.append(f"for f in {d}/*; do head -n 1 \"$f\" | grep -q '^#!' && chmod 755 \"$f\"; done; true")
    by_mode: dict[str, list[str]] = {}
    for p in sorted(start):
        by_mode.setdefault(start[p], []).append(f"'{p}'")
    setup = "".join(f"chmod {m} {' '.join(ps)}\n" for m, ps in sorted(by_mode.items()))
    setup += "find . -mindepth 1 -type d -exec chmod 755 {} +\n"
    instruction = rng.choice(["Fix the file permissions in /app:", "Please sort out these permissions:"])
    instruction += "".join(f"\n- {a}" for a in asks)
    return Task(
        task_id=task_id, family=NAME, instruction=instruction, files=files, setup=setup,
        verify=py_verify(f"for p, m in sorted({want!r}.items()):\n    if mode(p) != m:\n"
                         "        fail('%s has mode %s, expected %s' % (p, mode(p), m))"),
        solution=[f"ls -lR {' '.join(sorted({p.split('/')[0] for p in files}))}", *sols,
                  "find . -type f -exec stat -c '%a %n' {} + | sort -k2"],
    )
