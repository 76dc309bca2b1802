"""json-edit: apply two or three edits to a JSON config file (set a number or string, flip a
flag, append to a list, add a new key, delete a key) while keeping it valid JSON and every other
value unchanged. The verifier compares the parsed document with the expected one."""

from __future__ import annotations

import copy
import json
import random

from obsspec.env.families._data_helpers import WORDS, py_verify, unique_words
from obsspec.env.task import Task

NAME = "json-edit"

FEATURES = ["dark_mode", "beta_api", "metrics", "audit_log", "rate_limit", "sso", "webhooks", "search_v2"]
LEVELS = ["debug", "info", "warning", "error"]


def _config(rng: random.Random) -> dict:
    feats = unique_words(rng, rng.randint(3, 5), FEATURES)
    return {
        "name": f"{rng.choice(WORDS)}-{rng.choice(['api', 'web', 'worker', 'gateway'])}",
        "version": f"{rng.randint(0, 3)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
        "server": {"host": rng.choice(["0.0.0.0", "127.0.0.1", "localhost"]),
                   "port": rng.randrange(3000, 9000, 10), "workers": rng.randint(1, 8),
                   "allowed_hosts": [f"{w}.example.com" for w in unique_words(rng, rng.randint(1, 3))]},
        "logging": {"level": rng.choice(LEVELS), "file": f"/var/log/{rng.choice(WORDS)}.log",
                    "rotate_days": rng.randint(1, 30)},
        "database": {"url": f"postgres://db.internal:5432/{rng.choice(WORDS)}", "pool_size": rng.randint(2, 20)},
        "features": {f: rng.random() < 0.5 for f in feats},
    }


def _ops(rng: random.Random, cfg: dict) -> list[tuple]:
    """Candidate edits as (instruction phrase, jq update, action, key path, value)."""
    port = rng.randrange(3000, 9000, 10)
    while port == cfg["server"]["port"]:
        port += 10
    level = rng.choice([lv for lv in LEVELS if lv != cfg["logging"]["level"]])
    feat = rng.choice(sorted(cfg["features"]))
    val = not cfg["features"][feat]
    host = f"{rng.choice(WORDS)}-{rng.randint(2, 99)}.example.org"
    new_feat = rng.choice([f for f in FEATURES if f not in cfg["features"]])
    sec, key = rng.choice([("logging", "file"), ("logging", "rotate_days"), ("server", "workers")])
    pool = rng.randint(21, 64)
    jv = json.dumps(val)
    return [
        (f"change the server port to {port} (a number)", f".server.port = {port}", "set", ("server", "port"), port),
        (f'set the logging level to "{level}"', f'.logging.level = "{level}"', "set", ("logging", "level"), level),
        (f"set the feature flag `{feat}` to {jv}", f".features.{feat} = {jv}", "set", ("features", feat), val),
        (f'append "{host}" to the end of server.allowed_hosts', f'.server.allowed_hosts += ["{host}"]',
         "append", ("server", "allowed_hosts"), host),
        (f"add a new feature flag `{new_feat}` set to true", f".features.{new_feat} = true",
         "set", ("features", new_feat), True),
        (f"remove the key `{key}` from the `{sec}` section entirely", f"del(.{sec}.{key})", "del", (sec, key), None),
        (f"set database.pool_size to {pool}", f".database.pool_size = {pool}", "set", ("database", "pool_size"), pool),
    ]


def generate(rng: random.Random, task_id: str) -> Task:
    cfg = _config(rng)
    chosen = rng.sample(_ops(rng, cfg), rng.randint(2, 3))
    expected = copy.deepcopy(cfg)
    for _, _, action, (sec, key), value in chosen:
        if action == "set":
            expected[sec][key] = value
        elif action == "append":
            expected[sec][key].append(value)
        else:
            del expected[sec][key]
    path = rng.choice(["config.json", "app.json", "config/settings.json", "etc/service.json"])
    bullets = "".join(f"\n- {op[0]}" for op in chosen)
    instruction = rng.choice([
        f"Edit the JSON config /app/{path}:{bullets}\nLeave everything else as it is; the file must stay valid JSON.",
        f"Please update /app/{path} in place. Changes needed:{bullets}\nAll other keys and values must stay unchanged.",
    ])
    jq_filter = " | ".join(op[1] for op in chosen)
    canon = json.dumps(expected, sort_keys=True)
    return Task(
        task_id=task_id, family=NAME, instruction=instruction,
        files={path: json.dumps(cfg, indent=rng.choice([2, 4])) + "\n"},
        verify=py_verify(
            f"try:\n    got = json.loads(read_text({path!r}))\n"
            "except ValueError as e:\n    fail('invalid JSON: %s' % e)\n"
            f"if json.dumps(got, sort_keys=True) != {canon!r}:\n    fail('content differs: %r' % got)"),
        solution=[f"cat {path}", f"jq '{jq_filter}' {path} > {path}.new && mv {path}.new {path}", f"jq . {path}"],
    )
