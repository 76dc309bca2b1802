"""Draft latency with and without the hf engine's block prefix cache, on the same steps, same run.

    PYTHONPATH=$PWD .venv/bin/python bench/prefix_cache.py --kit .cache/kit/kit-XXXX --tasks runs/tasks \
        [--rollouts VAL.warm.trajectories.jsonl] [--limit 40] [--rounds 3] [--cache-tokens 32768] [--block 64] \
        [--draft-tokens 320] [--out result.json] [--plot out.png] [recipe overrides ...]

The kit's world-model base drafts every step of the val reference trajectories (and of recorded
val episodes, `python bench/evaluate_models.py ... --out` writes them), greedy, 4 drafts in
flight, steps in episode order as a rollout asks for them, with the recipe's
world_model.prompt_lookup. Each round runs both settings on a fresh engine, in alternating order
(these machines are noisy: read the ratios, per round and median). Reported per setting: mean
draft time, the engine's prefill and decode seconds, prompt tokens reused from the cache, and the
exact-match rate (prefill block by block does the same arithmetic as one pass on other shapes:
the drafts may differ in rare near-ties, and the rates show whether they do). The tool side of
the ratio is the recorded tool time of the rollout steps plus the recipe's emulated latency mean.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from bench.worldmodel_adapter import emulated_mean
from obsspec.config import load_recipe
from obsspec.engines.hf import HFEngine
from obsspec.env.suite import load_tasks, spread
from obsspec.worldmodel.cases import reference_cases, trajectory_cases
from obsspec.worldmodel.evaluate import evaluate_world_model
from obsspec.models.kit import KitPaths, read_trajectories
from obsspec.models.tiny import load_pretrained
from obsspec.build import workspace_snapshots
from obsspec.rollout.trajectory import Trajectory
from obsspec.tokens import ChatFormat


async def one_setting(model, tokenizer, fmt, cases, recipe, cache_tokens: int, block: int,
                      draft_tokens: int) -> dict:
    options = {**recipe.world_model.hf_options, "prefix_cache_tokens": cache_tokens}
    async with HFEngine(model, tokenizer, batch_invariant=False, prefix_block=block, **options) as engine:
        t0 = time.monotonic()
        result = await evaluate_world_model(engine, fmt, cases, recipe.sandbox.output_cap, draft_tokens)
        wall = time.monotonic() - t0
        stats, cache = engine.stats, engine.prefix_cache
    return {"draft_sec_mean": result["draft_sec_mean"], "wall_sec": round(wall, 2),
            "prefill_sec": round(stats.prefill_sec, 2), "decode_sec": round(stats.decode_sec, 2),
            "prompt_tokens": stats.prefill_tokens,
            "prompt_tokens_reused": cache.hit_tokens if cache else 0,
            "exact_frac": result["exact_frac"], "unusable_frac": result["unusable_frac"],
            "per_class": result["per_class"], "tool_sec_mean": result["tool_sec_mean"]}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    labels = ["off", "on"]
    rounds = result["rounds"]
    for part, color in (("prefill_sec", "tab:blue"), ("decode_sec", "tab:orange")):
        bottom = [0.0, 0.0] if part == "prefill_sec" else [statistics.median(r[m]["prefill_sec"] for r in rounds)
                                                          for m in labels]
        ax.bar(labels, [statistics.median(r[m][part] for r in rounds) for m in labels], bottom=bottom,
               color=color, label=part.replace("_sec", ""))
    ax.set_ylabel("engine seconds (median of rounds)")
    ax.set_title(f"prefix cache: drafts {result['draft_speedup_median']}x faster, "
                 f"{result['steps']} steps")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kit", required=True, help="a built kit folder (kit-<key>)")
    p.add_argument("--tasks", required=True, help="the prepared suite the kit was built from")
    p.add_argument("--rollouts", default="", help="recorded val episodes whose steps are drafted too")
    p.add_argument("--limit", type=int, default=40, help="val reference trajectories drafted")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cache-tokens", type=int, default=32768, help="world_model.prefix_cache_tokens when on")
    p.add_argument("--block", type=int, default=64, help="tokens per cached block")
    p.add_argument("--draft-tokens", type=int, default=320, help="draft cap (longer: unusable)")
    p.add_argument("--recipe", default="recipes/tiny-cpu.yaml")
    p.add_argument("--out", default="")
    p.add_argument("--plot", default="")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()

    recipe = load_recipe(args.recipe, args.overrides)
    model, tokenizer = load_pretrained(KitPaths.under(args.kit).world_model)
    fmt = ChatFormat(tokenizer)
    rows = spread([r for r in read_trajectories(args.tasks) if r.get("split") == "val"], args.limit)
    episodes = []
    if args.rollouts:
        with open(args.rollouts) as f:
            episodes = [Trajectory.from_dict(json.loads(line)) for line in f if line.strip()]
    snapshots = None
    builder = workspace_snapshots(fmt, recipe.world_model, recipe.sandbox)
    if builder is not None:
        ids = {r["task_id"] for r in rows} | {e.task_id for e in episodes}
        snapshots = asyncio.run(builder.table([t for t in load_tasks(args.tasks) if t.task_id in ids]))
    reference = reference_cases(fmt, rows, snapshots)
    cases = reference + trajectory_cases(fmt, episodes, snapshots)

    rounds = []
    for i in range(args.rounds):
        order = ("off", "on") if i % 2 == 0 else ("on", "off")
        r = {m: asyncio.run(one_setting(model, tokenizer, fmt, cases, recipe,
                                        args.cache_tokens if m == "on" else 0, args.block,
                                        args.draft_tokens))
             for m in order}
        r["draft_speedup"] = round(r["off"]["draft_sec_mean"] / r["on"]["draft_sec_mean"], 2)
        rounds.append(r)
        print(json.dumps({"round": i, "off": r["off"]["draft_sec_mean"], "on": r["on"]["draft_sec_mean"],
                          "speedup": r["draft_speedup"]}), flush=True)
    tool = [c.tool_sec for c in cases if c.tool_sec > 0]
    tool_mean = (statistics.fmean(tool) if tool else 0.0) + emulated_mean(recipe.rollout.latency)
    median = {m: statistics.median(r[m]["draft_sec_mean"] for r in rounds) for m in ("off", "on")}
    result = {
        "command": "bench/prefix_cache.py " + " ".join(sys.argv[1:]),
        "kit": args.kit, "steps": len(cases), "reference_steps": len(reference),
        "prompt_tokens_mean": round(statistics.fmean(len(c.prompt_ids) for c in cases), 1),
        "prompt_lookup": recipe.world_model.prompt_lookup, "cache_tokens": args.cache_tokens, "block": args.block,
        "rounds": rounds,
        "draft_sec_median": median,
        "draft_speedup_median": round(statistics.median(r["draft_speedup"] for r in rounds), 2),
        "tool_sec_mean_with_emulated": round(tool_mean, 3),
        "tool_over_draft": {m: round(tool_mean / median[m], 1) for m in median},
        "exact_frac": {m: rounds[0][m]["exact_frac"] for m in ("off", "on")},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
