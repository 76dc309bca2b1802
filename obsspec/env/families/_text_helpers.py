"""Shared pieces for the file-finding and text-processing families: word pools and verifiers.

The verifiers are bash scripts that run an embedded `python3` check (stdlib only), so they are
strict about content but tolerant of layout that the instructions leave open: a missing final
newline, trailing blanks, CRLF line ends and empty lines are ignored.
"""

from __future__ import annotations

import random

WORDS = sorted(
    "alpha amber anchor apple arrow aspen autumn badge basil beacon birch bison blossom bramble "
    "breeze bronze cactus canyon cedar cinder clover cobalt comet copper coral crane crystal "
    "dahlia delta dune eagle ember falcon fern fjord forest garnet glacier granite harbor hazel "
    "heron indigo island ivory jasper juniper kestrel lagoon lantern lemon lilac linen lotus "
    "maple marble meadow mesa mint nectar nova oak olive onyx orchid otter pebble pepper pine "
    "plum prairie quartz raven reef ridge river saffron sage sierra silver spruce summit "
    "thistle tide topaz tulip valley velvet violet walnut willow zephyr".split()
)
FIRST_NAMES = sorted(
    "alice bob carol dave erin frank grace heidi ivan judy karl liam mallory nina oscar peggy "
    "quinn rupert sybil trent uma victor wendy xavier yara zane".split()
)
CITIES = sorted(
    "amsterdam athens berlin bogota cairo chicago dakar delhi dublin havana helsinki jakarta "
    "kyoto lagos lima lisbon madrid manila nairobi oslo paris prague quito riga rome seoul "
    "sydney tokyo vienna warsaw zurich".split()
)
FILE_STEMS = sorted(
    "app backup build cache config data debug draft export index invoice main notes output "
    "report sales schema server session summary test todo upload users".split()
)
DIR_NAMES = sorted(
    "archive assets bin build docs lib logs misc old projects scripts shared src tmp "
    "vendor work".split()
)


def one_of(rng: random.Random, options):
    """rng.choice over a sorted copy, so set/dict ordering can never leak in."""
    return rng.choice(sorted(options) if isinstance(options, (set, frozenset)) else list(options))


def _python_check(body: str, **values) -> str:
    """Bash verifier running `body` in python3, with `values` bound as Python literals."""
    header = "".join(f"{k} = {v!r}\n" for k, v in sorted(values.items()))
    # -I: the agent's files in cwd cannot shadow the standard library (see _data_helpers.py)
    return f"python3 -I - <<'PYCHECK'\nimport subprocess, sys\n{header}{body}PYCHECK\n"


_LINES_BODY = r"""
try:
    raw = open(PATH, encoding="utf-8", errors="replace").read()
except OSError:
    sys.exit(f"{PATH} is missing")
got = []
for line in raw.splitlines():
    line = line.rstrip("\r").rstrip(" ")
    if SQUEEZE:
        line = " ".join(line.split())
    if STRIP_DOT and line.startswith("./"):
        line = line[2:]
    if line.strip():
        got.append(line)
if ORDER == "exact":
    ok = got == EXPECTED
else:
    ok = sorted(got) == sorted(EXPECTED)
    if ok and ORDER == "sorted":
        # accept code-point order or the order `sort` gives in this locale
        by_sort = subprocess.run(["sort"], input="\n".join(EXPECTED) + "\n", text=True,
                                 capture_output=True).stdout.splitlines()
        ok = got in (sorted(EXPECTED), by_sort)
if not ok:
    print("expected:", EXPECTED, "\ngot:     ", got)
    sys.exit(1)
"""


def verify_lines(path: str, expected: list[str], order: str = "exact", squeeze: bool = True,
                 strip_dot: bool = False) -> str:
    """Verifier: the non-empty lines of `path` equal `expected`.

    order: "exact" (same order), "sorted" (same lines, sorted) or "any" (same lines, any order).
    squeeze: collapse runs of blanks inside a line to one space (for `word count` tables).
    strip_dot: ignore a leading "./" on each line (for paths printed by `find .`).
    """
    assert order in ("exact", "sorted", "any")
    return _python_check(_LINES_BODY, PATH=path, EXPECTED=list(expected), ORDER=order,
                         SQUEEZE=squeeze, STRIP_DOT=strip_dot)


_FILES_BODY = r"""
bad = []
for path, want in EXPECTED.items():
    try:
        have = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError):
        bad.append(path + " (missing)")
        continue
    if have.rstrip("\n") != want.rstrip("\n"):
        bad.append(path)
if bad:
    sys.exit("wrong content: " + ", ".join(bad))
"""


def verify_files(expected: dict[str, str]) -> str:
    """Verifier: each file has exactly the given content (ignoring the final newline)."""
    return _python_check(_FILES_BODY, EXPECTED=dict(sorted(expected.items())))


def distinct_counts(rng: random.Random, top: int, lo: int, hi: int) -> list[int]:
    """`top` distinct counts in [lo, hi], largest first (so rankings have no ties)."""
    return sorted(rng.sample(range(lo, hi + 1), top), reverse=True)


_NUMBERS_BODY = r"""
import re
try:
    raw = open(PATH, encoding="utf-8", errors="replace").read()
except OSError:
    sys.exit(f"{PATH} is missing")
got = []
for line in raw.splitlines():
    parts = [p for p in re.split(r"[\s,]+", line) if p]
    if not parts:
        continue
    try:
        got.append((" ".join(parts[:-1]), float(parts[-1])))
    except ValueError:
        sys.exit(f"not a number at the end of: {line!r}")
keys = [k for k, _ in got]
want = [k for k, _ in EXPECTED]
if ORDER == "sorted":
    by_sort = subprocess.run(["sort"], input="\n".join(want) + "\n", text=True,
                             capture_output=True).stdout.splitlines()
    ok_keys = keys in (sorted(want), by_sort)
else:
    ok_keys = keys == want
if not ok_keys:
    sys.exit(f"expected keys {want}, got {keys}")
for (k, v), (_, w) in zip(got, EXPECTED):
    if not abs(v - w) <= TOL:  # (not >: a NaN compares false with everything)
        sys.exit(f"{k}: expected {w}, got {v}")
"""


def verify_numbers(path: str, expected: list[tuple[str, float]], tol: float = 1e-6,
                   order: str = "exact") -> str:
    """Verifier: `path` has lines `<key> <number>` (blank- or comma-separated) matching
    `expected` within `tol`. A key may be "" for a file holding one bare number.
    order: "exact" (as given) or "sorted" (by key: code-point order or `sort`'s locale order).
    """
    assert order in ("exact", "sorted")
    return _python_check(_NUMBERS_BODY, PATH=path, EXPECTED=[(k, float(v)) for k, v in expected],
                         ORDER=order, TOL=tol)
