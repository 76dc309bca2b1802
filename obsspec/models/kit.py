"""`ensure_kit`: build the tiny local models once, then reuse them from a cache.

    paths = ensure_kit(tasks_dir, cache_dir, kit, sandbox, sampling)   # a recipe's: obsspec.build.kit_for
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
   reference trajectories and of those rollouts (loss on observation bodies only); with the
   recipe's `world_model.workspace_snapshot`, each row has its task's snapshot ahead of it, as
   the rollout's drafts will (`kit_for` passes `snapshot_tokens`; 0 = without; the snapshots'
   text is not in the tokenizer's corpus, so nothing else changes); with
   `kit.world_model_tasks`, also the reference trajectories of that many more generated
   instances of the suite's families;
   with `kit.mistakes`, also that many episodes per train task (and per generated instance) of
   its reference solution with one command edited (obsspec/env/mistakes.py), whose error
   messages the tokenizer's corpus holds too (they are run before step 1); with
   `kit.listing_steps` and `kit.copy_steps` (snapshot or hints on), it first trains on listing
   rows and then on copy rows alone, each stage going on from the last one's model.
Each lands in an ordinary model folder (weights + config + tokenizer) under
`cache_dir/kit-<key>/`, where key = sha256 of (kit format, config, sha256 of trajectories.jsonl,
the sampling and sandbox of the rollouts, the snapshot budget):
a second call with the same inputs returns at once, and any change builds a fresh kit. A kit
that differs from a cached one only in `kit.world_model` or the snapshot copies that kit's
earlier stages (`stages_keys`) and trains its world model alone (and runs the policy's
rollouts again when the sampling settings differ too). A kit is built in a temporary folder
and renamed into place, so a crash never leaves a half kit behind.
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

from obsspec.env.sandbox import SandboxConfig, output_settings
from obsspec.jsonl import read_jsonl, write_json, write_jsonl
from obsspec.models.config import KitConfig
from obsspec.models.kit_episodes import (SANDBOXES_AT_ONCE, generated_rows, mistake_episodes, mistake_stats,
                                         policy_rollouts, run_apart, suite_mistakes, workspace_texts_of)
from obsspec.rollout.scheduler import Sampling
from obsspec.progress import Display, NullDisplay

KIT_FORMAT = 3  # bump when the layout or the training recipe changes, to invalidate old kits (3: listing atoms)
# the snapshot's text and use (2: the sandbox's `ls -lR`; 3: also in the tokenizer's corpus; 4: not in it
# again: the tokenizer and the policy do not depend on the snapshot; 5: the world model's positions are
# kit.max_length + the snapshot's budget); in the key when on
SNAPSHOT_FORMAT = 5
TRAJECTORIES = "trajectories.jsonl"
TRAIN_TASKS = "train.jsonl"
VAL_TASKS = "val.jsonl"


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


def kit_key(tasks_dir: str, cfg: KitConfig, sandbox: SandboxConfig, sampling: Sampling,
            snapshot_tokens: int = 0, hint_tokens: int = 0) -> str:
    return _digest(_key(tasks_dir, cfg, sandbox, sampling, snapshot_tokens, hint_tokens))


def stages_keys(tasks_dir: str, cfg: KitConfig, sandbox: SandboxConfig, sampling: Sampling) -> dict[str, str]:
    """The keys of a kit's earlier stages, for a build to start from another kit's (SHARED_STAGES):
    `all`, every stage but the world model's: the kit's key without kit.world_model and the
    snapshot, which no earlier stage reads; `before_rollouts`, also without the policy's rollouts,
    the one stage that reads the sampling settings and kit.rollouts."""
    keys = {}
    for name, c in (("all", cfg), ("before_rollouts", dataclasses.replace(cfg, rollouts=0))):
        key = _key(tasks_dir, c, sandbox, sampling, 0)
        del key["config"]["world_model"]
        key["config"].pop("copy_steps", None)
        key["config"].pop("copies_per_task", None)
        key["config"].pop("listing_steps", None)
        keys[name] = _digest({**key, "stages": name})
    return keys


def _key(tasks_dir: str, cfg: KitConfig, sandbox: SandboxConfig, sampling: Sampling, snapshot_tokens: int,
         hint_tokens: int = 0) -> dict:
    corpus = {name: _sha256(os.path.join(tasks_dir, name))
              for name in ((TRAJECTORIES, TRAIN_TASKS) if cfg.rollouts else (TRAJECTORIES,))}
    # The policy's rollouts depend on how it samples and on the sandbox it runs in.
    rollouts = {"sandbox": output_settings(sandbox), "sampling": dataclasses.asdict(sampling)} \
        if cfg.rollouts else None
    config = dataclasses.asdict(cfg)
    del config["bases"]  # where to find pretrained bases, not what a kit is built from
    config["rollout_workers"] = SANDBOXES_AT_ONCE  # (a recipe key once: kits built then keep their key)
    for name, off in (("world_model_tasks", 0), ("policy_tasks", 0), ("mistakes", 0), ("digits_per_token", 1),
                      ("copy_steps", 0), ("copies_per_task", 4), ("listing_steps", 0)):
        if config[name] == off:  # (absent when off: older kits keep their key)
            del config[name]
    key = {"format": KIT_FORMAT, "config": config, "corpus": corpus, "rollouts": rollouts}
    if snapshot_tokens:  # (absent when off: kits built before the switch keep their key)
        key["snapshot_tokens"] = snapshot_tokens
        key["snapshot_format"] = SNAPSHOT_FORMAT
    if hint_tokens:  # (absent when off, likewise)
        key["hint_tokens"] = hint_tokens
        key["snapshot_format"] = SNAPSHOT_FORMAT
    if snapshot_tokens or hint_tokens or cfg.world_model_tasks or cfg.policy_tasks or cfg.mistakes:  # these run the suite's tasks in sandboxes
        key["sandbox"] = output_settings(sandbox)
        key["tasks"] = {name: _sha256(os.path.join(tasks_dir, name)) for name in (TRAIN_TASKS, VAL_TASKS)
                        if os.path.exists(os.path.join(tasks_dir, name))}
    return key


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def workspace_tokens(wm) -> tuple[int, int]:
    """(snapshot_tokens, hint_tokens) a kit's world model learns with, for the world_model section
    `wm`: its snapshot budget and hint tokens when that model is the kit's ('tiny'), else 0."""
    return (wm.snapshot_budget, wm.hint_tokens) if wm.model == "tiny" else (0, 0)


