"""sed-replace: in-place substitutions across several files (`sed -i`, `grep -rl | xargs`).

Variants: move every config file under one directory from an old host name to a new one (other
hosts and a backup copy outside the directory must stay as they are), or rename an identifier in
source files as a whole word only (`old_total` and `get_old` must not change).
"""

from __future__ import annotations

import random
import re

from obsspec.env.families._text_helpers import WORDS, one_of, verify_files
from obsspec.env.task import Task

NAME = "sed-replace"

IDENTS = ["count", "total", "buf", "cfg", "retries", "limit", "offset", "user_id", "path", "conn"]


def _host_files(rng: random.Random, old: str, others: list[str]) -> list[str]:
    templates = ["host = {h}", "url: postgres://app@{h}:5432/main", "API_HOST={h}",
                 "server {h}:{p};", "endpoint: https://{h}/v{v}", "ping -c1 {h}"]
    fillers = ["timeout = {p}", "retries: {v}", "log_level = info", "enabled: true",
               "# managed by ops, do not edit by hand", "user = {w}"]
    lines = []
    for tpl in rng.sample(templates, rng.randint(1, 4)) + rng.sample(fillers, rng.randint(1, 4)):
        h = old if rng.random() < 0.6 else rng.choice(others)
        lines.append(tpl.format(h=h, p=rng.randint(80, 9000), v=rng.randint(1, 5),
                                w=rng.choice(WORDS)))
    rng.shuffle(lines)
    return lines


def _code_lines(rng: random.Random, old: str) -> list[str]:
    w = rng.choice(WORDS)
    pool = [f"{old} = load_{w}()", f"result = compute({old}, {w})", f"print({old}_total)",
            f"def get_{old}():", f"    return self.{old}", f"log.info('%s', {old})",
            f"{w}_{old} = {old} + 1", f"if {old} > {rng.randint(1, 99)}:",
            f"{w} = {rng.randint(1, 9)}"]
    return rng.sample(pool, rng.randint(4, len(pool)))


def generate(rng: random.Random, task_id: str) -> Task:
    files: dict[str, str] = {}
    if rng.random() < 0.5:
        svc = rng.choice(["db", "cache", "mq", "api", "auth", "search"])
        dom, dom2 = rng.sample(["example.com", "corp.local", "internal.net", "prod.lan"], 2)
        n = rng.randint(1, 8)
        old, new = f"{svc}{n}.{dom}", f"{svc}{n + rng.randint(1, 9)}.{dom2}"
        others = [f"{svc}{n}0.{dom}", f"{svc}{n}.{dom2}", f"{rng.choice(['web', 'smtp'])}{n}.{dom}"]
        folder = one_of(rng, ["config", "etc", "deploy", "conf"])
        names = ["app.conf", "db.ini", "services.yaml", ".env", "upstream.conf", "worker.yaml",
                 "cron/jobs.conf", "nginx/site.conf"]
        for name in rng.sample(names, rng.randint(3, 6)):
            files[f"{folder}/{name}"] = "\n".join(_host_files(rng, old, others)) + "\n"
        files[f"backup/{folder}-old.conf"] = f"host = {old}\n"
        ask = (f"We are moving from the server `{old}` to `{new}`. Replace every occurrence of "
               f"`{old}` with `{new}` in all files under /app/{folder} (including hidden files and "
               f"subdirectories), editing them in place. Other host names must stay as they are, "
               f"and files outside /app/{folder} must not change.")
        pattern, repl = re.escape(old), new
        sed = f"s/{old.replace('.', '[.]')}/{new}/g"
        look = f"grep -rn '{old}' ."
        act = f"grep -rlF '{old}' {folder} | xargs sed -i '{sed}'"
    else:
        old, new = rng.sample(IDENTS, 2)
        new = rng.choice([new, f"{old}_{rng.choice(['new', 'v2', 'all'])}", f"{new}s"])
        folder = one_of(rng, ["src", "lib", "code", "pkg"])
        for name in rng.sample(["main.py", "util.py", "models.py", "api/views.py", "cli.py",
                                "jobs/worker.py"], rng.randint(2, 5)):
            files[f"{folder}/{name}"] = "\n".join(_code_lines(rng, old)) + "\n"
        files["README.md"] = f"The variable `{old}` is described in the docs.\n"
        ask = (f"Rename the identifier `{old}` to `{new}` in every .py file under /app/{folder}, "
               f"in place. Only whole identifiers change: longer names that contain it, such as "
               f"`{old}_total` or `get_{old}`, must stay as they are. Leave other files alone.")
        pattern, repl = rf"\b{old}\b", new
        look = f"grep -rnw '{old}' {folder}"
        act = f"find {folder} -name '*.py' | xargs sed -i 's/\\b{old}\\b/{new}/g'"
    first = sorted(p for p in files if p.startswith(folder + "/"))[0]
    files[first] += f"# {old} again\n"  # every task needs at least one change
    expected = {p: (re.sub(pattern, repl, t) if p.startswith(folder + "/") else t)
                for p, t in files.items()}
    return Task(task_id=task_id, family=NAME, instruction=ask, files=files,
                verify=verify_files(expected), solution=[look, act, f"grep -rn '{new}' {folder}"])
