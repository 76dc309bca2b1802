"""Where must the snapshot's span sit for the tiny world model to learn copying it?

    PYTHONPATH=$PWD .venv/bin/python bench/copy_placement.py --kit KIT --tasks TASKS \
        [--layouts snapshot,near] [--steps 1500] [--out result.json] [--plot bars.png]

The rows are the kit's copy curriculum (obsspec/worldmodel/copies.py: `ls -l DIR`, `ls DIR`,
`cat FILE`, `head -N FILE`, whose whole output is a span of the task's workspace snapshot), of
every copy step of the suite's train tasks; judged by greedy exact match on those of the first
`--val` val tasks (`--generated N` adds the copies of the kit's first N generated world-model
instances to learn from; `--init MODEL --steps 0` judges a saved model, e.g. a kit's
`world_model_copies`, without training; `--judge-train N` also judges the copies of the first N
train tasks, which it learnt from: copying or memory). Two layouts of the same rows:

- `snapshot`: as the kit lays them out, the whole snapshot (`--snapshot-tokens`) ahead of the
  task's prompt: the model must find the directory's block or the file's section by its path,
  then copy it;
- `near`: no snapshot ahead; the one span the command prints (the directory's block, the file's
  section) as a system turn right after the call, before the observation: copying without
  looking anything up.

Each layout trains the kit's world-model shape from the same seed for `--steps` (the kit's
trainer: AdamW, cosine, 5 % warm-up). Prints JSON with exact match per command kind.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import os
import tempfile

import torch
from transformers import AutoTokenizer

from obsspec import chat
from obsspec.config import load_recipe
from obsspec.env.suite import load_tasks
from obsspec.models import tiny, warmstart
from obsspec.models.kit import TRAIN_TASKS, VAL_TASKS, KitPaths, generated_tasks
from obsspec.progress import make_display
from obsspec.tokens import ChatFormat, WorldView
from obsspec.worldmodel.copies import copy_row, copy_steps
from obsspec.worldmodel.snapshot import MAX_TOKENS, snapshot_ids, workspace_texts
from provenance import emit, stamp

LAYOUTS = ("snapshot", "near")


def kind(command: str) -> str:
    words = command.split()
    top = "" if len(words) > (2 if words[:2] == ["ls", "-l"] else 1) else " (top)"
    return ("ls -l" if words[:2] == ["ls", "-l"] else words[0]) + top


def rows_of(fmt, tasks, texts, layout: str, budget: int, cap: int) -> list[dict]:
    """One row per copy step whose span the snapshot's budget keeps: {input_ids,
    completion_mask, prompt (ids up to the body), body, kind}."""
    out = []
    for task in tasks:
        snap = snapshot_ids(fmt, texts[task.task_id], budget)
        kept = fmt.decode(snap)
        for command, output, span in copy_steps(texts[task.task_id]):
            if span not in kept:
                continue
            # near: no snapshot; the step's span right after the call, as a workspace hint is laid
            # out (tokens.WorldView), with no budget to cut it
            view = snap if layout == "snapshot" else \
                WorldView((), fmt, lambda _command, span=span: snapshot_ids(fmt, span, MAX_TOKENS))
            row, body = copy_row(fmt, view, task.instruction, command, output, cap)
            # the body's first token: what the world model reads up to the observation's opening
            prompt = row["input_ids"][:row["completion_mask"].index(1)]
            out.append({**row, "prompt": prompt, "body": body, "kind": kind(command)})
    return out


def exact_by_kind(model, fmt, rows: list[dict]) -> dict:
    model.eval()
    tally: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    with torch.no_grad():
        for r in rows:
            target = fmt.wm_target_ids(r["body"])
            out = model.generate(torch.tensor([r["prompt"]]), max_new_tokens=len(target) + 4, do_sample=False)
            hit = chat.split_draft(fmt.decode(out[0, len(r["prompt"]):].tolist())) == r["body"]
            tally[r["kind"]][0] += hit
            tally[r["kind"]][1] += 1
    per_kind = {k: {"exact": round(h / n, 3), "steps": n} for k, (h, n) in sorted(tally.items())}
    total = sum(n for _, n in tally.values())
    return {"exact": round(sum(h for h, _ in tally.values()) / max(total, 1), 3), "per_kind": per_kind}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kit", required=True, help="a built kit folder (its tokenizer)")
    p.add_argument("--tasks", required=True, help="the prepared suite (train.jsonl, val.jsonl)")
    p.add_argument("--recipe", default="recipes/tiny-cpu-bases.yaml", help="kit.world_model: the shape")
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--val", type=int, default=40, help="val tasks judged")
    p.add_argument("--generated", type=int, default=0,
                   help="also learn from the copies of this many generated instances (the kit's world_model_tasks)")
    p.add_argument("--judge-train", type=int, default=0,
                   help="also judge the copies of this many train tasks (learnt rows: copying or memory?)")
    p.add_argument("--snapshot-tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--init", default="", help="start from this model folder instead of a fresh one")
    p.add_argument("--save", default="", help="keep each layout's trained model in SAVE/LAYOUT (--init takes it)")
    p.add_argument("--out", default="")
    p.add_argument("--plot", default="")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. kit.world_model.num_layers=4")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    recipe = load_recipe(args.recipe, args.overrides)
    tokenizer = AutoTokenizer.from_pretrained(KitPaths.under(args.kit).tokenizer)
    fmt = ChatFormat(tokenizer)
    train_tasks = load_tasks(os.path.join(args.tasks, TRAIN_TASKS))
    val_tasks = load_tasks(os.path.join(args.tasks, VAL_TASKS))[:args.val]
    # the same instances, by seed and key, as a kit with kit.world_model_tasks >= N learns from
    generated = generated_tasks(args.tasks, "world_model_tasks", args.generated, recipe.kit.seed)[0] \
        if args.generated else []
    texts = asyncio.run(workspace_texts(train_tasks + val_tasks + generated, recipe.sandbox, 4))
    mcfg = dataclasses.replace(recipe.kit.world_model, max_steps=args.steps, epochs=float(args.steps))
    result = {**stamp(), "args": vars(args), "shape": dataclasses.asdict(mcfg), "layouts": {}}
    for layout in args.layouts.split(","):
        train = rows_of(fmt, train_tasks + generated, texts, layout, args.snapshot_tokens, recipe.sandbox.output_cap)
        held = rows_of(fmt, val_tasks, texts, layout, args.snapshot_tokens, recipe.sandbox.output_cap)
        positions = max(len(r["input_ids"]) for r in train + held) + 8
        model = tiny.load_pretrained(args.init)[0] if args.init else \
            tiny.build_model(mcfg, tokenizer, positions, recipe.kit.seed)
        with tempfile.TemporaryDirectory() as tmp:
            stats = warmstart.train(model, tokenizer, [{k: r[k] for k in ("input_ids", "completion_mask")}
                                                       for r in train], [], mcfg, tmp, recipe.kit.seed,
                                    f"copies ({layout})", make_display("plain"), measure_train=False)
        if args.save:
            tiny.save(model, tokenizer, os.path.join(args.save, layout))
        result["layouts"][layout] = {"rows": len(train), "tokens_per_row": round(stats["tokens_per_epoch"] / len(train)),
                                     "train_sec": stats["train_sec"], "last_logged_loss": stats["last_logged_loss"],
                                     **exact_by_kind(model, fmt, held)}
        if args.judge_train:
            seen = rows_of(fmt, train_tasks[:args.judge_train], texts, layout, args.snapshot_tokens,
                           recipe.sandbox.output_cap)
            result["layouts"][layout]["train_tasks_judged"] = exact_by_kind(model, fmt, seen)
    emit(result, args.out)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        kinds = sorted({k for r in result["layouts"].values() for k in r["per_kind"]})
        fig, ax = plt.subplots(figsize=(7, 3.5))
        width = 0.8 / len(result["layouts"])
        for i, (layout, r) in enumerate(result["layouts"].items()):
            ax.bar([j + i * width for j in range(len(kinds))],
                   [100 * r["per_kind"].get(k, {}).get("exact", 0) for k in kinds], width, label=layout)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(kinds))], kinds, fontsize=8)
        ax.set(ylabel="exact (% of held-out copies)", title=f"tiny world model, {args.steps} steps of copies")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
