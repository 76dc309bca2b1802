"""Scale: obsspec's own cost at 16 to 1,024 episodes at once (scheduler, sandboxes, client).

    .venv/bin/python bench/scale.py [--episodes 16 64 256 1024] [--modes sequential speculative]
        [--placements local ray] [--turns 8] [--tool-s 1.0] [--gen-s 0.2] [--out FILE] [--profile N]

Each (episodes, mode) runs in a fresh process: real bubblewrap sandboxes (the recipe's defaults,
deterministic), the vLLM client (obsspec/engines/vllm.py) talking to a stand-in server in a
process of its own that answers every request in `--gen-s` seconds however many are in flight
(bench/standin_server.py: a GPU's latency, so generation is not what is measured), and a tool
that takes a little over `--tool-s` seconds: the command's real time in the sandbox plus an
EMULATED wait of `--tool-s`. Tasks come in groups of siblings as in GRPO (16 tasks, episodes/16 each). Speculative
runs use the tiered predictor (history, siblings, then the stand-in's world model). With
`--placements ray` the same runs also go to a Ray cluster this script starts on this machine (a
head without CPUs and two worker nodes: `sandbox.placement: ray`); their sandboxes' CPU is not
this process's children's, so `sandbox_cpu_ms_per_turn` is left out for them.

Per run it reports, from counts and resource usage (figures the machine's noise cannot move):
- `cpu_ms_per_turn`: this process's CPU (user + system, getrusage) over the batch per committed
  turn: the scheduler, the client, the sandbox harness, tokenization, events, metrics;
- `sandbox_cpu_ms_per_turn`: CPU of the sandboxes' processes per command (bwrap, the supervisor
  and runner shells, the re-stamping, and the agent's commands themselves, which are cheap here;
  each episode's start, verifier and close spread over its commands);
- `own_share_of_tool`: cpu_ms_per_turn / the tool's time (target <= 5 % at 256 episodes);
- `rss_mb_per_episode` (this process's peak over its size before the batch) and `sandbox_pss_mb_per_episode` (the
  sandboxes' proportional set size at the peak), `peak_fds`;
- `starts_per_s`, `closes_per_s` (all sandboxes of the batch over the span they took),
  `start_s_p50/p95` (one start's latency under that load);
- `loop_lag_ms` p50/p99/max: how late a 10 ms timer fires on the event loop (and
  `loop_lag_ms_after_starts`: once every sandbox has started);
- `command_ms_mean`: a command's own time (the tool's time less the emulated wait) and, on Ray,
  `hop_ms_mean`: of that, the hop to the worker and back (round trip less the sandbox's time);
- `episodes_per_s`, `turn_s_mean` (wall clock: these move with the machine's load).
`--profile N` prints the N functions of this process with the most own CPU time (cProfile).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOKENIZER = os.path.join(ROOT, "obsspec", "bases", "tiny-cpu", "policy")
GROUPS = 16  # distinct tasks; the rest of the episodes are their GRPO siblings


# ---------------------------------------------------------------------------------------------
# One run (its own process)


class LoopLag:
    """How late a 10 ms timer fires on the running loop."""

    def __init__(self, period: float = 0.01):
        self.period, self.late, self.at = period, [], []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(self.period)
            self.late.append(loop.time() - t - self.period)
            self.at.append(time.monotonic())


def timed_tools(sandbox, latency, spans: dict):
    """SandboxTools whose start and close spans land in `spans` (episode -> [t0, t1, c0, c1])."""
    from obsspec.rollout.tools import SandboxTool

    class Timed(SandboxTool):
        async def start(self):
            t0 = time.monotonic()
            await super().start()
            spans[self.episode] = [t0, time.monotonic(), 0.0, 0.0]

        async def close(self):
            t0 = time.monotonic()
            await super().close()
            if self.episode in spans and not spans[self.episode][2]:
                spans[self.episode][2:] = [t0, time.monotonic()]

    return lambda task, episode: Timed(task, episode, sandbox, latency)


def lag_after(lag: LoopLag, t: float) -> dict:
    late = [x for x, at in zip(lag.late, lag.at) if at > t]
    return {"p50": round(1000 * pct(late, 0.5), 2), "p99": round(1000 * pct(late, 0.99), 2),
            "max": round(1000 * max(late, default=0.0), 2)}


def rate(n: int, begin: list[float], end: list[float]) -> float | None:
    span = max(end) - min(begin) if begin and end else 0
    return round(n / span, 1) if span > 0 else None


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


async def one_run(n: int, mode: str, url: str, args, prof=None) -> dict:
    import dataclasses

    from transformers import AutoTokenizer

    from obsspec.engines.vllm import VLLMEngine
    from obsspec.env.sandbox import SandboxConfig
    from obsspec.env.suite import TasksConfig, generate_builtin
    from obsspec.rollout.batch import run_episodes
    from obsspec.rollout.predictors import WithHistory, WorldModelPredictor
    from obsspec.rollout.scheduler import Sampling
    from obsspec.rollout.tools import EmulatedLatency
    from obsspec.tokens import ChatFormat

    fmt = ChatFormat(AutoTokenizer.from_pretrained(TOKENIZER))
    policy = VLLMEngine(url, "policy")
    sandbox = SandboxConfig()
    if args.ray:
        from obsspec.env.ray_sandbox import connect

        sandbox = dataclasses.replace(sandbox, placement="ray",
                                      ray=dataclasses.replace(sandbox.ray, address=args.ray))
        connect(args.ray)  # (joining the cluster is once per process: not part of the batch)
    base, _ = generate_builtin(TasksConfig(num_instances=GROUPS))
    tasks = [base[i % len(base)] for i in range(n)]
    tasks.sort(key=lambda t: t.task_id)  # siblings side by side, as GRPO repeats each prompt
    # the tool: the command's own time plus an emulated wait, `tool_s` in all
    latency = EmulatedLatency("fixed", args.tool_s)
    predictor = None
    if mode == "speculative":
        wm = VLLMEngine(url, "world-model")
        predictor = WithHistory(WorldModelPredictor(wm, fmt, cap=sandbox.output_cap, max_tokens=256))
    sampling = Sampling(max_turns=args.turns + 1, max_new_tokens=256, max_context=1 << 15, seed=0)
    spans: dict[int, list[float]] = {}
    rss_before = rss_kb(os.getpid())
    lag = LoopLag()
    lag_task = asyncio.ensure_future(lag.run())
    self0, kids0, t0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN), \
        time.monotonic()
    if prof is not None:
        prof.enable()
    batch = await run_episodes(policy, fmt, tasks, timed_tools(sandbox, latency, spans), sampling,
                               cap=sandbox.output_cap, speculative=mode == "speculative", predictor=predictor)
    wall = time.monotonic() - t0
    if prof is not None:
        prof.disable()
    self1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    lag_task.cancel()
    cpu = (self1.ru_utime - self0.ru_utime) + (self1.ru_stime - self0.ru_stime)
    kids = (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
    turns = sum(len(tr.turns) for tr in batch.trajectories)
    bash_turns = sum(1 for tr in batch.trajectories for t in tr.turns if t.kind == "bash")
    starts = [s for s in spans.values()]
    tool_mean = statistics.fmean(batch.metrics.tool_sec) if batch.metrics.tool_sec else 0.0
    summary = batch.metrics.summary()
    hop = summary["tool_hop_sec_mean"]
    return {
        "episodes": n, "mode": mode, "placement": sandbox.placement, "turns": turns, "bash_turns": bash_turns,
        "infra_failures": sum(1 for tr in batch.trajectories if tr.infra_error),
        # (each distinct error, digits dropped so that one cause counts once)
        "infra_errors": dict(Counter(re.sub(r"\d+", "N", tr.infra_error)[:160]
                                     for tr in batch.trajectories if tr.infra_error)),
        "cpu_s": round(cpu, 2), "sandbox_cpu_s": round(kids, 2),
        "cpu_ms_per_turn": round(1000 * cpu / turns, 2),
        "sandbox_cpu_ms_per_turn": None if args.ray else round(1000 * kids / max(1, bash_turns), 2),
        "own_share_of_tool": round(cpu / turns / args.tool_s, 4),
        "tool_s_mean": round(tool_mean, 3),
        "command_ms_mean": round(1000 * (tool_mean - args.tool_s), 2),
        "hop_ms_mean": round(1000 * hop, 2) if hop else None,
        "starts_per_s": rate(len(starts), [s[0] for s in starts], [s[1] for s in starts]),
        "closes_per_s": rate(len(starts), [s[2] for s in starts if s[3]], [s[3] for s in starts if s[3]]),
        "start_s_p50": round(pct([s[1] - s[0] for s in starts], 0.5), 3),
        "start_s_p95": round(pct([s[1] - s[0] for s in starts], 0.95), 3),
        "loop_lag_ms": {"p50": round(1000 * pct(lag.late, 0.5), 2), "p99": round(1000 * pct(lag.late, 0.99), 2),
                        "max": round(1000 * max(lag.late, default=0.0), 2)},
        "loop_lag_ms_after_starts": lag_after(lag, max(s[1] for s in starts)),
        "wall_s": round(wall, 2), "episodes_per_s": round(n / wall, 2),
        "turn_s_mean": round(statistics.fmean(tr.latency_sec / max(1, len(tr.turns)) for tr in batch.trajectories), 3),
        "spec_exact_frac": summary["spec/exact_frac"],
        "maxrss_mb": round(self1.ru_maxrss / 1024, 1),
        "rss_mb_per_episode": round(max(0, self1.ru_maxrss - rss_before) / 1024 / n, 3),
    }


def child_main(args) -> None:
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile(time.process_time)  # CPU time: wall time would count waits
        result = asyncio.run(one_run(args.child, args.mode, args.url, args, prof))
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(args.profile)
    else:
        result = asyncio.run(one_run(args.child, args.mode, args.url, args))
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------
# The driver: a stand-in server, one process per run, and a sampler of that process from outside


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
    except OSError:
        return 0


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except OSError:
        return 0


def measure(n: int, mode: str, url: str, args, ray: str = "") -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", str(n), "--mode", mode, "--url", url,
           "--turns", str(args.turns), "--tool-s", str(args.tool_s), *(["--ray", ray] if ray else [])]
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    peak_fds, peak_pss, peak_procs, last_pss = 0, 0, 0, 0.0
    while proc.poll() is None:
        time.sleep(1.0)
        try:
            peak_fds = max(peak_fds, len(os.listdir(f"/proc/{proc.pid}/fd")))
        except OSError:
            pass
        if time.monotonic() - last_pss > 5:  # (every sandbox process: not every second)
            tree = descendants(proc.pid)
            if len(tree) >= peak_procs:
                peak_procs, peak_pss = len(tree), sum(pss_kb(p) for p in tree)
            last_pss = time.monotonic()
    out = proc.stdout.read().strip().splitlines()
    if proc.returncode != 0 or not out:
        raise SystemExit(f"run of {n} {mode} episodes failed (exit {proc.returncode})")
    result = json.loads(out[-1])
    result.update(peak_fds=peak_fds, sandbox_processes_peak=peak_procs,
                  sandbox_pss_mb_per_episode=round(peak_pss / 1024 / max(1, n), 3) if not ray else None)
    return result


def ray_cluster(episodes: int):
    """A head without CPUs and two worker nodes on this machine's loopback address, each with
    room for every episode's sandbox (1 CPU each: logical CPUs, as Ray counts them)."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # (loopback only; read at Ray's import)
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=episodes)
    return cluster


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--modes", nargs="+", default=["sequential", "speculative"])
    ap.add_argument("--placements", nargs="+", default=["local"], choices=["local", "ray"])
    ap.add_argument("--turns", type=int, default=8, help="commands per episode (then done())")
    ap.add_argument("--tool-s", type=float, default=1.0, help="seconds a command takes (real + EMULATED)")
    ap.add_argument("--gen-s", type=float, default=0.2, help="seconds the stand-in takes per generation")
    ap.add_argument("--out", default="", help="also write the JSON here")
    ap.add_argument("--profile", type=int, default=0, help="print the N most expensive functions")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="sequential", help=argparse.SUPPRESS)
    ap.add_argument("--url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ray", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_main(args)
    sys.path.insert(0, HERE)
    from provenance import emit, stamp

    server = subprocess.Popen([sys.executable, os.path.join(HERE, "standin_server.py"), "--tokenizer", TOKENIZER,
                               "--gen-s", str(args.gen_s), "--turns", str(args.turns)],
                              stdout=subprocess.PIPE, text=True)
    cluster = None
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        if "ray" in args.placements:
            cluster = ray_cluster(max(args.episodes))
        runs = []
        for n in args.episodes:
            for mode in args.modes:
                for placement in args.placements:
                    runs.append(measure(n, mode, url, args, cluster.address if placement == "ray" else ""))
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait()
        if cluster is not None:
            cluster.shutdown()
    emit({**stamp(), "turns": args.turns, "tool_s": args.tool_s, "gen_s": args.gen_s,
          "cores": os.cpu_count(), "runs": runs}, args.out)


if __name__ == "__main__":
    main()