def ensure_kit(tasks_dir: str, cache_dir: str, cfg: KitConfig, sandbox: SandboxConfig,
               sampling: Sampling, display: Display | None = None, snapshot_tokens: int = 0,
               hint_tokens: int = 0) -> KitPaths:
    """The kit for this suite and config: from the cache, or built now (minutes on 2 CPU cores).
    `snapshot_tokens` > 0: the world-model base learns with each task's workspace snapshot (of
    that many tokens at most) ahead of its rows; `hint_tokens` > 0: with the workspace hints
    after each call (obsspec/worldmodel/hints.py)."""
    display = display or NullDisplay()
    if not os.path.exists(os.path.join(tasks_dir, TRAJECTORIES)):
        from obsspec.env.suite import TaskNotFound  # a user error: the CLI prints one line

        raise TaskNotFound(f"{tasks_dir}: no {TRAJECTORIES} (run `obsspec prepare-tasks` first)")
    key = kit_key(tasks_dir, cfg, sandbox, sampling, snapshot_tokens, hint_tokens)
    paths = KitPaths.under(os.path.join(cache_dir, f"kit-{key[:16]}"))
    if os.path.exists(paths.report):
        display.log(f"tiny model kit: cached at {paths.root}")
        return paths
    os.makedirs(cache_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=cache_dir)
    try:
        build_kit(tasks_dir, tmp, cfg, sandbox, sampling, display, snapshot_tokens, reuse_from=cache_dir,
                  hint_tokens=hint_tokens)
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
              sampling: Sampling, display: Display, snapshot_tokens: int = 0, checkpoint_steps: int = 0,
              reuse_from: str = "", hint_tokens: int = 0) -> dict:
    """Train tokenizer, policy and world-model base into `out_dir`; return (and write) the report.

    Each stage's output lands in `out_dir` when the stage is done (the tokenizer, each model, the
    rows of every batch of sandbox episodes, the report so far in `kit.partial.json`); called
    again on the same `out_dir`, a stage whose output is there is not run again. With
    `checkpoint_steps` > 0 each model's training also saves checkpoints and resumes from the
    latest: a build killed at any point goes on where it stopped (`obsspec build-bases`).
    `reuse_from`: a folder of other kits (the cache, a bases build's work folder); a fresh build
    starts from the stage outputs of a finished kit there that differs from this one in its
    world model only (`stages_keys`), and trains the world model alone; or from one that also
    differs in the policy's sampling or kit.rollouts, and runs the rollouts again too.
    """
    from obsspec.models import tiny, warmstart
    from obsspec.models.tokenizer import corpus_texts, train_tokenizer
    from obsspec.tokens import ChatFormat
    from obsspec.worldmodel.views import world_view

    reads_workspace = bool(snapshot_tokens or hint_tokens)
    for name in ("copy_steps", "listing_steps"):
        if getattr(cfg, name) and not reads_workspace:
            raise ValueError(f"kit.{name} needs the world model's workspace snapshot or hints "
                             "(snapshot_tokens or hint_tokens > 0)")
    t0 = time.monotonic()
    os.makedirs(out_dir, exist_ok=True)
    paths = KitPaths.under(out_dir)
    partial = os.path.join(out_dir, PARTIAL_REPORT)
    keys = stages_keys(tasks_dir, cfg, sandbox, sampling)
    if reuse_from and not os.path.exists(partial):
        _reuse_stages(out_dir, reuse_from, keys, display)
    rows = [r for r in read_trajectories(tasks_dir) if r.get("reward") == 1.0]
    train_rows = [r for r in rows if r.get("split") == "train"]
    val_rows = [r for r in rows if r.get("split") == "val"]
    if not train_rows:
        raise ValueError(f"{tasks_dir}/{TRAJECTORIES}: no successful train trajectories to learn from")
    report: dict = _read_json(partial) or {"build_sec_before": 0.0}
    report.update({"format": KIT_FORMAT, "config": dataclasses.asdict(cfg), "tasks_dir": tasks_dir,
                   "stages_keys": keys, "trajectories": {"train": len(train_rows), "val": len(val_rows)}})

    def done(name: str, value) -> None:  # a stage's figures, kept for a resumed build
        report[name] = value
        write_json(partial, {**report, "build_sec_before": report["build_sec_before"] + time.monotonic() - t0})

    def episodes(name: str, run) -> list[dict]:
        """Rows of a batch of sandbox episodes: from `name`.jsonl when an earlier build made them."""
        path = os.path.join(out_dir, name + ".jsonl")
        if not os.path.exists(path):
            write_jsonl(path, run())
        return read_jsonl(path)

    # The snapshots' text is not in the tokenizer's corpus: the tokenizer (and with it the
    # policy) is the same with and without them, so switching the world model's snapshot on
    # retrains the world model only. A listing in a snapshot and in an observation has the
    # same tokens either way.
    texts = run_apart(workspace_texts_of(tasks_dir, sandbox, SANDBOXES_AT_ONCE)) if reads_workspace else {}
    # With mistakes on, the error messages are in the corpus too: `No such file or directory` is
    # then a few tokens, not a dozen fragments the world model must spell out one by one.
    t1 = time.monotonic()
    mistake_rows = episodes("mistakes", lambda: suite_mistakes(tasks_dir, cfg, sandbox, display)) if cfg.mistakes else []
    # (a stage's time as measured when it ran, not when a resumed or reusing build read its rows)
    mistakes_sec = report.get("mistakes", {}).get("sec") or round(time.monotonic() - t1, 1)
    # Generated instances of the suite's families (never a suite task) for the policy: more
    # names to learn copying from than the suite's train split holds.
    # (only the tokenizer and the policy learn from them: not run again once both are built)
    policy_done = os.path.exists(paths.tokenizer) and os.path.exists(paths.policy)
    policy_extra = [row for _, row in generated_rows(tasks_dir, "policy_tasks", cfg, sandbox, display, done,
                                                 episodes)] if cfg.policy_tasks and not policy_done else []
    if os.path.exists(paths.tokenizer):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(paths.tokenizer)
    else:
        corpus = corpus_texts(train_rows + policy_extra) + corpus_texts(mistake_rows)
        display.log(f"tiny model kit: training a {cfg.vocab_size}-token BPE on "
                    f"{len(train_rows) + len(policy_extra)} train trajectories"
                    + (f" and {len(mistake_rows)} episodes with a mistake" if mistake_rows else ""))
        tokenizer = train_tokenizer(corpus, cfg.vocab_size, cfg.digits_per_token)
        _save_atomically(paths.tokenizer, tokenizer.save_pretrained)
        done("tokenizer", {"vocab": len(tokenizer), "sec": round(time.monotonic() - t0, 1)})
    fmt = ChatFormat(tokenizer)

    def train(name: str, mcfg, train_ex: list[dict], val_ex: list[dict], dropped: int, path: str,
              positions: int, init=None, **how):
        if os.path.exists(path):
            display.log(f"tiny model kit: {name}: kept from an earlier build at {path}")
            return tiny.load_pretrained(path)[0]
        model = init or tiny.build_model(mcfg, tokenizer, positions, cfg.seed)
        display.log(f"tiny model kit: {name}: {tiny.count_parameters(model) / 1e6:.2f}M parameters, "
                    f"{len(train_ex)} examples ({dropped} longer than {positions} tokens dropped)")
        stats = warmstart.train(model, tokenizer, train_ex, val_ex, mcfg, os.path.join(out_dir, f".{name}-trainer"),
                                cfg.seed, name, display, checkpoint_steps=checkpoint_steps, **how)
        _save_atomically(path, lambda tmp: tiny.save(model, tokenizer, tmp))
        done(name, {"parameters": tiny.count_parameters(model), "dropped_too_long": dropped, **stats})
        return model

    train_ex, dropped = warmstart.examples(fmt, train_rows + policy_extra, "policy", cfg.max_length)
    val_ex, _ = warmstart.examples(fmt, val_rows, "policy", cfg.max_length)
    policy = train("policy", cfg.policy, train_ex, val_ex, dropped, paths.policy, cfg.max_length)

    def snapshot_table(texts: dict[str, str]) -> dict:  # task_id -> tokens.WorldView
        return {tid: world_view(fmt, text, snapshot_tokens, hint_tokens) for tid, text in texts.items()}

    snapshots = snapshot_table(texts) if reads_workspace else None
    if snapshot_tokens:
        report["workspace_snapshot"] = {"tokens": snapshot_tokens, "tasks": len(snapshots),
                                        "mean_tokens": round(sum(len(v.prefix) for v in snapshots.values())
                                                             / max(len(snapshots), 1), 1)}
    if hint_tokens:
        report["workspace_hints"] = {"tokens": hint_tokens, "tasks": len(snapshots)}
    # The world model reads the snapshot ahead of the policy's whole context, and a hint after
    # each call: its positions are the policy's plus the snapshot's budget and HINTED_CALLS hints'.
    wm_positions = cfg.max_length + snapshot_tokens + HINTED_CALLS * hint_tokens
    wm_train, dropped = warmstart.examples(fmt, train_rows, "world_model", wm_positions, snapshots)
    wm_val, _ = warmstart.examples(fmt, val_rows, "world_model", wm_positions, snapshots)
    if mistake_rows:
        ex, n_dropped = warmstart.examples(fmt, mistake_rows, "world_model", wm_positions, snapshots)
        report["mistakes"] = {**mistake_stats(mistake_rows), "examples": len(ex), "dropped_too_long": n_dropped,
                              "sec": mistakes_sec}
        wm_train = wm_train + ex
    extra, extra_texts, extra_snapshots = [], {}, None  # (kit.world_model_tasks)
    if cfg.world_model_tasks:
        t1, ran_sec = time.monotonic(), report.get("world_model_tasks", {}).get("sec")
        extra = generated_rows(tasks_dir, "world_model_tasks", cfg, sandbox, display, done, episodes)
        extra_texts = run_apart(workspace_texts_of(tasks_dir, sandbox, SANDBOXES_AT_ONCE,
                                                  [t for t, _ in extra])) if reads_workspace else {}
        extra_snapshots = snapshot_table(extra_texts) if reads_workspace else None
        extra_rows = [row for _, row in extra]
        if cfg.mistakes:
            extra_rows += episodes("world_model_tasks_mistakes", lambda: run_apart(
                mistake_episodes([t for t, _ in extra], cfg, sandbox, display)))
        extra_ex, extra_dropped = warmstart.examples(fmt, extra_rows, "world_model", wm_positions, extra_snapshots)
        report["world_model_tasks"].update(examples=len(extra_ex), dropped_too_long=extra_dropped,
                                           sec=ran_sec or round(time.monotonic() - t1, 1))
        if cfg.mistakes:
            report["world_model_tasks"]["mistakes"] = mistake_stats(extra_rows[len(extra):])
        wm_train = wm_train + extra_ex
    if cfg.rollouts:
        from obsspec.rollout.trajectory import Trajectory

        t1 = time.monotonic()
        trajectories = [Trajectory.from_dict(d) for d in episodes("rollouts", lambda: [
            tr.to_dict() for tr in policy_rollouts(policy, tokenizer, fmt, tasks_dir, cfg, sandbox, sampling,
                                                    display)])]
        from_rollouts = warmstart.trajectory_examples(
            trajectories, wm_positions,
            [snapshots[t.task_id] for t in trajectories] if snapshots is not None else None)
        report["rollouts"] = {"episodes": len(trajectories), "examples": len(from_rollouts),
                              "success_frac": round(sum(t.reward == 1.0 for t in trajectories)
                                                    / max(len(trajectories), 1), 4),
                              "sec": report.get("rollouts", {}).get("sec") or round(time.monotonic() - t1, 1)}
        done("rollouts", report["rollouts"])
        wm_train = wm_train + from_rollouts
    wm_init = None
    if cfg.listing_steps or cfg.copy_steps:
        from obsspec.env.suite import load_tasks

        train_tasks = load_tasks(os.path.join(tasks_dir, TRAIN_TASKS)) + [t for t, _ in extra]
        val_tasks = load_tasks(os.path.join(tasks_dir, VAL_TASKS))[:COPY_VAL_TASKS]
        texts = {**texts, **extra_texts}
    if cfg.listing_steps:  # listing rows alone first: copying names never seen
        from obsspec.worldmodel.copies import listing_rows

        def listing_examples(tasks: list) -> tuple[list[dict], int]:
            rows = [r for t in tasks for r in listing_rows(fmt, texts[t.task_id], sandbox.output_cap)]
            kept = [r for r in rows if len(r["input_ids"]) <= wm_positions]
            return kept, len(rows) - len(kept)

        (listing_train, listing_dropped), (listing_val, _) = listing_examples(train_tasks), listing_examples(val_tasks)
        # (at a constant rate: copying comes suddenly, after thousands of steps, and a rate that
        # decays has faded by then; in random batches: batches of listings of one length learnt
        # no copying in 5,000 steps, docs/WORLDMODEL.md)
        listings_cfg = dataclasses.replace(cfg.world_model, max_steps=cfg.listing_steps,
                                           epochs=float(cfg.listing_steps), learning_rate=LISTING_LR)
        wm_init = train("world_model_listings", listings_cfg, listing_train, listing_val, listing_dropped,
                        os.path.join(out_dir, LISTINGS_MODEL), wm_positions, schedule="constant_with_warmup",
                        sampling="random")
    if cfg.copy_steps:  # the copy curriculum: copy rows alone, then the real rows
        snaps = {**snapshots, **(extra_snapshots or {})}
        per_task = cfg.copies_per_task or None  # (0: all of a task's copy steps)
        copy_train, copy_dropped = _copy_examples(fmt, train_tasks, texts, snaps, sandbox, wm_positions, per_task)
        copy_val, _ = _copy_examples(fmt, val_tasks, texts, snaps, sandbox, wm_positions, per_task)
        copies_cfg = dataclasses.replace(cfg.world_model, max_steps=cfg.copy_steps, epochs=float(cfg.copy_steps))
        wm_init = train("world_model_copies", copies_cfg, copy_train, copy_val, copy_dropped,
                        os.path.join(out_dir, COPIES_MODEL), wm_positions, wm_init)
    train("world_model", cfg.world_model, wm_train, wm_val, dropped, paths.world_model, wm_positions, wm_init)
    report["build_sec"] = round(report.pop("build_sec_before") + time.monotonic() - t0, 1)
    write_json(paths.report, report)
    os.remove(partial)
    display.log(f"tiny model kit: built in {report['build_sec']:.0f}s")
    return report


