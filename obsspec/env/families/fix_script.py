"""fix-script: a small stdlib Python module has one bug and its test script fails. Read the
traceback and the code, fix the module (e.g. with sed), rerun the test. The verifier runs a
pristine copy of the test plus a few hidden cases against the module source.

The module is the agent's code, so the verifier never runs it in its own process: a child
`python3 -I` (which cannot fork) loads it and prints each call's result; the verifier compares
them with expected values the child never sees, and discards anything the child put in /logs.
An `os._exit(0)` or a planted reward file therefore decides nothing."""

from __future__ import annotations

import random
import re

from obsspec.env.families._data_helpers import WORDS, py_verify
from obsspec.env.task import Task

NAME = "fix-script"


# Case makers: (rng, i) -> (args, expected result). Case i == 0 always exposes the bug.
def _mean(r, i):
    xs = [r.randint(1, 60) for _ in range(r.randint(2, 6))]
    return (xs,), sum(xs) / len(xs)


def _words(r, i):
    ws = [r.choice(WORDS) for _ in range(r.randint(2, 6))]
    return (" " + r.choice(["  ", " \n ", " \t "]).join(ws) + " ",), len(ws)


def _tally(r, i):
    ws = [r.choice(WORDS) for _ in range(r.randint(2, 4))]
    ws += ws[:2] + [r.choice(WORDS)]
    return (ws,), {w: ws.count(w) for w in ws}


def _chunks(r, i):
    xs, k = list(range(r.randint(4, 11))), r.randint(2, 4)
    return (xs, k), [xs[j:j + k] for j in range(0, len(xs), k)]


def _pairs(r, i):
    a, b = r.sample(WORDS, 2)
    return (f"# settings\n{a} = {i}\n\n{b}=x=y\n",), {a: str(i), b: "x=y"}


def _palindrome(r, i):
    w = r.choice(WORDS)
    return ((f"{w.title()}, {w[::-1]}",), True) if i % 2 == 0 else ((w.title() + "x",), False)


def _clamp(r, i):
    lo, hi, x = r.randint(-5, 0), r.randint(10, 20), r.randint(5, 30)
    return (x, lo, hi), max(lo, min(x, hi))


