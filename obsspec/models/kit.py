"""`ensure_kit`: build the tiny local models once, then reuse them from a cache.

    paths = ensure_kit("runs/tasks", ".cache/kit", recipe.kit, recipe.sandbox, sampling, display)
    model, tokenizer = load_pretrained(paths.policy)

Run: python -m obsspec.models.kit TASKS_DIR [kit.key=value ...] [--recipe recipes/tiny-cpu.yaml]
     [--cache .cache/kit] [--display plain]

What it builds from a prepared task suite (`obsspec prepare-tasks`; only `trajectories.jsonl` is
read, and only its train split is trained on):
1. the tokenizer (obsspec/models/tokenizer.py), trained on the train trajectories' text;
2. the policy: a tiny Qwen3, warm-started on the reference solutions (loss on actions only);
3. `kit.rollouts` episodes of that policy on train tasks (real sandboxes, the recipe's sampling
   settings), kept in `rollouts.jsonl`: the world model must know this policy's commands, its
   failures and their error messages, not only reference solutions;
4. the world-model base: a tiny Qwen3 pre-trained to write the real observations of the
   reference trajectories and of those rollouts (loss on observation bodies only).
Each lands in an ordinary model folder (weights + config + tokenizer) under
`cache_dir/kit-<key>/`, where key = sha256 of (kit format, config, sha256 of trajectories.jsonl):
a second call with the same inputs returns at once, and any change builds a fresh kit. A kit is
built in a temporary folder and renamed into place, so a crash never leaves a half kit behind.
`kit.json` there records the config, sizes, losses and timings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from obsspec.env.sandbox import SandboxConfig
from obsspec.models.config import KitConfig
from obsspec.rollout.scheduler import Sampling
from obsspec.ui.display import Display, NullDisplay

KIT_FORMAT = 2  # bump when the layout or the training recipe changes, to invalidate old kits
TRAJECTORIES = "trajectories.jsonl"
TRAIN_TASKS = "train.jsonl"


@dataclass(frozen=True)
class KitPaths:
    root: str
    tokenizer: str
    policy: str
    world_model: str
    report: str  # kit.json
    rollouts: str  # rollouts.jsonl: the warm-started policy's episodes the world model learned from

    @classmethod
    def under(cls, root: str) -> KitPaths:
        join = os.path.join
        return cls(root, join(root, "tokenizer"), join(root, "policy"), join(root, "world_model"),
                   join(root, "kit.json"), join(root, "rollouts.jsonl"))

    def read_report(self) -> dict:
        with open(self.report) as f:
            return json.load(f)


def kit_key(tasks_dir: str, cfg: KitConfig, sandbox: SandboxConfig, sampling: Sampling) -> str:
    corpus = {}
    for name in (TRAJECTORIES, TRAIN_TASKS) if cfg.rollouts else (TRAJECTORIES,):
        with open(os.path.join(tasks_dir, name), "rb") as f:
            corpus[name] = hashlib.sha256(f.read()).hexdigest()
    # The policy's rollouts depend on how it samples and on the sandbox it runs in.
    rollouts = {"sandbox": dataclasses.asdict(sandbox), "sampling": dataclasses.asdict(sampling)} \
        if cfg.rollouts else None
    blob = json.dumps({"format": KIT_FORMAT, "config": dataclasses.asdict(cfg), "corpus": corpus,
                       "rollouts": rollouts}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def ensure_kit(tasks_dir: str, cache_dir: str, cfg: KitConfig, sandbox: SandboxConfig,
               sampling: Sampling, display: Display | None = None) -> KitPaths:
    """The kit for this suite and config: from the cache, or built now (minutes on 2 CPU cores)."""
    display = display or NullDisplay()
    if not os.path.exists(os.path.join(tasks_dir, TRAJECTORIES)):
        from obsspec.env.suite import TaskNotFound  # a user error: the CLI prints one line

        raise TaskNotFound(f"{tasks_dir}: no {TRAJECTORIES} (run `obsspec prepare-tasks` first)")
    paths = KitPaths.under(os.path.join(cache_dir, f"kit-{kit_key(tasks_dir, cfg, sandbox, sampling)[:16]}"))
    if os.path.exists(paths.report):
        display.log(f"tiny model kit: cached at {paths.root}")
        return paths
    os.makedirs(cache_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=cache_dir)
    try:
        build_kit(tasks_dir, tmp, cfg, sandbox, sampling, display)
        try:
            os.rename(tmp, paths.root)
        except OSError:  # another process finished the same kit first: theirs is as good
            if not os.path.exists(paths.report):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return paths


def read_trajectories(tasks_dir: str) -> list[dict]:
    with open(os.path.join(tasks_dir, TRAJECTORIES)) as f:
        return [json.loads(line) for line in f if line.strip()]


def build_kit(tasks_dir: str, out_dir: str, cfg: KitConfig, sandbox: SandboxConfig,
              sampling: Sampling, display: Display) -> dict:
    """Train tokenizer, policy and world-model base into `out_dir`; return (and write) the report."""
    from obsspec.models import tiny, warmstart
    from obsspec.models.tokenizer import corpus_texts, train_tokenizer
    from obsspec.tokens import ChatFormat

    t0 = time.monotonic()
    paths = KitPaths.under(out_dir)
    rows = [r for r in read_trajectories(tasks_dir) if r.get("reward") == 1.0]
    train_rows = [r for r in rows if r.get("split") == "train"]
    val_rows = [r for r in rows if r.get("split") == "val"]
    if not train_rows:
        raise ValueError(f"{tasks_dir}/{TRAJECTORIES}: no successful train trajectories to learn from")
    report: dict = {"format": KIT_FORMAT, "config": dataclasses.asdict(cfg), "tasks_dir": tasks_dir,
                    "trajectories": {"train": len(train_rows), "val": len(val_rows)}}

    display.log(f"tiny model kit: training a {cfg.vocab_size}-token BPE on "
                f"{len(train_rows)} train trajectories")
    tokenizer = train_tokenizer(corpus_texts(train_rows), cfg.vocab_size)
    tokenizer.save_pretrained(paths.tokenizer)
    fmt = ChatFormat(tokenizer)
    report["tokenizer"] = {"vocab": len(tokenizer), "sec": round(time.monotonic() - t0, 1)}

    def train(name: str, mcfg, train_ex: list[dict], val_ex: list[dict], dropped: int, path: str):
        model = tiny.build_model(mcfg, tokenizer, cfg.max_length, cfg.seed)
        display.log(f"tiny model kit: {name}: {tiny.count_parameters(model) / 1e6:.2f}M parameters, "
                    f"{len(train_ex)} examples ({dropped} longer than {cfg.max_length} tokens dropped)")
        stats = warmstart.train(model, tokenizer, train_ex, val_ex, mcfg,
                                os.path.join(out_dir, f".{name}-trainer"), cfg.seed, name, display)
        tiny.save(model, tokenizer, path)
        report[name] = {"parameters": tiny.count_parameters(model), "dropped_too_long": dropped, **stats}
        return model

    train_ex, dropped = warmstart.examples(fmt, train_rows, "policy", cfg.max_length)
    val_ex, _ = warmstart.examples(fmt, val_rows, "policy", cfg.max_length)
    policy = train("policy", cfg.policy, train_ex, val_ex, dropped, paths.policy)

    wm_train, dropped = warmstart.examples(fmt, train_rows, "world_model", cfg.max_length)
    wm_val, _ = warmstart.examples(fmt, val_rows, "world_model", cfg.max_length)
    if cfg.rollouts:
        t1 = time.monotonic()
        trajectories = _policy_rollouts(policy, tokenizer, fmt, tasks_dir, cfg, sandbox, sampling, display)
        with open(paths.rollouts, "w") as f:
            f.writelines(json.dumps(tr.to_dict(), sort_keys=True) + "\n" for tr in trajectories)
        from_rollouts = warmstart.trajectory_examples(trajectories, cfg.max_length)
        report["rollouts"] = {"episodes": len(trajectories), "examples": len(from_rollouts),
                              "success_frac": round(sum(t.reward == 1.0 for t in trajectories)
                                                    / max(len(trajectories), 1), 4),
                              "sec": round(time.monotonic() - t1, 1)}
        wm_train = wm_train + from_rollouts
    train("world_model", cfg.world_model, wm_train, wm_val, dropped, paths.world_model)
    report["build_sec"] = round(time.monotonic() - t0, 1)
    with open(paths.report, "w") as f:
        json.dump(report, f, indent=2, sort_keys=True)
        f.write("\n")
    display.log(f"tiny model kit: built in {report['build_sec']:.0f}s")
    return report


def _policy_rollouts(policy, tokenizer, fmt, tasks_dir: str, cfg: KitConfig, sandbox: SandboxConfig,
                     sampling: Sampling, display: Display):
    """`cfg.rollouts` sampled episodes of the warm-started policy on train tasks spread over the
    split, through the same episode loop as every rollout (the engine's fast batched mode: these
    are training data, not a losslessness check)."""
    import asyncio
    import concurrent.futures

    from obsspec.engines.hf import HFEngine
    from obsspec.env.suite import load_tasks, spread
    from obsspec.models.evaluate import rollout_tasks

    picked = spread(load_tasks(os.path.join(tasks_dir, TRAIN_TASKS)), cfg.rollouts)

    async def run():
        async with HFEngine(policy, tokenizer, batch_invariant=False) as engine:
            return await rollout_tasks(engine, fmt, picked, sandbox, sampling,
                                       concurrency=cfg.rollout_workers, display=display,
                                       label="policy rollouts for the world model")

    # A loop of its own in a thread of its own: ensure_kit is also called from async code.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


def main(argv: list[str] | None = None) -> None:
    import argparse

    from obsspec.config import load_recipe
    from obsspec.rollout.config import sampling
    from obsspec.ui.display import make_display

    p = argparse.ArgumentParser(prog="python -m obsspec.models.kit", description=__doc__.split("\n")[0])
    p.add_argument("tasks_dir", help="a prepared task suite (obsspec prepare-tasks --out DIR)")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. kit.policy.epochs=2")
    p.add_argument("--recipe", default=None, help="recipe whose `kit` section applies (default: defaults)")
    p.add_argument("--cache", default=".cache/kit", help="where kits are cached")
    p.add_argument("--display", default="auto", choices=["auto", "rich", "plain", "none"])
    args = p.parse_args(argv)
    recipe = load_recipe(args.recipe, args.overrides)
    paths = ensure_kit(args.tasks_dir, args.cache, recipe.kit, recipe.sandbox,
                       sampling(recipe.policy, recipe.rollout.seed), make_display(args.display))
    print(json.dumps({**dataclasses.asdict(paths), "report": paths.read_report()}, indent=2))


if __name__ == "__main__":
    main()
