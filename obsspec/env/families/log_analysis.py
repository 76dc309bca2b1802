"""log-analysis: answer questions about web access logs and application logs with awk/sort/uniq.

Access logs are in the combined format (user agents contain spaces, so only the fields before
them are safe to split on). Variants: requests per status code, top client IPs, number of 5xx
responses, the distinct paths that returned 404, and ERROR lines per component of an app log.
Rankings are built with distinct counts, so they have no ties.
"""

from __future__ import annotations

import random

from obsspec.env.families._text_helpers import (FILE_STEMS, WORDS, distinct_counts, verify_lines,
                                                verify_numbers)
from obsspec.env.task import Task

NAME = "log-analysis"

AGENTS = ["Mozilla/5.0 (X11; Linux x86_64) Firefox/121.0", "curl/8.4.0", "python-requests/2.31",
          "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_2) Safari/605.1", "Googlebot/2.1"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def _access_log(rng: random.Random, ips: list[str]) -> tuple[str, list[tuple[str, str, int]]]:
    day, mon = rng.randint(1, 28), rng.choice(MONTHS)
    paths = sorted({f"/{rng.choice(FILE_STEMS)}"
                    + rng.choice(["", ".html", f"/{rng.randint(1, 50)}"])
                    for _ in range(12)})
    codes = rng.sample([200, 200, 200, 201, 204, 301, 302, 304, 400, 403, 404, 404, 500, 502,
                        503], 7)
    codes += [404, 500]
    reqs, lines, t = [], [], rng.randint(0, 3000)
    for ip in ips:
        path, code = rng.choice(paths), rng.choice(codes)
        t += rng.randint(1, 90)
        method = "POST" if code == 201 else rng.choice(["GET", "GET", "GET", "HEAD"])
        stamp = f"{day:02d}/{mon}/2024:{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}"
        lines.append(f'{ip} - - [{stamp} +0000] "{method} {path} HTTP/1.1" {code} '
                     f'{rng.randint(0, 9000)} "-" "{rng.choice(AGENTS)}"')
        reqs.append((ip, path, code))
    return "\n".join(lines) + "\n", reqs


def generate(rng: random.Random, task_id: str) -> Task:
    mode = rng.choice(["status", "top_ips", "5xx", "404", "component"])
    out = rng.choice(["answer.txt", "report.txt", "result.txt"])
    if mode == "component":
        path = rng.choice(["app.log", "service.log", "worker.log"])
        comps = rng.sample(["auth", "billing", "cache", "db", "mailer", "queue", "scheduler",
                            "api"], 6)
        errs = distinct_counts(rng, rng.randint(3, 5), 1, 15)
        events = [(c, "ERROR") for c, n in zip(comps, errs) for _ in range(n)]
        events += [(rng.choice(comps), rng.choice(["INFO", "INFO", "WARN", "DEBUG"]))
                   for _ in range(rng.randint(30, 90))]
        rng.shuffle(events)
        date = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        lines = [f"{date} {8 + i // 60:02d}:{i % 60:02d}:{i * 7 % 60:02d} {lvl} [{c}] "
                 + " ".join(rng.sample(WORDS, 4)) for i, (c, lvl) in enumerate(events)]
        files = {path: "\n".join(lines) + "\n"}
        ask = (f"/app/{path} is an application log (`date time LEVEL [component] message`). "
               f"Count the ERROR lines per component. Write `<component> <count>` lines "
               f"(space-separated) to /app/{out}, most errors first; leave out components "
               f"without errors.")
        expected = list(zip(comps, errs))
        act = (f"grep ' ERROR ' {path} | awk '{{print $4}}' | tr -d '[]' | sort | uniq -c "
               f"| sort -rn | awk '{{print $2, $1}}' > {out}")
        verify = verify_numbers(out, expected)
        return Task(task_id=task_id, family=NAME, instruction=ask, files=files, verify=verify,
                    solution=[f"head -5 {path}", act, f"cat {out}"])

    path = rng.choice(["access.log", "nginx_access.log", "web.log"])
    pool = sorted({f"10.{rng.randint(0, 9)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
                   for _ in range(12)})
    rng.shuffle(pool)
    top = rng.randint(3, 5)
    counts = distinct_counts(rng, top, 8, 25)
    counts += [rng.randint(1, counts[-1] - 1) for _ in pool[top:]]
    ips = [ip for ip, n in zip(pool, counts) for _ in range(n)]
    rng.shuffle(ips)
    text, reqs = _access_log(rng, ips)
    where = f"/app/{path} is a web server access log in the usual combined format."
    if mode == "status":
        codes = sorted({c for _, _, c in reqs})
        expected = [(str(c), sum(1 for *_, x in reqs if x == c)) for c in codes]
        ask = (f"{where} Count the requests per HTTP status code. Write `<code> <count>` lines "
               f"(space-separated) to /app/{out}, sorted by status code.")
        act = (f"awk '{{print $9}}' {path} | sort | uniq -c | awk '{{print $2, $1}}' "
               f"| sort -n > {out}")
        verify = verify_numbers(out, expected)
    elif mode == "top_ips":
        expected = list(zip(pool[:top], counts[:top]))
        ask = (f"{where} Which {top} client IP addresses made the most requests? Write `<ip> "
               f"<count>` lines (space-separated) to /app/{out}, busiest first.")
        act = (f"awk '{{print $1}}' {path} | sort | uniq -c | sort -rn | head -{top} "
               f"| awk '{{print $2, $1}}' > {out}")
        verify = verify_numbers(out, expected)
    elif mode == "5xx":
        expected = [("", sum(1 for *_, c in reqs if c >= 500))]
        ask = (f"{where} How many requests got a server error (a 5xx status)? Write just the "
               f"number to /app/{out}.")
        act = f"awk '$9 >= 500' {path} | wc -l > {out}"
        verify = verify_numbers(out, expected)
    else:
        expected = sorted({p for _, p, c in reqs if c == 404})
        ask = (f"{where} List the distinct request paths that got a 404 response, one per line, "
               f"sorted, without duplicates, in /app/{out}.")
        act = f"awk '$9 == 404 {{print $7}}' {path} | sort -u > {out}"
        verify = verify_lines(out, expected, order="sorted")
    return Task(task_id=task_id, family=NAME, instruction=ask, files={path: text}, verify=verify,
                solution=[f"head -3 {path}", act, f"cat {out}"])