# (function names, buggy source with {fn}, (old, new) text of the fix, case maker)
BUGS = [
    (["mean", "average", "avg"],
     'def {fn}(values):\n    """Arithmetic mean of a non-empty list."""\n    total = 0\n    for v in values:\n'
     "        total += v\n    return total / (len(values) - 1)\n", ("len(values) - 1", "len(values)"), _mean),
    (["sum_to", "triangular", "total_up_to"],
     'def {fn}(n):\n    """Return 1 + 2 + ... + n."""\n    return sum(range(1, n))\n',
     ("range(1, n)", "range(1, n + 1)"), lambda r, i: (lambda n: ((n,), n * (n + 1) // 2))(r.randint(1, 80))),
    (["smallest", "minimum", "find_min"],
     'def {fn}(items):\n    """Smallest element of a non-empty list."""\n    best = items[0]\n'
     "    for x in items[1:]:\n        if x > best:\n            best = x\n    return best\n",
     ("if x > best", "if x < best"),
     lambda r, i: (lambda xs: ((xs,), min(xs)))(r.sample(range(-50, 99), r.randint(3, 7)))),
    (["to_fahrenheit", "c2f", "celsius_to_f"],
     'def {fn}(c):\n    """Convert degrees Celsius to Fahrenheit."""\n    return c * 9 / 5 - 32\n',
     ("- 32", "+ 32"), lambda r, i: (lambda c: ((c,), c * 9 / 5 + 32))(r.randint(-40, 120))),
    (["word_count", "count_words", "n_words"],
     'def {fn}(text):\n    """Number of whitespace-separated words in text."""\n    return len(text.split(" "))\n',
     ('text.split(" ")', "text.split()"), _words),
    (["tally", "word_freq", "count_items"],
     'def {fn}(words):\n    """Map each word to how many times it occurs."""\n    counts = {{}}\n    for w in words:\n'
     "        counts[w] = 1\n    return counts\n", ("counts[w] = 1", "counts[w] = counts.get(w, 0) + 1"), _tally),
    (["chunks", "batched", "split_every"],
     'def {fn}(xs, size):\n    """Split xs into consecutive pieces of length size (the last may be shorter)."""\n'
     "    out = []\n    for i in range(0, len(xs), size):\n        out.append(xs[i:i + size - 1])\n    return out\n",
     ("xs[i:i + size - 1]", "xs[i:i + size]"), _chunks),
    (["parse_settings", "parse_kv", "read_pairs"],
     'def {fn}(text):\n    """Parse key=value lines (blank lines and # comments are skipped) into a dict."""\n'
     "    out = {{}}\n    for line in text.splitlines():\n        line = line.strip()\n"
     '        if not line or line.startswith("#"):\n            continue\n        key, value = line.split("=")\n'
     "        out[key.strip()] = value.strip()\n    return out\n", ('line.split("=")', 'line.split("=", 1)'), _pairs),
    (["is_palindrome", "palindromic", "reads_same"],
     'def {fn}(s):\n    """True if s reads the same backwards, ignoring case, spaces and punctuation."""\n'
     "    cleaned = [c for c in s if c.isalnum()]\n    return cleaned == cleaned[::-1]\n",
     ("[c for c in s", "[c.lower() for c in s"), _palindrome),
    (["clamp", "bound", "limit"],
     'def {fn}(x, lo, hi):\n    """Clamp x into the closed interval [lo, hi]."""\n    return max(lo, min(x, lo))\n',
     ("min(x, lo)", "min(x, hi)"), _clamp),
]


def _case(make, rng: random.Random, fn: str, i: int) -> tuple[str, object]:
    args, exp = make(rng, i)
    return f"{fn}({', '.join(map(repr, args))})", exp


def _assert(call: str, exp) -> str:
    return f"assert abs({call} - {exp!r}) < 1e-9" if isinstance(exp, float) else f"assert {call} == {exp!r}"


# Runs in the child: load the agent's module, evaluate each call, print the reprs as one JSON line.
CHILD = r"""import json, sys, types
path, mod, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
m = types.ModuleType(mod)
exec(compile(open(path, encoding="utf-8").read(), path, "exec"), m.__dict__)
sys.modules[mod] = m
out = []
for c in calls:
    try:
        out.append(repr(eval(c, m.__dict__)))
    except BaseException as e:
        out.append("error: " + repr(e))
print("\n" + json.dumps(out))
"""

JUDGE = r"""import ast, ctypes, resource, shutil, subprocess
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the child cannot read our memory
def no_fork():
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
try:
    p = subprocess.run([sys.executable, "-I", "-c", CHILD, PATH, MOD, json.dumps([c for c, _ in CASES])],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20, preexec_fn=no_fork)
except subprocess.TimeoutExpired:
    fail("the tests timed out")
if os.path.isdir("/logs/verifier"):
    shutil.rmtree("/logs/verifier")  # whatever the child wrote there is not a reward
    os.mkdir("/logs/verifier")
try:
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(got) == len(CASES)
except Exception:
    fail("the tests did not run: %s" % (p.stdout + p.stderr)[-300:])
for (call, exp), g in zip(CASES, got):
    try:
        val = ast.literal_eval(g)
        ok = abs(val - exp) < 1e-9 if isinstance(exp, float) else val == exp
    except Exception:
        ok = False
    if not ok:
        fail("test failed: %s returned %s" % (call, g))
"""


# The expected values must be nowhere the agent's module can read while the judge runs it: the
# script file goes (the sandbox sends verifiers on a pipe, where the `rm` finds nothing to
# remove; it stays for any runner that passes a file), bash gives way to the judge (its open
# script with it), the judge is non-dumpable (its stdin, the script, unreadable through /proc)
# and the child gets no stdin.
HIDDEN = 'rm -f -- "$0"\nexec '


def _sed(old: str, new: str) -> str:
    return "s/" + re.sub(r"([\\.*\[\]^$/])", r"\\\1", old) + "/" + re.sub(r"([\\&/])", r"\\\1", new) + "/"


def generate(rng: random.Random, task_id: str) -> Task:
    (names, src, (old, new), make), (names2, src2, (old2, new2), make2) = rng.sample(BUGS, 2)
    fn, fn2 = rng.choice(names), rng.choice(names2)
    mod = rng.choice(["mathutil", "helpers", "utils", "textkit", "toolbox", "core", "common"])
    d = rng.choice(["", "lib/", "project/", "tools/"])
    parts = [src.format(fn=fn), src2.format(fn=fn2).replace(old2, new2)]
    rng.shuffle(parts)
    code = f'"""Small helpers for the {rng.choice(WORDS)} project."""\n\n\n' + "\n\n".join(parts)
    tests = [_case(make, rng, fn, i) for i in range(rng.randint(2, 3))]
    tests += [_case(make2, rng, fn2, i) for i in range(2)]
    hidden = [_case(make, rng, fn, i) for i in range(2, 5)] + [_case(make2, rng, fn2, i) for i in range(2, 4)]
    test = (f"from {mod} import {', '.join(sorted([fn, fn2]))}\n\n" + "\n".join(_assert(*t) for t in tests)
            + '\nprint("all tests passed")\n')
    body = f"PATH = {d + mod + '.py'!r}\nMOD = {mod!r}\nCASES = {tests + hidden!r}\nCHILD = {CHILD!r}\n" + JUDGE
    cd = f"cd {d.rstrip('/')} && " if d else ""
    where = f"/app/{d.rstrip('/')}" if d else "/app"
    instruction = rng.choice([
        f"In {where}, `python3 test_{mod}.py` fails. Find the bug in {mod}.py and fix it so the test passes. "
        "Do not modify the test.",
        f"The test script {where}/test_{mod}.py (run it from {where}) fails because of a bug in {mod}.py. "
        "Fix the module, not the test.",
    ])
    return Task(
        task_id=task_id, family=NAME, instruction=instruction,
        files={f"{d}{mod}.py": code, f"{d}test_{mod}.py": test}, verify=HIDDEN + py_verify(body),
        solution=[f"{cd}python3 test_{mod}.py", f"cat {mod}.py", f"sed -i '{_sed(old, new)}' {mod}.py",
                  f"python3 test_{mod}.py"],
    )
