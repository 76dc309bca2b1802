"""json-extract: pull values out of a nested JSON document (a list of records buried a few keys
deep) into a plain text file: filtered names, one looked-up number, distinct tags, a sum.
Exercises jq (or python3 -c) selection, unique/sort and aggregation."""

from __future__ import annotations

import json
import random

from obsspec.env.families._data_helpers import FIRST_NAMES, WORDS, py_verify, unique_words
from obsspec.env.task import Task

NAME = "json-extract"

# noun, list key, name key, number key (lo, hi), flag key, tags key, owner object key, owner field
SHAPES = [
    ("service", "services", "name", ("port", 3000, 9999), "enabled", "tags", "meta", "owner"),
    ("user", "users", "username", ("uid", 1000, 4999), "active", "groups", "profile", "team"),
    ("package", "packages", "name", ("size_kb", 10, 9000), "installed", "labels", "info", "maintainer"),
    ("job", "jobs", "id", ("timeout_s", 30, 3600), "scheduled", "tags", "spec", "queue"),
]
TAGS = ["web", "db", "cache", "batch", "internal", "public", "gpu", "legacy", "beta", "core"]
ROOTS = [["data"], ["spec", "items"], ["config"], ["inventory", "current"], []]


def generate(rng: random.Random, task_id: str) -> Task:
    noun, lkey, nkey, (numk, lo, hi), flagk, tagk, metak, ownk = rng.choice(SHAPES)
    n = rng.randint(6, 12)
    names = unique_words(rng, n, WORDS + [f"{w}{i}" for w in WORDS[:10] for i in (2, 3)])
    owners = unique_words(rng, 3, FIRST_NAMES + ["platform", "infra", "data", "ops"])
    tags = unique_words(rng, rng.randint(4, 7), TAGS)
    recs = [{nkey: nm, numk: rng.randint(lo, hi), flagk: rng.random() < 0.55,
             tagk: sorted(rng.sample(tags, rng.randint(0, 3))), metak: {ownk: rng.choice(owners)}}
            for nm in names]
    recs[0][flagk], recs[1][flagk] = True, False
    path = rng.choice(ROOTS) + [lkey]
    doc: dict = {path[-1]: recs}
    for key in reversed(path[:-1]):
        doc = {key: doc}
    doc = {"version": rng.randint(1, 5), **doc}
    jpath = "." + ".".join(path) + "[]"
    target = rng.choice(recs)
    tag = rng.choice(sorted({t for r in recs for t in r[tagk]}))
    owner = target[metak][ownk]
    q = rng.choice(["flag", "lookup", "tags", "owner"] + (["sum"] if numk in ("size_kb", "timeout_s") else []))
    where = f" (the list is at `{jpath[:-2]}`)" if rng.random() < 0.5 else ""
    if q == "flag":
        ask = (f"the `{nkey}` of every {noun} whose `{flagk}` field is true, one per line, in the order "
               "they appear in the file")
        exp, sort = [r[nkey] for r in recs if r[flagk]], False
        jq = f"jq -r '{jpath} | select(.{flagk}) | .{nkey}'"
    elif q == "lookup":
        ask = f"just the `{numk}` value of the {noun} whose `{nkey}` is \"{target[nkey]}\" (the bare number)"
        exp, sort = [str(target[numk])], False
        jq = f"jq -r '{jpath} | select(.{nkey} == \"{target[nkey]}\") | .{numk}'"
    elif q == "tags":
        ask = (f"every distinct value that appears in the `{tagk}` lists of the {noun}s, one per line, "
               "sorted alphabetically")
        exp, sort = sorted({t for r in recs for t in r[tagk]}), True
        jq = f"jq -r '[{jpath} | .{tagk}[]] | unique | .[]'"
    elif q == "owner":
        ask = (f"the `{nkey}` of every {noun} whose `{metak}.{ownk}` is \"{owner}\", one per line, "
               "sorted alphabetically")
        exp, sort = sorted(r[nkey] for r in recs if r[metak][ownk] == owner), True
        jq = f"jq -r '{jpath} | select(.{metak}.{ownk} == \"{owner}\") | .{nkey}' SRC | sort"
    else:
        ask = f"the sum of the `{numk}` values of all {noun}s tagged \"{tag}\" in `{tagk}` (a single integer)"
        exp, sort = [str(sum(r[numk] for r in recs if tag in r[tagk]))], False
        jq = f"jq '[{jpath} | select(.{tagk} | index(\"{tag}\")) | .{numk}] | add'"
    src = rng.choice(["", "config/", "data/"]) + rng.choice([f"{lkey}.json", "inventory.json", "export.json"])
    out = rng.choice(["answer.txt", "result.txt", f"{lkey}_out.txt"])
    instruction = rng.choice([
        f"/app/{src} describes some {noun}s{where}. Write {ask} to /app/{out}.",
        f"Look at the JSON file /app/{src}{where} and write {ask} into /app/{out}.",
    ])
    return Task(
        task_id=task_id, family=NAME, instruction=instruction,
        files={src: json.dumps(doc, indent=rng.choice([2, 4])) + "\n"},
        verify=py_verify(f"expect_lines({out!r}, {exp!r}, sort={sort})"),
        solution=[f"head -c 600 {src}", f"jq '{'.' + '.'.join(path)} | length' {src}",
                  f"{jq if 'SRC' in jq else jq + ' SRC'} > {out}".replace("SRC", src), f"cat {out}"],
    )
