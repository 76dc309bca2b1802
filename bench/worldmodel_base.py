"""Re-train a kit's world-model base with other settings and measure its exact-match hit rate.

The kit's tokenizer, policy and policy rollouts stay as they are; only the world-model base is
trained again (from scratch, on the kit's rows: the suite's reference trajectories of the train
split plus the kit's rollouts), optionally with each task's workspace snapshot ahead of every row,
then judged with greedy drafts on held-out reference steps of the val split and, with
--rollouts, on the steps of recorded val episodes (`python bench/evaluate_models.py ... --out`
writes them). Prints JSON; with --out also writes it (and the model beside it).

    PYTHONPATH=$PWD .venv/bin/python bench/worldmodel_base.py --kit KIT --tasks TASKS \
        --snapshot-tokens 256 --rollouts VAL.warm.trajectories.jsonl \
        kit.world_model.max_steps=1000 kit.world_model.epochs=100 [kit.world_model.num_layers=4 ...]

--listing-copy N also mixes N synthetic listing-copy examples (bench/listing_copy.py: a snapshot
of a random data/ folder, the call `ls -l data`, its listing as target) into the training rows:
does the copy skill the probe learns carry over to the suite's real `ls` steps? --listing-layout N
puts N such listings behind real train tasks' prompts instead (the real rows' layout); --names
picks their file names, --init continues from a saved model (e.g. listing_copy.py --save).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random

from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.listing_copy import NAMES, example, listing, snapshot_text
from obsspec.config import load_recipe
from obsspec.engines.hf import HFEngine
from obsspec.env.suite import load_tasks, spread
from obsspec.models import tiny, warmstart
from obsspec.worldmodel.cases import reference_cases, trajectory_cases
from obsspec.worldmodel.evaluate import evaluate_world_model
from obsspec.models.kit import KitPaths, read_trajectories
from obsspec.rollout.trajectory import Trajectory
from obsspec.tokens import ChatFormat, transcript, wm_row
from obsspec.progress import make_display
from obsspec.worldmodel.views import WorkspaceSnapshots


def read_trajectory_file(path: str) -> list[Trajectory]:
    with open(path) as f:
        return [Trajectory.from_dict(json.loads(line)) for line in f if line.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kit", required=True, help="a built kit folder (kit-<key>)")
    p.add_argument("--tasks", required=True, help="the prepared suite the kit was built from")
    p.add_argument("--snapshot-tokens", type=int, default=0, help="workspace snapshot budget (0 = none)")
    p.add_argument("--rollouts", default="", help="recorded val episodes to judge on as well")
    p.add_argument("--limit", type=int, default=40, help="val reference trajectories judged")
    p.add_argument("--draft-tokens", type=int, default=320, help="draft cap (longer: unusable)")
    p.add_argument("--recipe", default="recipes/tiny-cpu.yaml")
    p.add_argument("--listing-copy", type=int, default=0, help="synthetic listing-copy examples mixed in")
    p.add_argument("--listing-layout", type=int, default=0,
                   help="synthetic listing copies laid out as real rows: a train task's prompt, "
                        "a snapshot of a random data/, `ls -l data` and its listing as target")
    p.add_argument("--names", choices=NAMES, default="words",
                   help="the synthetic listings' file names (bench/listing_copy.py listing)")
    p.add_argument("--init", default="", help="continue from this model folder (and its tokenizer), "
                                              "e.g. listing_copy.py --save DIR's DIR/atoms")
    p.add_argument("--out", default="", help="write the JSON here (and the model to OUT.model)")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. kit.world_model.max_steps=1000")
    args = p.parse_args()

    recipe = load_recipe(args.recipe, args.overrides)
    paths = KitPaths.under(args.kit)
    tokenizer = AutoTokenizer.from_pretrained(args.init or paths.tokenizer)
    fmt = ChatFormat(tokenizer)
    rows = [r for r in read_trajectories(args.tasks) if r.get("reward") == 1.0]
    train_rows = [r for r in rows if r["split"] == "train"]
    val_rows = [r for r in rows if r["split"] == "val"]
    snapshots = None
    if args.snapshot_tokens:
        snapshots = asyncio.run(WorkspaceSnapshots(fmt, args.snapshot_tokens, recipe.sandbox)
                                .table(load_tasks(args.tasks)))
    cfg = recipe.kit
    length = cfg.max_length + args.snapshot_tokens
    train_ex, dropped = warmstart.examples(fmt, train_rows, "world_model", length, snapshots)
    val_ex, _ = warmstart.examples(fmt, val_rows, "world_model", length, snapshots)
    kit_rollouts = read_trajectory_file(paths.rollouts) if os.path.exists(paths.rollouts) else []
    train_ex += warmstart.trajectory_examples(
        kit_rollouts, length, [snapshots[t.task_id] for t in kit_rollouts] if snapshots else None)
    if args.listing_copy:
        rng = random.Random(cfg.seed)
        for _ in range(args.listing_copy):
            prompt, target, _body = example(tokenizer, rng, args.names)
            train_ex.append({"input_ids": prompt + target, "completion_mask": [0] * len(prompt) + [1] * len(target)})
    if args.listing_layout:
        rng = random.Random(cfg.seed + 1)
        for i in range(args.listing_layout):
            block, n = listing(rng, args.names)
            t = transcript(fmt, train_rows[i % len(train_rows)]["instruction"],
                           [("ls -l data", block + "\n(exit_code=0)")], done=False)
            train_ex.append(wm_row(tokenizer.encode(snapshot_text(block, n), add_special_tokens=False),
                                   t.ids, t.wm_mask))
    if args.init:
        model = AutoModelForCausalLM.from_pretrained(args.init)
        model.config.max_position_embeddings = length  # RoPE: no weights tied to the limit
    else:
        model = tiny.build_model(cfg.world_model, tokenizer, length, cfg.seed)
    stats = warmstart.train(model, tokenizer, train_ex, val_ex, cfg.world_model,
                            os.path.join(os.path.dirname(args.out or ".") or ".", ".wm-trainer"), cfg.seed,
                            "world_model", make_display("plain"))
    if args.out:
        tiny.save(model, tokenizer, args.out + ".model")

    sources = {"reference": reference_cases(fmt, spread(val_rows, args.limit), snapshots)}
    if args.rollouts:
        sources["rollouts"] = trajectory_cases(fmt, read_trajectory_file(args.rollouts), snapshots)
    result = {"args": vars(args), "world_model": cfg.world_model.__dict__,
              "parameters": tiny.count_parameters(model), "dropped_too_long": dropped, "train": stats}

    async def judge():
        async with HFEngine(model, tokenizer) as engine:
            for name, cases in sources.items():
                result[name] = await evaluate_world_model(engine, fmt, cases, recipe.sandbox.output_cap,
                                                          args.draft_tokens)

    asyncio.run(judge())
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
