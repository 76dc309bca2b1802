"""The parts of a training run and how they connect (obsspec/training/grpo.py drives them).

`build_run` loads tasks and models, serves the policy and the world model, and returns a
`TrainingRun`: it makes the GRPOTrainer (rollout function, reward, callbacks), restores our own
state from a checkpoint, evaluates on val tasks, and closes the engines.

Callbacks:
- `MetricsLog`   one line per step in metrics.jsonl: TRL's logs + the step's rollout metrics
                 (the raw summary, None kept) + per-class hits + world-model version/loss;
- `StateSaver`   next to each TRL checkpoint, `obsspec_state.json`: the world-model adapter
                 version serving the next rollouts and the history cache; written last, it marks
                 the checkpoint complete (obsspec/training/checkpoints.py). TRL's own step counter
                 and generation buffer are not saved, and need not be: one generation round is one
                 optimizer step here (steps_per_generation = accumulation, num_iterations = 1), so a
                 resumed run regenerates exactly at the step boundary it stopped on, and episode
                 seeds follow from the step number.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os

from transformers import TrainerCallback

from obsspec.config import Recipe
from obsspec.jsonl import read_jsonl, write_json, write_jsonl
from obsspec.env.suite import interleave, load_tasks, spread
from obsspec.rollout.config import make_gate, sampling
from obsspec.rollout.predictors import WithHistory, world_model_of
from obsspec.rollout.gate import SKIP_REASONS
from obsspec.rollout.metrics import mean_interval, mean_of, pooled_success, skips_phrase
from obsspec.training.config import TrainError
from obsspec.training.checkpoint_val import CheckpointVal
from obsspec.training.rollouts import RolloutSettings, Rollouts, outcome_metrics, success_by_task
from obsspec.training.trackers import scalars

EVAL_EPISODES = 10**9  # val episodes are numbered from here: the same seeds before and after
MODELS_FILE = "models.json"  # the policy's and the world model's bases, as this run loaded them


def build_run(recipe: Recipe, out_dir: str, state, live, display) -> "TrainingRun":
    from obsspec.build import ensure_tasks, launch_servers, model_paths
    from obsspec.tokens import ChatFormat
    from obsspec.worldmodel.adapters import resolve_adapter

    t = recipe.train
    adapter = resolve_adapter(recipe.world_model.adapter)  # a bad one fails now, not after the kit
    with state.main_process_first():  # one process prepares the suite and builds the kit
        tasks_dir = asyncio.run(ensure_tasks(recipe, display))
        keep = (lambda task: task.family in t.families) if t.families else (lambda task: True)
        train = [task for task in load_tasks(os.path.join(tasks_dir, "train.jsonl")) if keep(task)]
        if t.task_ids:
            missing = sorted(set(t.task_ids) - {task.task_id for task in train})
            if missing:
                raise TrainError(f"train.task_ids: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
                                 f"not among the train tasks of {tasks_dir}" +
                                 (f" of the families {list(t.families)}" if t.families else ""))
            train = [task for task in train if task.task_id in t.task_ids]
        val_file = os.path.join(tasks_dir, "val.jsonl")
        val = [task for task in load_tasks(val_file) if keep(task)] if os.path.exists(val_file) else []
        if not train:  # before the kit is built: this is the recipe's mistake, not worth minutes
            raise TrainError(f"{tasks_dir}: no train tasks" + (f" of the families {list(t.families)} "
                             "(train.families)" if t.families else ""))
        policy_path, wm_path = model_paths(recipe, display)
        if state.is_main_process:  # the bases `obsspec export` merges into (obsspec/export/)
            os.makedirs(out_dir, exist_ok=True)
            write_json(os.path.join(out_dir, MODELS_FILE), {"policy": _where(policy_path), "world_model": _where(wm_path)})
        # servers.launch: the main process starts them; the others wait here until they serve
        servers = launch_servers(recipe, policy_path, wm_path, out_dir, display) if state.is_main_process else None
    try:
        run = _build(recipe, out_dir, state, live, display, train, val, policy_path, wm_path, adapter)
    except BaseException:
        if servers is not None:
            servers.stop()
        raise
    run.servers = servers
    return run


def _build(recipe: Recipe, out_dir: str, state, live, display, train, val, policy_path, wm_path,
           adapter) -> "TrainingRun":
    from obsspec.build import make_engine, tool_factory, world_model_engine, world_model_predictor
    from obsspec.tokens import ChatFormat

    t = recipe.train
    policy_engine, tokenizer = make_engine(recipe.policy, policy_path, recipe.policy.max_batch_size)
    if recipe.policy.engine == "hf":
        model = policy_engine.model  # the engine serves the very model the trainer trains
    else:  # a server generates: the trainer has its own copy, whose LoRA reaches the server (PolicySync)
        from obsspec.models.tiny import load_pretrained

        model, _ = load_pretrained(policy_path, device=recipe.policy.device)
    fmt = ChatFormat(tokenizer, **recipe.policy.chat_layout)
    speculative = t.speculative and recipe.rollout.predictor != "none"
    wm_engine = predictor = None
    if speculative:
        wm_engine = world_model_engine(recipe.world_model, wm_path, tokenizer)
        if adapter is not None:
            asyncio.run(wm_engine.load_adapter(adapter.name, adapter.path))
        predictor = world_model_predictor(recipe, fmt, wm_engine, adapter.name if adapter else None, t.seed)
        if t.history_cache:
            predictor = WithHistory(predictor)
    settings = RolloutSettings(
        sampling=sampling(recipe.policy, t.seed), cap=recipe.sandbox.output_cap,
        speculative=speculative, depth=recipe.rollout.depth, episodes_per_step=t.episodes_per_step,
        make_tool=tool_factory(recipe.sandbox, recipe.rollout.latency),
        concurrency=recipe.rollout.concurrency, busy_limit=recipe.rollout.busy_limit,
        gate=make_gate(recipe.rollout), paired=t.measure_speculation)
    by_id = {task.task_id: task for task in train}
    rollouts = Rollouts(by_id, settings, policy_engine, fmt, predictor, out_dir,
                        rank=state.process_index, live=live)
    if recipe.policy.engine != "hf":
        from obsspec.training.policy_sync import PolicySync

        rollouts.sync = PolicySync(policy_engine, out_dir, state, rollouts, keep=t.keep_adapter_versions)
    if t.keep_rollouts:  # every process its own step folders
        from obsspec.training.retention import RolloutRotation

        rollouts.after_rollouts.append(RolloutRotation(out_dir, state.process_index, t.keep_rollouts))
    cotrainer = None
    if speculative and t.cotrain_every and state.is_main_process:
        from obsspec.training.cotrain import CoTrainer

        cotrainer = CoTrainer(recipe.wm_train, t, wm_path, wm_engine, world_model_of(predictor), out_dir, display,
                              initial=adapter.path if adapter is not None else None,
                              gpu=recipe.servers.cotrain_gpu)
    if speculative and t.cotrain_every and state.num_processes > 1:
        from obsspec.training.wm_sync import WorldModelSync  # every rank the current version, all episodes

        sync = WorldModelSync(state, rollouts, world_model_of(predictor), wm_engine, cotrainer,
                              shared=recipe.world_model.engine == "vllm")
        rollouts.before_rollouts.append(sync.before_rollouts)
        rollouts.after_rollouts.append(sync.after_rollouts)
    elif cotrainer is not None:
        rollouts.before_rollouts.append(cotrainer.before_rollouts)
        rollouts.after_rollouts.append(cotrainer.after_rollouts)
    return TrainingRun(recipe, out_dir, state, train, val, model, policy_engine, wm_engine, tokenizer,
                       rollouts, predictor, cotrainer, display)


def _where(model: str) -> str:
    return os.path.abspath(model) if os.path.isdir(model) else model  # a folder, or a hub name


def sampler_check(recipe: Recipe):
    """The comparison of the rollouts' logprobs with the trainer's (obsspec/training/sampler.py):
    the importance correction on when the recipe asks, or by default when a server samples."""
    from obsspec.training.sampler import SamplerCheck

    t, engine = recipe.train, recipe.policy.engine
    correction = t.importance_correction == "on" or (t.importance_correction == "auto" and engine != "hf")
    return SamplerCheck(correction, t.importance_cap, engine, tolerance=t.logprob_tolerance)


class TrainingRun:
    def __init__(self, recipe, out_dir, state, train, val, model, policy_engine, wm_engine, tokenizer,
                 rollouts, predictor, cotrainer, display):
        self.recipe, self.out_dir, self.state = recipe, out_dir, state
        self.train, self.val, self.model = train, val, model
        self.policy_engine, self.wm_engine, self.tokenizer = policy_engine, wm_engine, tokenizer
        self.rollouts, self.predictor, self.cotrainer, self.display = rollouts, predictor, cotrainer, display
        self.restored_step = 0
        self.sampler = sampler_check(recipe)
        if rollouts.sync is not None:
            rollouts.sync.pushed = self.sampler.note_push
        self.servers = None  # the vLLM servers this run started (servers.launch), stopped at close

    def trainer(self, args):
        from datasets import Dataset

        from obsspec.training.sampler import SamplerAwareGRPOTrainer

        # The prompt is the task id; the rollout function renders the task's instruction. The order
        # is ours (TRL's shuffle is off): every stretch of the run sees the same mix of kinds.
        order = interleave(self.train, self.recipe.train.seed)
        dataset = Dataset.from_list([{"prompt": task.task_id} for task in order])
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        checkpoint_val = CheckpointVal(self)
        trainer = SamplerAwareGRPOTrainer(
            model=self.model, reward_funcs=[self.rollouts.reward], args=args, train_dataset=dataset,
            processing_class=self.tokenizer, rollout_func=self.rollouts, peft_config=self.recipe.train.policy_lora(),
            callbacks=[MetricsLog(self), checkpoint_val, StateSaver(self)], sampler=self.sampler)
        checkpoint_val.trainer = trainer
        # MetricsLog first: the trackers' callbacks send the log dict it adds obsspec's metrics to
        trainer.callback_handler.callbacks.sort(key=lambda c: not isinstance(c, MetricsLog))
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # MetricsLog prints a line per step instead
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Writing model shards" at each checkpoint garbled the display
        return trainer

    # -- our state in checkpoints ----------------------------------------------------------------
    def save_state(self, checkpoint_dir: str) -> None:
        """After the trainer's files: ours, which mark the checkpoint complete, then the rotation
        (obsspec/training/checkpoints.py; transformers' own is off)."""
        from obsspec.training import checkpoints

        if self.cotrainer is not None:
            self.cotrainer.finish()  # the version the next rollouts will use
        state = {"wm_version": self.cotrainer.version if self.cotrainer else None,
                 "history": self.predictor.cache.state() if isinstance(self.predictor, WithHistory) else None}
        checkpoints.write_state(checkpoint_dir, state)
        checkpoints.rotate(os.path.dirname(checkpoint_dir), self.recipe.train.save_total_limit)

    def restore(self, checkpoint_dir: str | None) -> None:
        """Our state from a complete checkpoint; None = a resume from step 0 (no complete one)."""
        from obsspec.training import checkpoints

        if checkpoint_dir is not None:
            state = checkpoints.read_state(checkpoint_dir)
            if state.get("history") is not None and isinstance(self.predictor, WithHistory):
                self.predictor.cache.load_state(state["history"])
            if self.cotrainer is not None:
                self.cotrainer.restore(state.get("wm_version"))
            self.restored_step = checkpoints.step_of(checkpoint_dir)
        if self.state.is_main_process:  # the only writer of metrics.jsonl
            _truncate_metrics(os.path.join(self.out_dir, "metrics.jsonl"), self.restored_step)

    # -- evaluation, end -------------------------------------------------------------------------
    def evaluate(self, label: str, name: str) -> dict:
        """Val success over `train.eval_tasks` tasks x `eval_group_size` episodes (the same seeds
        every time); the episodes are written under eval/`name`/ (not under rollouts/, where
        `train-worldmodel` finds training data: val tasks stay held out)."""
        t = self.recipe.train
        tasks = [task for task in spread(self.val, min(t.eval_tasks, len(self.val)))
                 for _ in range(t.eval_group_size)]
        if not tasks:
            return {"episodes": 0}
        from obsspec.build import tool_factory

        # Success only: sequential episodes without emulated latency give the speculative run's
        # very tokens (lossless) in less time, and leave the history cache and spec metrics alone.
        settings = dataclasses.replace(self.rollouts.settings, speculative=False,
                                       make_tool=tool_factory(self.recipe.sandbox, None))
        result = self.rollouts.run(tasks, step=0, first_episode=EVAL_EPISODES, label=label,
                                   settings=settings, out=os.path.join(self.out_dir, "eval", name))
        scored = [tr.reward for tr in result.trajectories if not tr.infra_error]
        out = {**outcome_metrics(result.trajectories), "episodes": len(tasks),
               "reward_mean": sum(scored) / len(scored) if scored else None,
               "success_by_kind": result.by_kind, "success_by_task": success_by_task(tasks, result.trajectories)}
        self.display.log(f"{label}: success {out['success_frac']}, over {len(tasks)} episodes")
        return out

    def finish_cotraining(self) -> None:
        if self.cotrainer is not None:
            self.cotrainer.finish()

    def sync_policy(self, trainer) -> None:
        """Every process: a policy server gets the final weights (before the val evaluation)."""
        if self.rollouts.sync is not None:
            self.rollouts.sync(trainer)

    def summary(self, trainer, evals: dict) -> dict:
        rows = _read_metrics(os.path.join(self.out_dir, "metrics.jsonl"))
        rewards = [r.get("reward") for r in rows if r.get("reward") is not None]
        saved = sum(r.get("latency_saved_sec") or 0.0 for r in rows)
        rollout_sec = sum(r.get("rollout_sec") or 0.0 for r in rows)
        third = max(1, len(rewards) // 3)
        return {"command": "train", "out_dir": self.out_dir, "steps": trainer.state.global_step,
                "reward_first_third": sum(rewards[:third]) / third if rewards else None,
                "reward_last_third": sum(rewards[-third:]) / third if rewards else None,
                "eval": evals, "wm_version": self.cotrainer.version if self.cotrainer else None,
                "infra_failures": sum(r.get("infra_failures", 0) or 0 for r in rows),
                "hit_rate_mean": mean_of([r.get("spec/exact_frac") for r in rows]),
                "wm_hit_rate_mean": mean_of([r.get("spec/exact_frac_wm") for r in rows]),
                "cache_hit_rate_mean": mean_of([r.get("spec/exact_frac_cache") for r in rows]),
                "wm_hits": sum(r.get("spec/hits_wm") or 0 for r in rows),
                "cache_hits": sum(r.get("spec/hits_cache") or 0 for r in rows),
                "sibling_hits": sum(r.get("spec/hits_sibling") or 0 for r in rows),
                "wm_class_hits": _sum_pairs(r.get("spec/wm_class_hits") or {} for r in rows),
                "skips": {reason: sum(r.get(f"spec/skipped_{reason}") or 0 for r in rows)
                          for reason in SKIP_REASONS},
                "committed_delay_frac_max": max((r.get("committed_delay_frac") or 0.0 for r in rows), default=None),
                "skipped_frac_mean": mean_of([r.get("spec/skipped_frac") for r in rows]),
                "latency_saved_sec": saved, "rollout_sec": rollout_sec,
                "latency_saved_frac": mean_of([r.get("latency_saved_frac") for r in rows]),
                **paired_summary(rows), "val_gain": val_gain(evals),
                "success_by_kind": _kind_thirds(rows, third),
                "logprob_check": self.sampler.summary()}

    def close(self) -> None:
        if self.cotrainer is not None:
            self.cotrainer.close()
        self.policy_engine.close()
        if self.wm_engine is not None:
            self.wm_engine.close()
        if self.servers is not None:
            self.servers.stop()


def paired_summary(rows: list[dict]) -> dict:
    """Over the paired steps (train.measure_speculation): the measured reductions with their 95 %
    intervals over steps, and the identity of the two passes."""
    latency = [r["paired/latency_reduction"] for r in rows if r.get("paired/latency_reduction") is not None]
    wall = [r["paired/rollout_reduction"] for r in rows if r.get("paired/rollout_reduction") is not None]
    if not wall:
        return {}

    def total(key):
        return sum(r.get(key) or 0 for r in rows)

    return {"paired": {"steps": len(wall), "latency_reduction": mean_interval(latency) if latency else None,
                       "rollout_reduction": mean_interval(wall),
                       "seq_sec": total("paired/seq_sec"), "spec_sec": total("paired/spec_sec"),
                       "episodes_compared": total("paired/episodes_compared"),
                       "episodes_differing": total("paired/episodes_differing"),
                       "episodes_differing_in_action": total("paired/episodes_differing_in_action"),
                       "tokens_differing": total("paired/tokens_differing")}}


def val_gain(evals: dict) -> dict | None:
    """Val success after minus before, task by task (the same tasks and seeds both times), with
    its 95 % interval over tasks: a paired comparison, so the tasks' own difficulty cancels."""
    before, after = (evals.get(k, {}).get("success_by_task") or {} for k in ("before", "after"))
    tasks = [t for t in before if t in after and before[t][1] and after[t][1]]
    if len(tasks) < 2:
        return None
    diffs = [after[t][0] / after[t][1] - before[t][0] / before[t][1] for t in tasks]
    return {**mean_interval(diffs), "tasks": len(tasks)}


def _sum_pairs(tables) -> dict:
    """{key: [a, b]} tables summed key by key."""
    out: dict = {}
    for table in tables:
        for key, (a, b) in table.items():
            x, y = out.get(key, (0, 0))
            out[key] = [x + a, y + b]
    return dict(sorted(out.items()))


# ---------------------------------------------------------------------------------------------
# Callbacks


class MetricsLog(TrainerCallback):
    def __init__(self, run: TrainingRun):
        self.run = run
        self.reductions: list[float] = []  # each paired step's measured rollout reduction, so far

    def on_log(self, args, state, control, logs=None, **kwargs):
        last = self.run.rollouts.last
        if not self.run.state.is_main_process or last is None or "loss" not in (logs or {}):
            return
        row = {**(logs or {}), **last.metrics, "step": state.global_step,
               "spec/class_hits": last.class_hits, "success_by_kind": last.by_kind,
               "rollout_sec": last.sec}
        if self.run.cotrainer is not None:
            row.update(self.run.cotrainer.metrics())
        if self.run.rollouts.sync is not None:
            row.update(self.run.rollouts.sync.last)
        with open(os.path.join(self.run.out_dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(row, sort_keys=True, default=str) + "\n")
        logs.update(scalars(row, skip=logs))  # the trackers' callbacks, after this one, send them too
        if row.get("paired/rollout_reduction") is not None:
            self.reductions.append(row["paired/rollout_reduction"])
        so_far = mean_interval(self.reductions) if len(self.reductions) > 1 else None
        self.run.display.log(_step_line(row, args.max_steps, so_far))


class StateSaver(TrainerCallback):
    def __init__(self, run: TrainingRun):
        self.run = run

    def on_save(self, args, state, control, **kwargs):
        if self.run.state.is_main_process:
            self.run.save_state(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))


def _step_line(row: dict, steps: int, so_far: dict | None = None) -> str:
    def pct(k):
        v = row.get(k)
        return "-" if v is None else f"{100 * v:.0f}%"

    busy = f", {skips_phrase(row)}" if row.get("spec/skipped_frac") else ""
    if row.get("paired/rollout_reduction") is not None:  # measured against the sequential pass
        saved = (f"rollout {row['paired/spec_sec']:.1f}s speculative vs {row['paired/seq_sec']:.1f}s sequential "
                 f"(saved {100 * row['paired/rollout_reduction']:.0f}%, of episode latency "
                 f"{100 * (row.get('paired/latency_reduction') or 0):.0f}%")
        if so_far is not None and so_far.get("ci95") is not None:
            saved += f"; saved so far {100 * so_far['mean']:.1f}% ± {100 * so_far['ci95']:.1f}"
        saved += ")"
    else:
        saved = f"spec overlap {row.get('latency_saved_sec', 0):.1f}s (not measured against sequential)"
    return (f"step {row['step']}/{steps}: reward {row.get('reward', 0):.3f}, success {pct('success_frac')}, "
            f"hit rate {pct('spec/exact_frac')} (world model {pct('spec/exact_frac_wm')}, cache "
            f"{pct('spec/exact_frac_cache')}){busy}, {saved}, infra failures {row.get('infra_failures', 0)}")


def _kind_thirds(rows: list[dict], third: int) -> dict:
    """"family/kind" -> [success in the first third of the steps, in the last third] (None
    where the kind had no episode there): which questions the run learned, and which it unlearned."""
    first, last = pooled_success(rows[:third]), pooled_success(rows[-third:])
    return {k: [first.get(k), last.get(k)] for k in sorted(set(first) | set(last))}


def _read_metrics(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    return read_jsonl(path, TrainError)


def _truncate_metrics(path: str, step: int) -> None:
    """Steps after the checkpoint are redone on resume: their lines move to metrics-discarded.jsonl."""
    rows = _read_metrics(path)
    keep = [r for r in rows if r["step"] <= step]
    dropped = [r for r in rows if r["step"] > step]
    if not dropped:
        return
    with open(path.replace("metrics.jsonl", "metrics-discarded.jsonl"), "a") as f:
        for r in dropped:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    write_jsonl(path, keep)
