"""Divergence in the engine's fast batched mode: sequential vs sequential, and speculative vs sequential.

    .venv/bin/python bench/batch_divergence.py [--recipe recipes/tiny-cpu.yaml] [key=value ...]

In batched mode floating-point results can depend on which requests share a batch, so even two
*sequential* runs with the same seeds may diverge. Speculation changes batch composition too; it
is acceptable only if it diverges no more often than sequential runs already do. This runs the
same episodes three times with `policy.batch_invariant=false` (sequential, sequential,
speculative with the history predictor) and prints, as JSON, the fraction of episodes whose
token ids differ in each comparison (and the batch-invariant mode's, which must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json

from obsspec.config import load_recipe
from obsspec.rollout.predictors import HistoryCache
from obsspec.rollout.config import sampling as make_sampling
from obsspec.build import make_engine, model_paths, tool_factory
from obsspec.rollout_run import compare, episode_tasks
from obsspec.rollout.batch import run_episodes
from obsspec.tokens import ChatFormat
from obsspec.progress import PlainDisplay


def differing(a, b) -> dict:
    """Fractions of episodes that differ at all, and that differ first in a policy action (the
    engine's doing) rather than in a tool observation (the tool printed something else)."""
    c = compare(a, b)
    return {"any": len(c["episodes_differing"]) / len(a),
            "first_in_action": len(c["differing_first_in_action"]) / len(a)}


async def main_async(args) -> dict:
    recipe = load_recipe(args.recipe, args.overrides)
    display = PlainDisplay()
    episodes = await episode_tasks(recipe, display)
    policy_path, _ = model_paths(recipe, display)
    p = recipe.policy
    sampling = make_sampling(p, recipe.rollout.seed)
    out = {"episodes": len(episodes)}
    for invariant in (False, True):
        engine, tok = make_engine(dataclasses.replace(p, batch_invariant=invariant), policy_path, p.max_batch_size)
        fmt = ChatFormat(tok)
        try:
            runs = []
            for speculative in (False, False, True):
                batch = await run_episodes(engine, fmt, episodes, tool_factory(recipe.sandbox, recipe.rollout.latency), sampling,
                                           cap=recipe.sandbox.output_cap, speculative=speculative,
                                           predictor=HistoryCache() if speculative else None)
                runs.append(batch.trajectories)
        finally:
            engine.close()
        key = "batch_invariant" if invariant else "batched"
        out[key] = {"sequential_vs_sequential": differing(runs[0], runs[1]),
                    "speculative_vs_sequential": differing(runs[0], runs[2]),
                    "bash_turns": sum(1 for t in runs[0] for turn in t.turns if turn.kind == "bash")}
        print(json.dumps({key: out[key]}), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="recipes/tiny-cpu.yaml")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
