"""Can the tiny world model learn to copy a directory listing from the snapshot in its prompt?
With the kit's tokenizer as it is (the baseline) and with a few listing fields as single tokens.

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python bench/listing_copy.py --kit KIT \
        [--steps 5000] [--arms plain,atoms] [--out result.json] [--plot curve.png] [--save DIR]

A probe of the model alone, no sandbox: synthetic examples of the task the tiny base fails on
(docs/WORLDMODEL.md) — a system turn holding `ls -lR` of /app (3-9 files in data/, names from 31
words x 5 extensions, or with `--names` dir-stats' own, random letters or the suite's
word-and-number names; sizes of 2-4 digits right-aligned as `ls` pads them; the pinned date),
the call `ls -l data`, and as target the
`./data` block + `\n(exit_code=0)` + the closing tag, loss on the target only. Each arm trains the
recipe's world-model shape (kit.world_model: 2 layers, width 128; recipe overrides after the
options change it, e.g. `kit.world_model.num_layers=4`) from the same seed on the same
4,000 examples (AdamW, constant lr after 100 warm-up steps, batch 8) and is judged every `--every`
steps by greedy exact match on 20 held-out listings. The `atoms` arm adds `-rw-r--r--`,
`drwxr-xr-x`, ` 1 agent agent `, ` 2 agent agent ` and ` Jan  1 00:00 ` to the tokenizer as single
tokens: a listing line shrinks from ~34 tokens to ~11, and the name of the previous line (the only
clue to which line comes next, since every line starts alike) sits ~7 tokens back instead of ~17.
Prints one JSON line per evaluation and the whole result at the end; `--plot` draws exact match
against steps for both arms.

`--judge-suite TASKS` also judges each arm's model on the same layout holding the suite's own
listings: each `ls -l DIR` of a top-level folder in the workspaces of the first 40 val tasks of a
prepared suite (obsspec/worldmodel/copies.py), the folder's own name in place of `data`. A model
that copies does as well there; one that has learnt the probe's names does not. With `--init
MODEL --steps 0` a saved model is judged without training. `--train-generated N` trains on the
listings of the workspaces of N generated instances of the suite's families (the kit's
`kit.world_model_tasks` instances, never a suite task) instead of synthetic ones: the suite's own
names, folders and sizes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import string
import time

import torch
from tokenizers import AddedToken
from transformers import AutoTokenizer

from obsspec import chat
from obsspec.config import load_recipe
from obsspec.env.families._text_helpers import FILE_STEMS
from obsspec.env.suite import load_tasks
from obsspec.models import tiny
from obsspec.models.kit import VAL_TASKS, KitPaths, generated_tasks
from obsspec.tokens import IM_END, IM_START, OBS_PREFIX
from obsspec.worldmodel.copies import listing_snapshot, top_listings
from obsspec.worldmodel.snapshot import workspace_texts
from provenance import emit, stamp

WORDS = ("app config data main notes schema summary todo server backup test error access audit build "
         "cache debug events index jobs metrics queue report sync trace users worker alpha beta gamma delta").split()
EXTS = ("txt", "log", "csv", "md", "json")
ATOMS = ("-rw-r--r--", "drwxr-xr-x", " 1 agent agent ", " 2 agent agent ", " Jan  1 00:00 ")
NAMES = ("words", "stems", "random", "suite")  # how the synthetic listings name their files: file_name


def random_stem(rng: random.Random) -> str:
    """A name no model can have memorised: 3-8 random lowercase letters."""
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8)))


def file_name(rng: random.Random, names: str) -> str:
    """`words`: a stem from WORDS and one of EXTS; `stems`: as dir-stats names its files
    (FILE_STEMS, .log or .txt); `random`: 3-8 random letters and one of EXTS (a memorised
    name is never right); `suite`: as most of the suite's families name theirs, a word with a
    number or a second word (`report66.txt`, `app_6.log`, `old_sales_backup.csv`): several
    tokens each, and many names share their first token."""
    if names == "stems":
        return f"{rng.choice(FILE_STEMS)}.{rng.choice(['log', 'txt'])}"
    if names == "suite":
        stem, n = rng.choice(WORDS), rng.randint(1, 99)
        stem = rng.choice([f"{stem}{n}", f"{stem}_{n}", f"{stem}_{rng.choice(WORDS)}", f"old_{stem}_{n}"])
        return f"{stem}.{rng.choice(EXTS)}"
    stem = random_stem(rng) if names == "random" else rng.choice(WORDS)
    return f"{stem}.{rng.choice(EXTS)}"


def listing(rng: random.Random, names: str = "words") -> tuple[str, int]:
    """`ls -l data` of a random data/ folder, as the sandbox prints it (file names: `file_name`)."""
    files = sorted({file_name(rng, names) for _ in range(rng.randint(3, 9))})
    sizes = [rng.choice([rng.randint(10, 99), rng.randint(100, 999), rng.randint(100, 999), rng.randint(1000, 4000)])
             for _ in files]
    width = max(len(str(s)) for s in sizes)
    lines = [f"total {4 * len(files)}"] + [f"-rw-r--r-- 1 agent agent {str(s).rjust(width)} Jan  1 00:00 {n}"
                                           for n, s in zip(files, sizes)]
    return "\n".join(lines) + "\n", len(files)


def snapshot_text(block: str, n: int, folder: str = "data") -> str:
    """The world model's workspace snapshot of /app holding only `folder`/ with this listing."""
    return listing_snapshot("/app", folder, f"drwxr-xr-x 2 agent agent {40 + 20 * n} Jan  1 00:00 {folder}", block)


