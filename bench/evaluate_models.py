"""Evaluate policies and a world model on a prepared suite's val split (success rates, exact hits).

Run: python bench/evaluate_models.py TASKS_DIR [key=value ...] [--recipe recipes/tiny-cpu.yaml]
     [--policies untrained,warm] [--world-model kit] [--rollouts FILE] [--max-draft-tokens N]
     [--group-size 4] [--limit N] [--out eval.json]

The figures are those of `obsspec.models.evaluate.evaluate_val`; this script parses the command
line, prints the results as JSON and writes them to --out. Errors in its inputs (a recipe, a
suite that is not there, a missing --rollouts file) are one line and exit code 2.
"""

from __future__ import annotations

import asyncio
import json
import sys

from obsspec.config import ConfigError, load_recipe
from obsspec.env.suite import SuiteError
from obsspec.models.evaluate import evaluate_val
from obsspec.progress import make_display


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python bench/evaluate_models.py", description=__doc__.split("\n")[0])
    p.add_argument("tasks_dir", help="a prepared task suite; its val split is evaluated")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. policy.temperature=0.7")
    p.add_argument("--recipe", default="recipes/tiny-cpu.yaml", help="recipe (sampling, sandbox, kit)")
    p.add_argument("--cache", default=None, help="kit cache (default: the recipe's rollout.kit_cache)")
    p.add_argument("--policies", default="warm",
                   help="comma-separated: untrained, warm, or a model folder / hub name")
    p.add_argument("--world-model", default="", help="also score a world model's greedy drafts on the "
                   "val reference steps and on the last policy's rollouts: 'kit' or a model folder")
    p.add_argument("--rollouts", action="append", default=[], metavar="FILE",
                   help="also score the world model on the steps of recorded episodes (a "
                        "trajectories JSONL of a rollout run or of an earlier --out); repeatable")
    p.add_argument("--max-draft-tokens", type=int, default=0,
                   help="cap world-model drafts here instead of world_model.max_tokens (faster; a "
                        "draft that needs more counts as unusable)")
    p.add_argument("--group-size", type=int, default=4, help="episodes per task (a GRPO group)")
    p.add_argument("--limit", type=int, default=0, help="evaluate N val tasks spread over the split (0 = all)")
    p.add_argument("--workers", type=int, default=8, help="concurrent episodes")
    p.add_argument("--out", default="", help="write the results as JSON here")
    p.add_argument("--display", default="auto", choices=["auto", "rich", "plain", "none"])
    args = p.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        results = asyncio.run(evaluate_val(
            load_recipe(args.recipe, args.overrides), args.tasks_dir,
            policies=args.policies.split(","), world_model=args.world_model, rollouts=args.rollouts,
            max_draft_tokens=args.max_draft_tokens, group_size=args.group_size, limit=args.limit,
            workers=args.workers, out=args.out, cache=args.cache, display=make_display(args.display),
            command=" ".join(["python bench/evaluate_models.py", *argv])))
    except (ConfigError, SuiteError, FileNotFoundError) as e:  # the user's inputs: one line
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