HINTED_CALLS = 4                     # calls whose hints a world model's positions have room for
PARTIAL_REPORT = "kit.partial.json"  # the report of a build in progress (kit.json once it is done)
COPIES_MODEL = "world_model_copies"  # the world model after its copy curriculum (kit.copy_steps)
LISTINGS_MODEL = "world_model_listings"  # the world model after its listing stage (kit.listing_steps)
LISTING_LR = 3e-3                    # the listing stage's learning rate, constant after its warm-up
COPY_VAL_TASKS = 100                 # val tasks whose copy rows give the curriculum's eval loss


def _copy_examples(fmt, tasks: list, texts: dict[str, str], snapshots: dict,
                   sandbox: SandboxConfig, positions: int, per_task: int | None) -> tuple[list[dict], int]:
    """World-model rows of the copy curriculum and how many were too long: per task, up to
    `per_task` (None: all) commands whose output is a span of its snapshot (the part the budget keeps),
    each as one step after the task's prompt, its observation formatted as the sandbox would.
    `snapshots`: task_id -> `tokens.WorldView`; only spans it shows whole."""
    from obsspec.worldmodel.copies import copy_row, sample_copy_steps

    rows, dropped = [], 0
    for task in tasks:
        snap, text = snapshots[task.task_id], texts[task.task_id]
        # the span must be shown whole: in the part of the snapshot its budget keeps, else in the
        # call's hint (within its budget)
        kept = fmt.decode(snap.prefix) if snap.prefix else lambda cmd, span: span in fmt.decode(snap.hint(cmd))
        for command, output in sample_copy_steps(text, kept, per_task, task.task_id):
            row, _ = copy_row(fmt, snap, task.instruction, command, output, sandbox.output_cap)
            if len(row["input_ids"]) > positions:
                dropped += 1
            else:
                rows.append(row)
    return rows, dropped