def row(tok, block: str, folder: str = "data") -> tuple[list[int], list[int], str]:
    """(prompt ids, target ids, the body a hit must equal) of `ls -l folder` printing `block`."""
    snapshot = snapshot_text(block, block.count("\n") - 1, folder)
    prompt = snapshot + f"{IM_START}assistant\n" + chat.render_bash(f"ls -l {folder}") + IM_END + OBS_PREFIX
    body = block + "\n(exit_code=0)"
    return tok.encode(prompt), tok.encode(body + chat.OBS_CLOSE), body


def example(tok, rng: random.Random, names: str = "words") -> tuple[list[int], list[int], str]:
    return row(tok, listing(rng, names)[0])


def workspace_listings(tasks, sandbox) -> list[tuple[str, str]]:
    """(block, folder): `ls -l DIR` of each top-level folder of the tasks' workspaces, as the
    sandbox prints it."""
    texts = asyncio.run(workspace_texts(tasks, sandbox, 4))
    return [(body, folder) for task in tasks for folder, _line, body in top_listings(texts[task.task_id])]


def exact(model, tok, held) -> float:
    model.eval()
    hits = 0
    with torch.no_grad():
        for prompt, target, body in held:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=len(target) + 5, do_sample=False)
            hits += tok.decode(out[0, len(prompt):]).split(chat.OBS_CLOSE)[0] == body
    model.train()
    return hits / len(held)


