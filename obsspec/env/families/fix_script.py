"""fix-script: a small stdlib Python module has one bug and its test script fails. Read the
traceback and the code, fix the module (e.g. with sed), rerun the test. The verifier runs a
pristine copy of the test plus a few hidden cases against the module source."""

from __future__ import annotations

import random
import re

from obsspec.env.families._data_helpers import WORDS, py_verify
from obsspec.env.task import Task

NAME = "fix-script"


def _words(rng: random.Random, k: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(k)]


# Each bug: function names, source with {fn} (buggy), (old, new) fix, case(rng, fn, i) -> assert line;
# case i == 0 always exposes the bug.
BUGS = [
    (["mean", "average", "avg"],
     'def {fn}(values):\n    """Arithmetic mean of a non-empty list."""\n    total = 0\n    for v in values:\n'
     "        total += v\n    return total / (len(values) - 1)\n", ("len(values) - 1", "len(values)"),
     lambda r, fn, i: (lambda xs: f"assert abs({fn}({xs}) - {sum(xs) / len(xs)!r}) < 1e-9")(
         [r.randint(1, 60) for _ in range(r.randint(2, 6))])),
    (["sum_to", "triangular", "total_up_to"],
     'def {fn}(n):\n    """Return 1 + 2 + ... + n."""\n    return sum(range(1, n))\n',
     ("range(1, n)", "range(1, n + 1)"),
     lambda r, fn, i: (lambda n: f"assert {fn}({n}) == {n * (n + 1) // 2}")(r.randint(1, 80))),
    (["smallest", "minimum", "find_min"],
     'def {fn}(items):\n    """Smallest element of a non-empty list."""\n    best = items[0]\n'
     "    for x in items[1:]:\n        if x > best:\n            best = x\n    return best\n",
     ("if x > best", "if x < best"),
     lambda r, fn, i: (lambda xs: f"assert {fn}({xs}) == {min(xs)}")(r.sample(range(-50, 99), r.randint(3, 7)))),
    (["to_fahrenheit", "c2f", "celsius_to_f"],
     'def {fn}(c):\n    """Convert degrees Celsius to Fahrenheit."""\n    return c * 9 / 5 - 32\n',
     ("- 32", "+ 32"),
     lambda r, fn, i: (lambda c: f"assert abs({fn}({c}) - {c * 9 / 5 + 32!r}) < 1e-9")(r.randint(-40, 120))),
    (["word_count", "count_words", "n_words"],
     'def {fn}(text):\n    """Number of whitespace-separated words in text."""\n    return len(text.split(" "))\n',
     ('text.split(" ")', "text.split()"),
     lambda r, fn, i: (lambda ws: f"assert {fn}({' ' + r.choice(['  ', ' ' + chr(10) + ' ', ' ' + chr(9) + ' ']).join(ws) + ' '!r}) == {len(ws)}")(
         _words(r, r.randint(2, 6)))),
    (["tally", "word_freq", "count_items"],
     'def {fn}(words):\n    """Map each word to how many times it occurs."""\n    counts = {{}}\n    for w in words:\n'
     "        counts[w] = 1\n    return counts\n", ("counts[w] = 1", "counts[w] = counts.get(w, 0) + 1"),
     lambda r, fn, i: (lambda ws: f"assert {fn}({ws}) == {dict((w, ws.count(w)) for w in ws)}")(
         (lambda b: b + b[:2] + _words(r, 2))(_words(r, r.randint(2, 4))))),
    (["chunks", "batched", "split_every"],
     'def {fn}(xs, size):\n    """Split xs into consecutive pieces of length size (the last may be shorter)."""\n'
     "    out = []\n    for i in range(0, len(xs), size):\n        out.append(xs[i:i + size - 1])\n    return out\n",
     ("xs[i:i + size - 1]", "xs[i:i + size]"),
     lambda r, fn, i: (lambda xs, k: f"assert {fn}({xs}, {k}) == {[xs[j:j + k] for j in range(0, len(xs), k)]}")(
         list(range(r.randint(4, 11))), r.randint(2, 4))),
    (["parse_settings", "parse_kv", "read_pairs"],
     'def {fn}(text):\n    """Parse key=value lines (blank lines and # comments are skipped) into a dict."""\n'
     "    out = {{}}\n    for line in text.splitlines():\n        line = line.strip()\n"
     '        if not line or line.startswith("#"):\n            continue\n        key, value = line.split("=")\n'
     "        out[key.strip()] = value.strip()\n    return out\n", ('line.split("=")', 'line.split("=", 1)'),
     lambda r, fn, i: (lambda a, b: f"assert {fn}({f'# cfg{chr(10)}{a}=1{chr(10)}{b}=x=y{chr(10)}'!r}) == {{'{a}': '1', '{b}': 'x=y'}}")(
         *r.sample(WORDS, 2))),
    (["is_palindrome", "palindromic", "reads_same"],
     'def {fn}(s):\n    """True if s reads the same backwards, ignoring case, spaces and punctuation."""\n'
     "    cleaned = [c for c in s if c.isalnum()]\n    return cleaned == cleaned[::-1]\n",
     ("[c for c in s", "[c.lower() for c in s"),
     lambda r, fn, i: (lambda w: f"assert {fn}({w.title() + ', ' + w[::-1]!r}) is True" if i % 2 == 0 else
                       f"assert {fn}({w.title() + 'x'!r}) is False")(r.choice(WORDS))),
    (["clamp", "bound", "limit"],
     'def {fn}(x, lo, hi):\n    """Clamp x into the closed interval [lo, hi]."""\n    return max(lo, min(x, lo))\n',
     ("min(x, lo)", "min(x, hi)"),
     lambda r, fn, i: (lambda lo, hi, x: f"assert {fn}({x}, {lo}, {hi}) == {max(lo, min(x, hi))}")(
         0, r.randint(10, 20), r.randint(5, 30))),
]


