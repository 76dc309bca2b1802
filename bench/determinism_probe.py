"""Which everyday commands print the same thing in two fresh sandboxes, and which do not.

    .venv/bin/python bench/determinism_probe.py [--runs 3]

`prepare-tasks` measures determinism on the reference solutions; agents type more than that.
This probe runs a fixed list of commands agents commonly use (after a little file activity) in
`--runs` fresh sandboxes and prints, as JSON, the fraction that were byte-identical across runs
and each differing command with its first two outputs. The same list with
`sandbox.deterministic=false` is the baseline, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from obsspec.env.sandbox import Sandbox, SandboxConfig

SETUP = ["mkdir -p src && printf 'a\\nb\\n' > src/x.txt", "cp src/x.txt src/y.txt; touch new.log"]
PROBES = [
    "ls -la", "ls -la src", "ls -l --time-style=full-iso src", "find . -newer src/x.txt",
    "find . -mmin -5", "stat -c '%n %s %y' src/x.txt", "du -sh .", "ls -la ~", "ls -la /tmp",
    "ls -la /", "date", "date +%s", "whoami; id; hostname; uname -n", "uname -a", "echo $HOME $USER $PWD",
    "env | sort", "ps aux", "ps -e -o pid,comm", "echo $$; sleep 0 & echo $!", "echo $RANDOM",
    "python3 -c 'import random; print(random.random())'", "python3 -c 'import time; print(time.time())'",
    "mktemp", "touch t1 && ls -l t1", "stat -c %z src/x.txt", "df -h .", "free -m", "nproc",
    "cat /proc/loadavg", "uptime", "cat /etc/os-release | head -2", "python3 --version",
    "git init -q r && cd r && git config user.email a@b && git config user.name a && "
    "git commit -q --allow-empty -m m && git log --format='%H %ad'",
    "tar czf a.tgz src && md5sum a.tgz", "zip -q a.zip src/x.txt && md5sum a.zip",
    "gzip -k src/y.txt && md5sum src/y.txt.gz", "time ls >/dev/null",
]


async def outputs(config: SandboxConfig) -> list[bytes]:
    async with Sandbox(config) as sb:
        await sb.start()
        for c in SETUP:
            await sb.run(c)
        return [(await sb.run(c)).output for c in PROBES]


async def measure(config: SandboxConfig, runs: int) -> dict:
    results = [await outputs(config) for _ in range(runs)]
    differing = [{"command": c, "first": results[0][i].decode("utf-8", "replace")[:300],
                  "second": results[1][i].decode("utf-8", "replace")[:300]}
                 for i, c in enumerate(PROBES) if len({r[i] for r in results}) > 1]
    return {"commands": len(PROBES), "runs": runs,
            "identical_fraction": 1 - len(differing) / len(PROBES),
            "differing": differing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    det = asyncio.run(measure(SandboxConfig(), args.runs))
    base = asyncio.run(measure(SandboxConfig(deterministic=False), args.runs))
    print(json.dumps({"deterministic": det, "baseline_not_deterministic": {
        "identical_fraction": base["identical_fraction"],
        "differing_commands": [d["command"] for d in base["differing"]]}}, indent=2))


if __name__ == "__main__":
    main()