def train_arm(arm: str, kit: str, shape, steps: int, every: int, lr: float, seed: int, save: str = "",
              names: str = "words", init: str = "", suite: tuple = (), listings: tuple = ()) -> dict:
    tok = AutoTokenizer.from_pretrained(KitPaths.under(kit).tokenizer)
    if arm == "plain" and any(len(tok.encode(a, add_special_tokens=False)) == 1 for a in ATOMS):
        raise SystemExit(f"{kit}: its tokenizer already has listing atoms (kit format 3); "
                         "the plain arm needs a kit built before them")
    if arm == "atoms":
        tok.add_tokens([AddedToken(a, normalized=False) for a in ATOMS])
    rng = random.Random(seed)
    train = [row(tok, *x) for x in listings] if listings else [example(tok, rng, names) for _ in range(4000)]
    held = [example(tok, random.Random(10**6 + i), names) for i in range(20)]
    model = tiny.load_pretrained(init)[0].train() if init else tiny.build_model(shape, tok, 1024, seed)
    suite_rows = [row(tok, *x) for x in suite]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    curve, t0, batch = [], time.monotonic(), 8
    for step in range(steps):
        rows = [train[(step * batch + i) % len(train)] for i in range(batch)]
        width = max(len(p) + len(t) for p, t, _ in rows)
        ids = torch.full((batch, width), tok.pad_token_id)
        labels = torch.full((batch, width), -100)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, (p, t, _) in enumerate(rows):
            ids[i, :len(p) + len(t)] = torch.tensor(p + t)
            mask[i, :len(p) + len(t)] = 1
            labels[i, len(p):len(p) + len(t)] = torch.tensor(t)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        warm.step()
        opt.zero_grad()
        if (step + 1) % every == 0 or step + 1 == steps:
            point = {"arm": arm, "step": step + 1, "loss": round(loss.item(), 4),
                     "exact": exact(model, tok, held), "sec": round(time.monotonic() - t0)}
            if suite:
                point["suite_exact"] = exact(model, tok, suite_rows)
            curve.append(point)
            print(json.dumps(point), flush=True)
    if save:  # the model and its tokenizer (atoms included), e.g. to continue on real rows
        tiny.save(model, tok, os.path.join(save, arm))
    result = {"train_listings": len(train), "tokens_per_example": sum(len(p) + len(t) for p, t, _ in train[:100]) / 100,
              "parameters": tiny.count_parameters(model), "curve": curve,
              "held_out_exact": curve[-1]["exact"] if curve else exact(model, tok, held)}
    if suite:
        result["suite"] = {"listings": len(suite),
                           "exact": curve[-1]["suite_exact"] if curve else exact(model, tok, suite_rows)}
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kit", required=True, help="a built kit folder (kit-<key>): its tokenizer")
    p.add_argument("--recipe", default="recipes/tiny-cpu.yaml", help="kit.world_model gives the shape")
    p.add_argument("--arms", default="plain,atoms")
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--every", type=int, default=250)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="")
    p.add_argument("--plot", default="")
    p.add_argument("--save", default="", help="save each arm's model to SAVE/ARM")
    p.add_argument("--names", choices=NAMES, default="words",
                   help="file names: 31 words x 5 extensions, dir-stats' own, random letters, or the "
                        "suite's word-and-number names")
    p.add_argument("--judge-suite", default="", metavar="TASKS",
                   help="a prepared suite: also judge on its val workspaces' own listings")
    p.add_argument("--train-generated", type=int, default=0, metavar="N",
                   help="with --judge-suite: learn from the listings of N generated instances' workspaces")
    p.add_argument("--init", default="", help="start from this saved model (e.g. --save's) instead of a fresh one")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. kit.world_model.num_layers=4")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.train_generated and not args.judge_suite:
        raise SystemExit("--train-generated needs --judge-suite TASKS (the suite to generate instances of)")
    recipe = load_recipe(args.recipe, args.overrides)
    shape = recipe.kit.world_model
    suite = tuple(workspace_listings(load_tasks(os.path.join(args.judge_suite, VAL_TASKS))[:40], recipe.sandbox)) \
        if args.judge_suite else ()
    listings = tuple(workspace_listings(generated_tasks(args.judge_suite, "world_model_tasks", args.train_generated,
                                                        recipe.kit.seed)[0], recipe.sandbox)) \
        if args.train_generated else ()
    result = {**stamp(), "args": vars(args), "shape": shape.__dict__,
              "arms": {arm: train_arm(arm, args.kit, shape, args.steps, args.every, args.lr, args.seed,
                                        args.save, args.names, args.init, suite, listings)
                       for arm in args.arms.split(",")}}
    final = {arm: r["held_out_exact"] for arm, r in result["arms"].items()}
    result["final_exact"] = final
    if "plain" in final and "atoms" in final:
        result["atoms_minus_plain_points"] = round(100 * (final["atoms"] - final["plain"]), 1)
    emit(result, args.out)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for arm, r in result["arms"].items():
            ax.plot([c["step"] for c in r["curve"]], [100 * c["exact"] for c in r["curve"]], marker="o", label=arm)
            if any("suite_exact" in c for c in r["curve"]):
                ax.plot([c["step"] for c in r["curve"]], [100 * c["suite_exact"] for c in r["curve"]], marker="s",
                        linestyle="--", label=f"{arm}: the suite's own listings")
        ax.set(xlabel="optimizer steps", ylabel="exact listings (%)", title="tiny world model copying `ls -l data`")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
    main()