# What a kit builds before its world model, none of which reads kit.world_model or the snapshot:
# the outputs (files and folders) and their figures in kit.json; the policy's rollouts last (the
# one stage a `before_rollouts` match leaves out).
SHARED_STAGES = ("tokenizer", "policy", "mistakes.jsonl", "policy_tasks.jsonl", "world_model_tasks.jsonl",
                 "world_model_tasks_mistakes.jsonl", "rollouts.jsonl")
SHARED_FIGURES = ("tokenizer", "policy", "mistakes", "policy_tasks", "world_model_tasks", "rollouts")


def _reuse_stages(out_dir: str, kits_dir: str, keys: dict[str, str], display: Display) -> None:
    """Copy into `out_dir` the shared stages of a finished kit in `kits_dir` with one of the stages
    keys `keys` (the closest match first), and start the build's report from their figures
    (`stages_from` names the kit and the stages)."""
    kits = [KitPaths.under(os.path.join(kits_dir, name)) for name in sorted(os.listdir(kits_dir))] \
        if os.path.isdir(kits_dir) else []
    reports = [(kit, _read_json(kit.report)) for kit in kits if os.path.isfile(kit.report)
               and os.path.realpath(kit.root) != os.path.realpath(out_dir)]
    for level, stages in (("all", SHARED_STAGES), ("before_rollouts", SHARED_STAGES[:-1])):
        donor, report = next(((k, r) for k, r in reports if r.get("stages_keys", {}).get(level) == keys[level]),
                             (None, None))
        if donor is None:
            continue
        for stage in stages:
            src, dst = os.path.join(donor.root, stage), os.path.join(out_dir, stage)
            if os.path.isdir(src) and not os.path.exists(dst):
                _save_atomically(dst, lambda tmp: shutil.copytree(src, tmp))
            elif os.path.isfile(src) and not os.path.exists(dst):
                shutil.copyfile(src, dst + ".tmp")
                os.replace(dst + ".tmp", dst)
        figures = SHARED_FIGURES if level == "all" else SHARED_FIGURES[:-1]
        write_json(os.path.join(out_dir, PARTIAL_REPORT), {
            "build_sec_before": 0.0, **{k: report[k] for k in figures if k in report},
            "stages_from": {"kit": donor.root, "stages": list(stages), "build_sec": report.get("build_sec")}})
        display.log(f"tiny model kit: {', '.join(stages)} from {donor.root} (the same inputs)")
        return


