"""Throughput of the hf engine: tokens/s at 1, 8 and 32 concurrent requests, batched vs
batch-invariant mode, for a tiny policy-sized and a tiny world-model-sized Qwen3 built from config.

    .venv/bin/python bench/engine_throughput.py                 # ~1-2 min on 2 CPU cores
    .venv/bin/python bench/engine_throughput.py --quick         # seconds
    .venv/bin/python bench/engine_throughput.py --plot engine_throughput.png --threads 1

Prints one JSON object. For each (model, mode, concurrency): wall time, generated tokens, tokens/s
and the ratio to one-at-a-time (concurrency 1: the same kind of requests awaited one after the
other) measured in the same run. It also measures how often batched mode's tokens diverge from
batch-invariant mode's for the same seeded requests (batched mode is not bit-exact).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from obsspec.engines import GenerationRequest, HFEngine

VOCAB = 2048
MODELS = {  # sizes documented in docs/ENGINES.md
    "policy": dict(hidden_size=256, num_hidden_layers=4, intermediate_size=768,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64),
    "world_model": dict(hidden_size=128, num_hidden_layers=2, intermediate_size=384,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32),
}
MODES = {"batched": False, "batch_invariant": True}


def build(name: str):
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, max_position_embeddings=4096, **MODELS[name])
    model = AutoModelForCausalLM.from_config(config).eval()
    return model, sum(p.numel() for p in model.parameters())


def requests(n: int, new_tokens: int, tag: str) -> list[GenerationRequest]:
    """Sampled requests with prompts of 32..95 tokens (different lengths force padding)."""
    out = []
    for i in range(n):
        length = 32 + (i * 37) % 64
        prompt = [(17 * i + 31 * j) % VOCAB for j in range(length)]
        out.append(GenerationRequest(prompt, max_new_tokens=new_tokens, temperature=1.0,
                                     seed=1000 + i, request_id=f"{tag}-{i}"))
    return out


async def measure(engine: HFEngine, concurrency: int, new_tokens: int, solo_requests: int):
    if concurrency == 1:  # one at a time
        batch = requests(solo_requests, new_tokens, "solo")
        start = time.perf_counter()
        gens = [await engine.generate(r) for r in batch]
    else:
        batch = requests(concurrency, new_tokens, f"c{concurrency}")
        start = time.perf_counter()
        gens = await asyncio.gather(*(engine.generate(r) for r in batch))
    wall = time.perf_counter() - start
    return gens, wall, sum(len(g.token_ids) for g in gens)


def divergence(batched, invariant) -> dict:
    """Compare the same seeded requests run concurrently in batched vs batch-invariant mode."""
    diverged, first_positions, max_diff = 0, [], 0.0
    for a, b in zip(batched, invariant):
        if a.token_ids != b.token_ids:
            diverged += 1
            first_positions.append(next(i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids))
                                        if x != y))
        common = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y),
                      len(a.token_ids))
        diffs = [abs(x - y) for x, y in zip(a.logprobs[:common], b.logprobs[:common])]
        max_diff = max([max_diff, *diffs])
    return {"requests": len(batched), "requests_with_different_tokens": diverged,
            "first_divergent_positions": first_positions,
            "max_logprob_diff_before_divergence": max_diff}


async def bench(new_tokens: int, concurrencies: list[int], solo_requests: int) -> dict:
    results, divergences = [], {}
    for name in MODELS:
        model, params = build(name)
        at_max = {}
        for mode, invariant in MODES.items():
            async with HFEngine(model, batch_invariant=invariant, max_batch_size=32) as engine:
                await engine.generate(GenerationRequest([1, 2, 3], max_new_tokens=4))  # warm-up
                one_at_a_time = None
                for c in concurrencies:
                    gens, wall, tokens = await measure(engine, c, new_tokens, solo_requests)
                    tps = tokens / wall
                    one_at_a_time = one_at_a_time or (tps if c == 1 else None)
                    results.append({
                        "model": name, "params": params, "mode": mode, "concurrency": c,
                        "requests": len(gens), "tokens": tokens, "wall_sec": round(wall, 3),
                        "tokens_per_sec": round(tps, 1),
                        "vs_one_at_a_time":
                            round(tps / one_at_a_time, 2) if one_at_a_time else None,
                        "largest_batch": engine.stats.largest_batch,
                    })
                    print(f"# {name:11s} {mode:15s} c={c:<3d} {tps:8.1f} tok/s", flush=True)
                    at_max[mode] = gens
        divergences[name] = divergence(at_max["batched"], at_max["batch_invariant"])
    return {"results": results, "batched_vs_invariant_at_max_concurrency": divergences}


def plot(report: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib is not installed: no plot")
        return
    rows = report["results"]
    groups = sorted({(r["model"], r["mode"]) for r in rows}, key=lambda g: (g[0], g[1]))
    concurrencies = sorted({r["concurrency"] for r in rows})
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(concurrencies)
    for k, c in enumerate(concurrencies):
        values = [next(r["tokens_per_sec"] for r in rows if (r["model"], r["mode"]) == g
                       and r["concurrency"] == c) for g in groups]
        ax.bar([i + k * width for i in range(len(groups))], values, width, label=f"{c} concurrent")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    ax.set_xticklabels([f"{m}\n{mode}" for m, mode in groups])
    ax.set_ylabel("generated tokens / s")
    ax.set_title("hf engine throughput (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"# wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--quick", action="store_true", help="fewer tokens: a smoke run")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per request")
    parser.add_argument("--plot", metavar="PNG", help="draw a bar chart (needs matplotlib)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads for this process (default: torch's choice); "
                             "1 is steadier on a shared machine, where spinning threads collide")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    new_tokens = args.new_tokens or (16 if args.quick else 64)
    solo = 4 if args.quick else 8
    started = time.perf_counter()
    report = asyncio.run(bench(new_tokens, [1, 8, 32], solo))
    report["config"] = {
        "new_tokens_per_request": new_tokens, "prompt_tokens": "32..95", "sampling": "T=1.0",
        "one_at_a_time_requests": solo, "vocab": VOCAB, "models": MODELS,
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "total_sec": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=1))
    if args.plot:
        plot(report, args.plot)


if __name__ == "__main__":
    main()
