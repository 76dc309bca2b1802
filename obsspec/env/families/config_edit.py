"""config-edit: edit an INI file (section-aware: the same key exists in several sections) or a
flat KEY=VALUE file (.env / .properties): change a value, enable a flag, add a section or key,
remove a key. The verifier parses the file and compares every section/key with the expected."""

from __future__ import annotations

import random

from obsspec.env.families._data_helpers import WORDS, py_verify
from obsspec.env.task import Task

NAME = "config-edit"

INI_CHECK = """
import configparser
cp = configparser.ConfigParser(interpolation=None)
cp.optionxform = str
try:
    cp.read_string(read_text(PATH))
except configparser.Error as e:
    fail("cannot parse: %s" % e)
got = {s: dict(cp.items(s)) for s in cp.sections()}
if got != EXP:
    fail("config is %r" % got)
"""
FLAT_CHECK = """
got = {}
for line in read_lines(PATH):
    if not line or line.startswith("#"):
        continue
    if "=" not in line:
        fail("bad line %r" % line)
    k, v = (x.strip() for x in line.split("=", 1))
    if k in got:
        fail("duplicate key " + k)
    got[k] = v[1:-1] if len(v) > 1 and v[0] == v[-1] and v[0] in "\\"'" else v
if got != EXP:
    fail("settings are %r" % got)
"""


# An edit: (instruction phrase, shell command with PATH, (section or None, key, new value)).
# key None: add the whole dict `value` as a section; value None: delete the key.


def _ini(rng: random.Random):
    port, db_port = rng.randrange(3000, 9000, 5), rng.choice([5432, 3306, 6379])
    flags = rng.sample(["beta_ui", "caching", "audit", "telemetry", "signup"], 3)
    conf = {"server": {"host": "0.0.0.0", "port": str(port), "workers": str(rng.randint(2, 8))},
            "database": {"host": f"db-{rng.choice(WORDS)}", "port": str(db_port), "name": rng.choice(WORDS)},
            "logging": {"level": rng.choice(["info", "warning"]), "file": f"/var/log/{rng.choice(WORDS)}.log"},
            "features": {f: "false" for f in flags}}
    new_port = str(port + rng.choice([1, 10, 80, 1000]))
    flag, ttl = rng.choice(flags), str(rng.choice([60, 300, 900]))
    ops = [
        (f"set the port in the [server] section to {new_port} (the [database] port must not change)",
         f"sed -i '/^\\[server\\]/,/^\\[/ s/^port = .*/port = {new_port}/' PATH", ("server", "port", new_port)),
        (f"enable the `{flag}` feature in [features] (set it to true)",
         f"sed -i '/^\\[features\\]/,/^\\[/ s/^{flag} = .*/{flag} = true/' PATH", ("features", flag, "true")),
        ("set the logging level to debug", "sed -i 's/^level = .*/level = debug/' PATH",
         ("logging", "level", "debug")),
        (f"add a new section [cache] with backend = redis and ttl = {ttl}",
         f"printf '\\n[cache]\\nbackend = redis\\nttl = {ttl}\\n' >> PATH",
         ("cache", None, {"backend": "redis", "ttl": ttl})),
    ]
    text = "# service configuration\n" + "".join(
        f"[{sec}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items()) + "\n" for sec, kv in conf.items())
    path = rng.choice(["app.ini", "config/service.ini", "settings.ini"])
    return path, text, conf, ops, INI_CHECK


def _flat(rng: random.Random):
    env = rng.random() < 0.5  # .env style (UPPER_CASE) or .properties style (dotted.lower)

    def key(k: str) -> str:
        return k.upper().replace(".", "_") if env else k

    conf = {key("app.name"): rng.choice(WORDS), key("server.port"): str(rng.randrange(3000, 9000, 5)),
            key("debug"): "false", key("db.url"): f"postgres://db/{rng.choice(WORDS)}",
            key("cache.ttl"): str(rng.choice([30, 60, 120])), key("legacy.mode"): "on"}
    port, ttl, val = str(rng.randrange(9000, 9999)), str(rng.choice([600, 1800])), f"smtp.{rng.choice(WORDS)}.org"
    p, c, lg, d, new = key("server.port"), key("cache.ttl"), key("legacy.mode"), key("debug"), key("mail.host")
    ops = [(f"change {p} to {port}", f"sed -i 's/^{p}=.*/{p}={port}/' PATH", (None, p, port)),
           (f"turn {d} on (set it to true)", f"sed -i 's/^{d}=.*/{d}=true/' PATH", (None, d, "true")),
           (f"set {c} to {ttl}", f"sed -i 's/^{c}=.*/{c}={ttl}/' PATH", (None, c, ttl)),
           (f"add {new} with the value {val}", f"echo '{new}={val}' >> PATH", (None, new, val)),
           (f"remove the {lg} setting completely", f"sed -i '/^{lg}=/d' PATH", (None, lg, None))]
    text = f"# {'environment' if env else 'application properties'}\n" + "".join(f"{k}={v}\n" for k, v in conf.items())
    path = rng.choice([".env", "config/app.env"]) if env else rng.choice(["app.properties", "conf/app.properties"])
    return path, text, conf, ops, FLAT_CHECK


def generate(rng: random.Random, task_id: str) -> Task:
    path, text, conf, ops, check = _ini(rng) if rng.random() < 0.5 else _flat(rng)
    chosen = [ops[i] for i in sorted(rng.sample(range(len(ops)), rng.randint(2, 3)))]
    for _, _, (sec, k, v) in chosen:
        target = conf.setdefault(sec, {}) if sec else conf
        if k is None:
            target.update(v)
        elif v is None:
            del target[k]
        else:
            target[k] = v
    asks = "".join(f"\n- {op[0]}" for op in chosen)
    instruction = rng.choice([f"Update the config file /app/{path}:{asks}\nKeep all other settings as they are.",
                              f"Make these changes to /app/{path}:{asks}\nDon't change anything else."])
    return Task(
        task_id=task_id, family=NAME, instruction=instruction, files={path: text},
        verify=py_verify(check.replace("PATH", repr(path)).replace("EXP", repr(conf))),
        solution=[f"cat {path}", " && ".join(op[1].replace("PATH", path) for op in chosen), f"cat {path}"],
    )