def _sed(old: str, new: str) -> str:
    return "s/" + re.sub(r"([\\.*\[\]^$/])", r"\\\1", old) + "/" + re.sub(r"([\\&/])", r"\\\1", new) + "/"


def generate(rng: random.Random, task_id: str) -> Task:
    (names, src, (old, new), case), (names2, src2, (old2, new2), case2) = rng.sample(BUGS, 2)
    fn, fn2 = rng.choice(names), rng.choice(names2)
    mod = rng.choice(["mathutil", "helpers", "utils", "textkit", "toolbox", "core", "common"])
    d = rng.choice(["", "lib/", "project/", "tools/"])
    parts = [src.format(fn=fn), src2.format(fn=fn2).replace(old2, new2)]
    rng.shuffle(parts)
    code = f'"""Small helpers for the {rng.choice(WORDS)} project."""\n\n\n' + "\n\n".join(parts)
    tests = [case(rng, fn, i) for i in range(rng.randint(2, 3))] + [case2(rng, fn2, i) for i in range(2)]
    hidden = [case(rng, fn, i) for i in range(2, 5)] + [case2(rng, fn2, i) for i in range(2, 4)]
    test = f"from {mod} import {', '.join(sorted([fn, fn2]))}\n\n" + "\n".join(tests) + '\nprint("all tests passed")\n'
    body = (f"import types\npath = {d + mod + '.py'!r}\nm = types.ModuleType({mod!r})\n"
            f"exec(compile(read_text(path), path, 'exec'), m.__dict__)\nsys.modules[{mod!r}] = m\n"
            f"try:\n    exec({test + chr(10).join(hidden)!r}, {{}})\nexcept Exception as e:\n"
            "    fail('test failed: %r' % e)")
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
        files={f"{d}{mod}.py": code, f"{d}test_{mod}.py": test}, verify=py_verify(body),
        solution=[f"{cd}python3 test_{mod}.py", f"cat {mod}.py", f"sed -i '{_sed(old, new)}' {mod}.py",
                  f"python3 test_{mod}.py"],
    )
