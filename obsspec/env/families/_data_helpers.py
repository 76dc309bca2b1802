"""Shared pieces for the data and file-handling families (private: not a family itself).

Word pools, small content generators, and `py_verify`, which wraps a Python check (run with
the stdlib `python3` inside the sandbox) into a bash verifier with a few helper functions.
"""

from __future__ import annotations

import random

FIRST_NAMES = [
    "alice", "bruno", "carmen", "dmitri", "elena", "farid", "greta", "hiro", "ines", "jonas",
    "kira", "lukas", "maya", "nadia", "oscar", "priya", "quinn", "rosa", "samir", "tara",
    "umar", "vera", "wen", "xavier", "yara", "zane", "bianca", "emil", "leila", "marco",
]
LAST_NAMES = [
    "moreno", "schmidt", "okafor", "tanaka", "silva", "novak", "haddad", "larsen", "kowalski",
    "nguyen", "fischer", "rossi", "dubois", "ivanova", "mendez", "park", "costa", "berg",
]
WORDS = [
    "alpha", "amber", "atlas", "beacon", "birch", "cedar", "comet", "delta", "ember", "falcon",
    "fjord", "garnet", "harbor", "indigo", "juniper", "kepler", "lagoon", "maple", "nebula",
    "onyx", "orchid", "pebble", "quartz", "raven", "sierra", "summit", "tundra", "umber",
    "velvet", "willow", "zephyr", "cobalt", "meadow", "pilot", "ripple", "saffron", "timber",
]
CITIES = [
    "Lisbon", "Osaka", "Denver", "Nairobi", "Oslo", "Lyon", "Austin", "Porto", "Kyoto",
    "Dublin", "Seville", "Tallinn", "Quito", "Perth", "Bergen",
]
LEVELS = ["INFO", "INFO", "INFO", "WARN", "ERROR", "DEBUG"]


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES).title()} {rng.choice(LAST_NAMES).title()}"


def unique_words(rng: random.Random, n: int, pool: list[str] | None = None) -> list[str]:
    """n distinct words from pool (default WORDS), in random order."""
    return rng.sample(sorted(set(pool or WORDS)), n)


def text_body(rng: random.Random, ext: str, tag: str) -> str:
    """Plausible small file content for a file of extension ext; `tag` makes it unique."""
    n = rng.randint(2, 6)
    if ext == "log":
        lines = [
            f"2024-0{rng.randint(1, 9)}-{rng.randint(10, 28)} {rng.randint(10, 23)}:"
            f"{rng.randint(10, 59)}:{rng.randint(10, 59)} {rng.choice(LEVELS)} "
            f"{rng.choice(WORDS)} {rng.choice(['started', 'stopped', 'retry', 'ok', 'timeout'])}"
            for _ in range(n)
        ]
        return f"# {tag}\n" + "\n".join(lines) + "\n"
    if ext in ("conf", "ini", "cfg", "env"):
        return f"# {tag}\n" + "".join(f"{w} = {rng.randint(1, 999)}\n" for w in rng.sample(WORDS, n))
    if ext == "py":
        return f'"""{tag}"""\n\n\ndef {rng.choice(WORDS)}():\n    return {rng.randint(0, 99)}\n'
    if ext == "csv":
        return "id,value\n" + "".join(f"{i},{rng.randint(0, 500)}\n" for i in range(1, n + 1))
    if ext == "json":
        return '{"name": "%s", "value": %d}\n' % (tag, rng.randint(0, 999))
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10)))
    return f"{tag}\n{words.capitalize()}.\n"


PRELUDE = '''import json, os, sys
def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)
def read_text(path):
    if not os.path.isfile(path):
        fail(path + " is missing")
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()
def read_lines(path):
    lines = [line.strip() for line in read_text(path).splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines
def expect_lines(path, exp, sort=False):
    got = read_lines(path)
    if sort:
        got = sorted(got)
    if got != exp:
        fail("%s: expected %r, got %r" % (path, exp, got))
def walk(root):
    """relative path -> text of every regular file under root ({} if root is missing)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(d, name)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, encoding="utf-8", errors="replace") as f:
                    out[os.path.relpath(p, root)] = f.read()
    return out
def mode(path):
    if not os.path.lexists(path):
        fail(path + " is missing")
    return "%o" % (os.stat(path).st_mode & 0o777)
'''


def py_verify(body: str) -> str:
    """A bash verifier running `body` (Python, may use the PRELUDE helpers); exit 0 = pass."""
    # -I: isolated mode, so the agent's files in cwd (json.py, subprocess.py, ...) cannot shadow
    # the standard library, and PYTHON* variables and user site-packages are ignored
    return f"python3 -I - <<'__OBSSPEC_VERIFY__'\n{PRELUDE}\n{body.strip()}\nprint('OK')\n__OBSSPEC_VERIFY__\n"