def _read_json(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _save_atomically(path: str, save) -> None:
    """`save(folder)` into a temporary folder, then renamed to `path`: a kill never leaves half a model."""
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save(tmp)
    os.rename(tmp, path)


def main(argv: list[str] | None = None) -> None:
    import argparse

    from obsspec.config import load_recipe
    from obsspec.progress import make_display
    from obsspec.rollout.config import sampling

    p = argparse.ArgumentParser(prog="python -m obsspec.models.kit", description=__doc__.split("\n")[0])
    p.add_argument("tasks_dir", help="a prepared task suite (obsspec prepare-tasks --out DIR)")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. kit.policy.epochs=2")
    p.add_argument("--recipe", default=None, help="recipe whose `kit` section applies (default: defaults)")
    p.add_argument("--cache", default=".cache/kit", help="where kits are cached")
    p.add_argument("--display", default="auto", choices=["auto", "rich", "plain", "none"])
    args = p.parse_args(argv)
    recipe = load_recipe(args.recipe, args.overrides)
    snapshot_tokens, hint_tokens = workspace_tokens(recipe.world_model)
    paths = ensure_kit(args.tasks_dir, args.cache, recipe.kit, recipe.sandbox,
                       sampling(recipe.policy, recipe.rollout.seed), make_display(args.display),
                       snapshot_tokens=snapshot_tokens, hint_tokens=hint_tokens)
    print(json.dumps({**dataclasses.asdict(paths), "report": paths.read_report()}, indent=2))


if __name__ == "__main__":
    main()
