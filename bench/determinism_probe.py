"""Which everyday commands print the same thing in two fresh sandboxes, and which do not.

    .venv/bin/python bench/determinism_probe.py [--runs 3]

`prepare-tasks` measures determinism on the reference solutions; agents type more than that.
This probe runs a fixed list of commands agents commonly use (after a little file activity) in
`--runs` fresh sandboxes and prints, as JSON, the fraction that were byte-identical across runs
and each differing command with its first two outputs. The same list with
`sandbox.deterministic=false` is the baseline, measured in the same run.

`PIPELINES` are the races seen in real rollouts (issue 9): several pipeline stages writing to
stderr at once (interleaved mid-line without line buffering, whole lines in either order across
CPUs), background output landing in a later command, and the mount table. Each runs `--repeat`
times in every sandbox, since one race in a few runs is typical.
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
PIPELINES = [
    "head -c 1x src/x.txt | head -c 2y nope.txt",
    "sed 'q;x;bad' src/x.txt | tr a b c | unique",
    "find . -size +x 2>&1 | wc -l; find nope1 nope2 | wc -l",
    "cat nope1 | cat nope2 | cat nope3 | sort nope4",
    "ls nope | grep x nope2 | sort -k nope3 | uniq -z nope4",
    "(sleep 0.05; echo late) & echo now",
    "echo next",
    "cat /proc/self/mountinfo | cut -d' ' -f4,5 | sort",
]


async def outputs(config: SandboxConfig, commands: list[str], repeat: int) -> list[list[bytes]]:
    """Per command, its outputs in one fresh sandbox (run `repeat` times, in order)."""
    async with Sandbox(config) as sb:
        await sb.start()
        for c in SETUP:
            await sb.run(c)
        out: list[list[bytes]] = [[] for _ in commands]
        for _ in range(repeat):
            for i, c in enumerate(commands):
                out[i].append((await sb.run(c)).output)
        return out


async def measure(config: SandboxConfig, runs: int, commands: list[str], repeat: int = 1) -> dict:
    results = [await outputs(config, commands, repeat) for _ in range(runs)]
    differing = []
    for i, c in enumerate(commands):
        seen = [o for r in results for o in r[i]]
        if len(set(seen)) > 1:
            variants = sorted(set(seen), key=seen.index)
            differing.append({"command": c, "variants": len(variants),
                              "first": variants[0].decode("utf-8", "replace")[:300],
                              "second": variants[1].decode("utf-8", "replace")[:300]})
    return {"commands": len(commands), "runs": runs, "repeat": repeat,
            "identical_fraction": 1 - len(differing) / len(commands),
            "differing": differing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10, help="runs of each pipeline per sandbox")
    args = ap.parse_args()
    det = asyncio.run(measure(SandboxConfig(), args.runs, PROBES))
    base = asyncio.run(measure(SandboxConfig(deterministic=False), args.runs, PROBES))
    pipes = asyncio.run(measure(SandboxConfig(), args.runs, PIPELINES, args.repeat))
    print(json.dumps({"deterministic": det, "baseline_not_deterministic": {
        "identical_fraction": base["identical_fraction"],
        "differing_commands": [d["command"] for d in base["differing"]]},
        "pipelines_deterministic": pipes}, indent=2))


if __name__ == "__main__":
    main()
