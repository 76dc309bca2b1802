"""Sandbox overhead: what a command costs in an obsspec sandbox against plain subprocess.

    .venv/bin/python bench/sandbox_overhead.py [--n 200] [--plot out.png] [--out result.json]
    .venv/bin/python bench/sandbox_overhead.py --compare-podman [--n 50]   # podman vs bwrap
    .venv/bin/python bench/sandbox_overhead.py --compare-semantics [--n 50]  # Harbor vs isolated (podman)

Prints JSON with medians (ms) for running `true`:
- `subprocess_bash`:  `bash -c true` with subprocess, no sandbox (the baseline, same run)
- `episode_command`:  one command in a running episode (persistent shell, restamping, faketime)
- `fresh_sandbox`:    start a sandbox, run `true`, close it (episode setup + one command)
- `episode_setup`:    start() alone with a 10-file workspace and a small setup script
- `episode_verify`:   verify() after one command: kill check, janitor, verifier files, a
                      verifier that runs `true`
and the ratios to the baseline. Machines are noisy: compare ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time

from obsspec.env.podman import Environment
from obsspec.env.sandbox import Sandbox, SandboxConfig
from obsspec.env.semantics import HARBOR
from provenance import stamp

FILES = {f"dir{i % 3}/file{i}.txt": f"line {i}\n" * 20 for i in range(10)}


def median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 3)


def quartiles_ms(samples: list[float]) -> list[float]:
    q = statistics.quantiles(samples, n=4)
    return [round(1000 * q[0], 3), round(1000 * q[2], 3)]


async def measure(n: int, deterministic: bool, backend: str = "bwrap", semantics: str = "") -> dict:
    cfg = SandboxConfig(deterministic=deterministic, backend=backend)
    # (Harbor semantics run in a container of the base image: obsspec/env/semantics.py)
    environment = Environment(semantics=semantics) if semantics else None
    plain = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(["bash", "-c", "true"], check=True)
        plain.append(time.perf_counter() - t)

    in_episode = []
    async with Sandbox(cfg, environment=environment) as sb:
        await sb.start()
        for _ in range(n):
            in_episode.append((await sb.run("true")).seconds)

    fresh, setup, verify = [], [], []
    for _ in range(max(10, n // 5)):
        t = time.perf_counter()
        sb = Sandbox(cfg, environment=environment)
        await sb.start(files=FILES, setup="mkdir -p build && echo ok > build/stamp")
        setup.append(time.perf_counter() - t)
        await sb.run("true")
        fresh.append(time.perf_counter() - t)
        t = time.perf_counter()
        await sb.verify("true", {"test.sh": "true\n"})
        verify.append(time.perf_counter() - t)
        await sb.close()

    base = median_ms(plain)
    result = {
        "subprocess_bash_ms": base,
        "episode_command_ms": median_ms(in_episode),
        "fresh_sandbox_ms": median_ms(fresh),
        "episode_setup_ms": median_ms(setup),
        "episode_verify_ms": median_ms(verify),
    }
    result["episode_command_ratio"] = round(result["episode_command_ms"] / base, 2)
    result["fresh_sandbox_ratio"] = round(result["fresh_sandbox_ms"] / base, 2)
    result["episode_command_iqr_ms"] = quartiles_ms(in_episode)
    result["fresh_sandbox_iqr_ms"] = quartiles_ms(fresh)
    result["episode_setup_iqr_ms"] = quartiles_ms(setup)
    result["episode_verify_iqr_ms"] = quartiles_ms(verify)
    return result


def compare_podman(n: int) -> dict:
    """Per-command and per-episode cost of a podman container against bubblewrap (same run)."""
    got = {b: asyncio.run(measure(n, True, b)) for b in ("bwrap", "podman")}
    keys = ("episode_command_ms", "fresh_sandbox_ms", "episode_setup_ms", "episode_verify_ms")
    return {**got, "podman_over_bwrap": {k: round(got["podman"][k] / got["bwrap"][k], 2) for k in keys}}


def compare_semantics(n: int) -> dict:
    """Harbor semantics against the isolated ones, both in podman (same run): a command relayed
    to the agent's world, a start that builds it, a verification in a view of its own."""
    got = {"isolated": asyncio.run(measure(n, True, "podman")),
           "harbor": asyncio.run(measure(n, True, "podman", HARBOR))}
    keys = ("episode_command_ms", "fresh_sandbox_ms", "episode_setup_ms", "episode_verify_ms")
    return {**got, "harbor_over_isolated": {k: round(got["harbor"][k] / got["isolated"][k], 2) for k in keys}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200, help="commands per measurement")
    ap.add_argument("--plot", default="", help="write a bar chart to this PNG")
    ap.add_argument("--out", default="", help="also write the JSON to this file")
    ap.add_argument("--compare-podman", action="store_true", help="podman vs bwrap (deterministic)")
    ap.add_argument("--compare-semantics", action="store_true", help="Harbor vs isolated semantics (podman)")
    args = ap.parse_args()
    if args.compare_podman:
        out = {**stamp(), **compare_podman(args.n)}
    elif args.compare_semantics:
        out = {**stamp(), **compare_semantics(args.n)}
    else:
        out = {
            **stamp(),
            "deterministic": asyncio.run(measure(args.n, True)),
            "non_deterministic": asyncio.run(measure(args.n, False)),
        }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.plot and not (args.compare_podman or args.compare_semantics):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = ["subprocess_bash_ms", "episode_command_ms", "episode_setup_ms", "fresh_sandbox_ms",
                "episode_verify_ms"]
        fig, ax = plt.subplots(figsize=(7, 3.5))
        modes = ["deterministic", "non_deterministic"]
        for i, mode in enumerate(modes):
            ax.bar([k + i * 0.4 for k in range(len(keys))], [out[mode][k] for k in keys], 0.4, label=mode)
        ax.set_xticks([k + 0.2 for k in range(len(keys))], [k.replace("_ms", "") for k in keys], fontsize=8)
        ax.set_ylabel("median ms")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot)


if __name__ == "__main__":
    main()
