"""The vLLM layout against the hf engine, side by side: same tiny bases, tasks and seeds.

    .venv/bin/python bench/vllm_layout.py [--tasks DIR] [--num-tasks 8] [--pairs 3] [--out result.json] [--plot f.png]

Needs `make install-vllm`. Two parts, printed as one JSON with its command, commit and date:

1. Throughput: the same 8 prompts (64 new tokens each, T 0.7, fixed seeds) through the shipped
   tiny policy on the hf engine in this process (batch-invariant, as tiny-cpu.yaml runs it, and
   batched) and on a vLLM server (one core, as tiny-cpu-vllm.yaml starts it), one at a time and
   all 8 at once: tokens/s, and vLLM's ratio to each hf mode.
2. Rollouts: `obsspec rollout --mode both` with recipes/tiny-cpu.yaml and recipes/tiny-cpu-vllm.yaml
   on the same val tasks and seeds (the bases' suite by default): hit rate (all predictors, and
   the world model's own drafts), the net latency reduction over alternating pairs with its 95 %
   interval, token identity, draft and tool times. Each reduction is measured within its own
   recipe (pairs alternate), so machine noise moves it less than a comparison across recipes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from provenance import stamp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from obsspec.build import server_specs_for  # noqa: E402
from obsspec.config import load_recipe  # noqa: E402
from obsspec.engines.base import GenerationRequest  # noqa: E402
from obsspec.engines.server import Servers  # noqa: E402
from obsspec.models.bases import bases_dir  # noqa: E402

PROMPTS = ["Count the lines of every .txt file.", "List the files by size.", "Find notes.txt.",
           "Rename every .log file to .txt.", "Print the ten most frequent words.",
           "Remove duplicate lines from data.csv.", "Move each file into a folder by type.",
           "Show the errors in app.log."]
NEW_TOKENS = 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def tokens_per_second(engine, prompts: list[tuple[int, ...]], concurrency: int) -> float:
    async def one(i: int):
        return await engine.generate(GenerationRequest(prompts[i], max_new_tokens=NEW_TOKENS, temperature=0.7,
                                                       seed=i, request_id=f"b{i}-{time.monotonic_ns()}"))

    await one(0)  # warm-up
    t0 = time.perf_counter()
    tokens = 0
    for start in range(0, len(prompts), concurrency):
        done = await asyncio.gather(*(one(i) for i in range(start, min(len(prompts), start + concurrency))))
        tokens += sum(len(g.token_ids) for g in done)
    return tokens / (time.perf_counter() - t0)


def throughput() -> dict:
    from obsspec.engines.hf import HFEngine
    from obsspec.engines.vllm import VLLMEngine
    from obsspec.models.tiny import load_pretrained

    policy = os.path.join(bases_dir("tiny-cpu"), "policy")
    model, tokenizer = load_pretrained(policy)
    prompts = [tuple(tokenizer.encode(p)) for p in PROMPTS]
    out: dict = {}
    for name, invariant in (("hf_invariant", True), ("hf_batched", False)):
        engine = HFEngine(model, tokenizer, batch_invariant=invariant)
        try:
            out[name] = {c: round(asyncio.run(tokens_per_second(engine, prompts, c)), 1) for c in (1, 8)}
        finally:
            engine.close()
    recipe = load_recipe(os.path.join(ROOT, "recipes", "tiny-cpu-vllm.yaml"),
                         [f"policy.server_url=http://127.0.0.1:{free_port()}", "world_model.engine=hf",
                          "world_model.prompt_lookup=0"])
    specs = server_specs_for(recipe, policy, "")
    with tempfile.TemporaryDirectory() as logs, Servers(specs, logs):
        engine = VLLMEngine(specs[0].url, policy)
        out["vllm"] = {c: round(asyncio.run(tokens_per_second(engine, prompts, c)), 1) for c in (1, 8)}
    for hf in ("hf_invariant", "hf_batched"):
        out[f"vllm_over_{hf}"] = {c: round(out["vllm"][c] / out[hf][c], 2) for c in (1, 8)}
    return out


def rollouts(recipe: str, tasks: str, num_tasks: int, pairs: int, out_dir: str) -> dict:
    t0 = time.monotonic()
    r = subprocess.run([os.path.join(ROOT, ".venv", "bin", "obsspec"), "rollout", recipe, "--mode", "both",
                        f"rollout.tasks_dir={tasks}", f"rollout.num_tasks={num_tasks}", f"rollout.pairs={pairs}",
                        "--out", out_dir, "--display", "none"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{recipe}: rollout failed: {r.stderr[-2000:]}")
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    spec, comp = summary["modes"]["speculative"], summary["comparison"]
    return {"wall_sec": round(time.monotonic() - t0, 1), "episodes": summary["episodes"],
            "hit_rate": spec.get("spec/exact_frac"), "hit_rate_world_model": spec.get("spec/exact_frac_wm"),
            "draft_sec_mean": spec.get("spec/wm_sec_mean"), "tool_sec_mean": spec.get("tool_sec_mean"),
            "latency_mean_sequential_sec": comp.get("latency_mean_sequential_sec"),
            "latency_mean_speculative_sec": comp.get("latency_mean_speculative_sec"),
            **{k: comp.get(k) for k in ("mean_latency_reduction", "reduction_ci95", "reduction_per_pair",
                                         "verdict", "token_identical", "episodes_differing")}}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    names = ["hf_invariant", "hf_batched", "vllm"]
    for k, c in enumerate((1, 8)):
        a.bar([i + 0.4 * k for i in range(3)], [result["throughput"][n][c] for n in names], 0.4,
              label=f"{c} at once")
    a.set_xticks([i + 0.2 for i in range(3)], names)
    a.set_ylabel("tokens/s (tiny policy, CPU)")
    a.legend()
    recipes = list(result["rollouts"])
    red = [result["rollouts"][r]["mean_latency_reduction"] or 0 for r in recipes]
    half = [result["rollouts"][r]["reduction_ci95"] or 0 for r in recipes]  # (a half-width)
    b.bar(recipes, red, yerr=half, capsize=6)
    b.axhline(0, color="black", lw=0.5)
    b.set_ylabel("mean latency reduction (95 % interval)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default=os.path.join(ROOT, ".cache", "bases", "tiny-cpu-bases", "tasks"),
                    help="a prepared suite the bases were built for (default: the bases' build suite)")
    ap.add_argument("--num-tasks", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument("--plot", default="")
    args = ap.parse_args()
    result = {**stamp(), "machine": f"{os.cpu_count()} cores", "throughput": throughput(), "rollouts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in ("recipes/tiny-cpu.yaml", "recipes/tiny-cpu-vllm.yaml"):
            result["rollouts"][os.path.basename(recipe)] = rollouts(
                recipe, args.tasks, args.num_tasks, args.pairs, os.path.join(tmp, os.path.basename(recipe)))
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
