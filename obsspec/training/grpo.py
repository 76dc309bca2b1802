"""`obsspec train`: TRL's GRPOTrainer with speculative rollouts and world-model co-training.

    summary = run_training(recipe, out_dir, resume=False, live=make_live("rich"), display=...)
    plan = training_plan(recipe)          # --dry-run: what would run, no model loaded
    plan, text = dry_run_plan(recipe, gpus=8, gpu_memory_gb=80)   # with the GPU plan (training/plan.py)

Setup: the task suite and (for 'tiny') the model kit are built on first use; the policy is loaded
and served by the hf engine *in place*: the engine's model is the trainer's model, so the
rollouts of step k+1 run on the weights that step k's optimizer update left (tested). With a vLLM
server for the policy, the trainer trains a policy LoRA whose new version the server loads
before each round of rollouts (obsspec/training/policy_sync.py; tested against a local server). The world
model is served by its own engine behind a history cache (obsspec/rollout/predictors.py
`WithHistory`), with its LoRA adapter co-trained between steps (obsspec/training/cotrain.py).
Everything TRL does is TRL's: optimisation, clipping, logging, checkpoints.

Run directory (`--out`, default RUN_DIR/train-NAME):
- `recipe.json`               the resolved recipe (+ the task order); `--resume` refuses a different one
- `metrics.jsonl`             one line per step (docs/REPORT.md); `eval.json` val before/after
- `rollouts/step-NNNNNN/`     each step's episodes, as `obsspec rollout` writes them
- `eval/val-before/`, `eval/val-after/`  the val episodes (sequential, no emulated latency)
- `checkpoints/checkpoint-N/` TRL/transformers checkpoints + `obsspec_state.json` (world-model
                              adapter version, history cache), written last: a checkpoint without
                              it is an interrupted save, which `--resume` skips and removes
                              (obsspec/training/checkpoints.py)
- `world_model/adapters/`     published adapter versions; `tensorboard/`, `wandb/` the trackers'
                              logs (obsspec/training/trackers.py)
"""

from __future__ import annotations

import dataclasses
import json
import os

from obsspec.config import Recipe
from obsspec.jsonl import write_json
from obsspec.training.config import TrainConfig, TrainError
from obsspec.training.trackers import Trackers


# ---------------------------------------------------------------------------------------------
# The plan (--dry-run): recipe arithmetic only


def training_plan(recipe: Recipe, num_processes: int = 1, node=None) -> dict:
    """The run's arithmetic; with a `node` (obsspec/training/plan.py `Node`) also where each
    process runs on its GPUs and what each GPU holds (PlanError when it cannot fit)."""
    t, pol, wm = recipe.train, recipe.policy, recipe.world_model
    try:
        recipe.check_training(num_processes)
    except ValueError as e:
        raise TrainError(str(e)) from None
    accum = t.accumulation(num_processes)
    speculative = t.speculative and recipe.rollout.predictor != "none"
    return {
        "policy": {"model": pol.model, "engine": pol.engine, "device": pol.device,
                   "sampling": {"temperature": pol.temperature, "top_p": pol.top_p,
                                "max_turns": pol.max_turns, "max_new_tokens": pol.max_new_tokens,
                                "max_context": pol.max_context},
                   "trained": (f"LoRA rank {t.policy_lora_rank}" if t.policy_lora_rank else "all weights"),
                   "weights_reach_rollouts": ("the engine serves the trainer's model" if pol.engine == "hf"
                                              else "a new LoRA version loaded into the server each step")},
        "world_model": {"model": wm.model, "engine": wm.engine, "device": wm.device,
                        "adapter": wm.adapter or None, "used": speculative,
                        "cotrain_every": t.cotrain_every if speculative else 0,
                        "history_cache": t.history_cache and speculative},
        "steps": t.steps, "processes": num_processes,
        "per_step": {"tasks": t.tasks_per_step, "group_size": t.group_size,
                     "episodes": t.episodes_per_step,
                     "episodes_per_process": t.episodes_per_step // num_processes,
                     "micro_batch": min(t.micro_batch_size, t.episodes_per_step // num_processes),
                     "accumulation": accum},
        "episodes_total": t.steps * t.episodes_per_step,
        "optimizer": {"learning_rate": t.learning_rate, "schedule": t.lr_scheduler,
                      "warmup_steps": t.warmup_steps, "beta": t.beta,
                      "clip": [t.epsilon, t.epsilon_high], "loss_type": t.loss_type},
        "rollouts": {"speculative": speculative, "predictor": recipe.rollout.predictor,
                     "depth": recipe.rollout.depth, "sandbox_timeout_s": recipe.sandbox.timeout_s,
                     "output_cap": recipe.sandbox.output_cap,
                     "emulated_latency": recipe.rollout.latency.kind},
        "checkpoints": {"every": t.save_steps, "keep": t.save_total_limit},
        "eval": {"val_tasks": t.eval_tasks, "group_size": t.eval_group_size},
        "gpu": _gpu_plan(recipe, node, num_processes),
    }


def _gpu_plan(recipe: Recipe, node, num_processes: int) -> dict | None:
    if node is None:
        return None
    from obsspec.training.plan import NoPlan, gpu_plan

    try:
        return gpu_plan(recipe, node, num_processes)
    except NoPlan as e:
        return {"skipped": str(e)}


def dry_run_plan(recipe: Recipe, gpus: int = 0, gpu_memory_gb: float = 0.0) -> tuple[dict, str]:
    """`obsspec train --dry-run`: (the plan, as text). The node is `gpus` x `gpu_memory_gb` when
    given, else this machine's GPUs; the processes are `servers.trainer_gpus`' (else WORLD_SIZE).
    A PlanError carries the text of what was computed (`text`)."""
    from obsspec.training.plan import Node, PlanError, detect_node, named_gpus, render

    if gpus < 0 or gpu_memory_gb < 0 or bool(gpus) != bool(gpu_memory_gb):
        raise TrainError("--gpus N and --gpu-memory-gb G go together (e.g. --gpus 8 --gpu-memory-gb 80)")
    trainer = [x for x in recipe.servers.trainer_gpus.split(",") if x]
    processes = len(trainer) or int(os.environ.get("WORLD_SIZE", "1"))
    node = Node(gpus, gpu_memory_gb) if gpus else detect_node(named_gpus(recipe))
    try:
        plan = training_plan(recipe, processes, node)
    except PlanError as e:
        e.text = render(e.plan) if e.plan and e.plan["gpus"] else ""
        raise
    return plan, plan_text(plan, recipe, node)


def plan_text(plan: dict, recipe: Recipe, node) -> str:
    per, pol, wm = plan["per_step"], plan["policy"], plan["world_model"]
    lines = [f"{recipe.name}: {plan['steps']} steps of {per['tasks']} tasks x {per['group_size']} episodes "
             f"({per['episodes']}), {plan['processes']} process(es) x {per['episodes_per_process']} in "
             f"micro-batches of {per['micro_batch']} ({per['accumulation']} a step)",
             f"policy {pol['model']} on {pol['engine']} ({pol['device']}), trained: {pol['trained']}; "
             f"up to {pol['sampling']['max_turns']} turns, {pol['sampling']['max_context']:,} tokens",
             f"world model {wm['model']} on {wm['engine']} ({wm['device']})"
             + (f", co-trained every {wm['cotrain_every']} step(s)" if wm["cotrain_every"] else "")]
    if plan["gpu"] is not None and "skipped" in plan["gpu"]:
        lines.append(plan["gpu"]["skipped"])
    elif plan["gpu"] is not None:
        from obsspec.training.plan import render

        lines.append(render(plan["gpu"]))
    elif pol["device"] == "cuda":
        lines.append("GPU plan: no GPU here; plan a node with --gpus N --gpu-memory-gb G")
    return "\n".join(lines)


def grpo_args(t: TrainConfig, recipe: Recipe, out_dir: str, num_processes: int):
    import torch
    from trl import GRPOConfig

    from obsspec.training.plan import uses_checkpointing

    accum = t.accumulation(num_processes)
    cuda = recipe.policy.device == "cuda" and torch.cuda.is_available()
    return GRPOConfig(
        output_dir=os.path.join(out_dir, "checkpoints"),
        use_cpu=not cuda, bf16=cuda, fp16=False,
        # on GPUs activations dominate a trainer's memory (obsspec/training/plan.py)
        activation_checkpointing=uses_checkpointing(recipe.policy, cuda),
        per_device_train_batch_size=min(t.micro_batch_size, t.episodes_per_step // num_processes),
        gradient_accumulation_steps=accum, steps_per_generation=accum, num_iterations=1,
        num_generations=t.group_size, max_steps=t.steps, learning_rate=t.learning_rate,
        lr_scheduler_type=t.scheduler_name, warmup_steps=t.warmup_steps, weight_decay=0.0,
        beta=t.beta, epsilon=t.epsilon, epsilon_high=t.epsilon_high, loss_type=t.loss_type,
        max_grad_norm=t.max_grad_norm, ddp_timeout=int(t.collective_timeout_s),
        # the trainer's logprobs must use the temperature the rollouts sampled with
        temperature=recipe.policy.temperature or 1.0, top_p=recipe.policy.top_p,
        max_completion_length=recipe.policy.max_context,
        logging_steps=1, save_strategy="steps", save_steps=t.save_steps,
        # rotation is ours, once a checkpoint is complete (obsspec/training/checkpoints.py)
        save_total_limit=None, report_to=t.trackers,
        seed=t.seed, data_seed=t.seed, shuffle_dataset=False,  # the dataset comes in our order (setup.py)
        remove_unused_columns=False, disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False,
    )


# ---------------------------------------------------------------------------------------------
# The run


def run_training(recipe: Recipe, out_dir: str, resume: bool = False, live=None, display=None) -> dict:
    from accelerate import PartialState

    from obsspec.training import checkpoints
    from obsspec.training.setup import build_run
    from obsspec.progress import NullDisplay

    import warnings
    from datetime import timedelta

    import torch

    # transformers 5.23 warns on every TRL step that TRL still asks is_gradient_checkpointing
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    display = display or NullDisplay()
    # cpu=True lets a CPU run launched with torchrun / accelerate be distributed (gloo); without it
    # accelerate would see one process per launch and every process would train alone.
    # The first initialisation of the process group sets its timeout for the whole run (the
    # trainer's own PartialState finds the group made): the others wait in collectives while the
    # main process alone prepares, evaluates or co-trains (train.collective_timeout_s).
    state = PartialState(cpu=recipe.policy.device != "cuda" or not torch.cuda.is_available(),
                         timeout=timedelta(seconds=recipe.train.collective_timeout_s))
    _check_gpus(recipe, state, display)  # the layout and each GPU's memory, before anything loads
    found = checkpoints.find_checkpoints(os.path.join(out_dir, "checkpoints"))
    checkpoint = found.resume_from
    # every process, before anyone writes
    _check_run_dir(recipe, out_dir, resume, bool(found.complete or found.incomplete))
    state.wait_for_everyone()
    if state.is_main_process:
        os.makedirs(out_dir, exist_ok=True)
        write_json(os.path.join(out_dir, "recipe.json"), _recipe_json(recipe))
        for path in found.incomplete:  # interrupted saves: the redone steps save into these names
            checkpoints.remove(path)
    training_plan(recipe, state.num_processes)  # the batch arithmetic fails here, before any work

    trackers = Trackers(recipe.train, out_dir, state.is_main_process)  # a missing package: one line, now
    trackers.start(_recipe_json(recipe))
    try:
        run = build_run(recipe, out_dir, state, live if state.is_main_process else None, display)
    except BaseException:
        trackers.finish()
        raise
    try:
        if resume:
            run.restore(checkpoint)
            display.log(found.describe(os.path.join(out_dir, "checkpoints")))
        evals = _read_json(os.path.join(out_dir, "eval.json")) or {}
        if "before" not in evals and state.is_main_process and recipe.train.eval_tasks:
            evals["before"] = run.evaluate("val before training", "val-before")
            write_json(os.path.join(out_dir, "eval.json"), evals)
        trainer = run.trainer(grpo_args(recipe.train, recipe, out_dir, state.num_processes))
        log_tensorboard_to(trainer, os.path.join(out_dir, "tensorboard"))
        trackers.log_val(trainer, evals.get("before"))
        trainer.train(resume_from_checkpoint=checkpoint)
        run.finish_cotraining()
        run.sync_policy(trainer)
        if state.is_main_process and recipe.train.eval_tasks:
            evals["after"] = run.evaluate("val after training", "val-after")
            write_json(os.path.join(out_dir, "eval.json"), evals)
            trackers.log_val(trainer, evals["after"])
        summary = run.summary(trainer, evals) if state.is_main_process else {}
    finally:
        run.close()
        trackers.finish()
    if state.is_main_process:
        write_json(os.path.join(out_dir, "summary.json"), summary)
    return summary


def _check_gpus(recipe: Recipe, state, display) -> None:
    """A start on GPUs: this process on the GPU the layout gives its rank, and the plan of the
    detected node (PlanError, on every process, when it does not fit); the main process prints it."""
    from obsspec.training.plan import NoPlan, check_launch, detect_node, gpu_plan, named_gpus, no_gpu_reason, render

    if recipe.policy.device != "cuda":
        return
    node = detect_node(named_gpus(recipe))
    if node is None:  # before any task is prepared or model loaded
        raise TrainError(no_gpu_reason())
    check_launch(recipe, state.process_index, state.local_process_index, state.num_processes)
    try:
        lines = render(gpu_plan(recipe, node, state.num_processes)).splitlines()
    except NoPlan as e:
        lines = [str(e)]
    if state.is_main_process:
        for line in lines:
            display.log(line)


def log_tensorboard_to(trainer, logging_dir: str) -> None:
    """transformers 5 reads TensorBoard's folder from TENSORBOARD_LOGGING_DIR when the trainer is
    built; set on the trainer's callback instead, each run logs to its own folder (a variable set
    for the first run of a process sent a second run's logs there too)."""
    from transformers.integrations import TensorBoardCallback

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            callback.logging_dir = logging_dir


# How a run orders its tasks (obsspec/training/setup.py): saved with the recipe, so a run begun
# under another order (before the kind-interleaved one) is refused on --resume, not continued on
# different data.
TASK_ORDER = "kind-interleaved"


def _recipe_json(recipe: Recipe) -> dict:
    return {**json.loads(json.dumps(dataclasses.asdict(recipe), default=list)), "task_order": TASK_ORDER}


def _check_run_dir(recipe: Recipe, out_dir: str, resume: bool, checkpoint: bool) -> None:
    saved = os.path.join(out_dir, "recipe.json")
    current = _recipe_json(recipe)
    if resume:
        if not os.path.exists(saved):
            raise TrainError(f"{out_dir}: no training run to resume (no recipe.json)")
        before = _read_json(saved)
        if not isinstance(before, dict):
            raise TrainError(f"{saved} is not a run's recipe (a JSON object)")
        changed = sorted(k for k in set(before) | set(current) if before.get(k) != current.get(k))
        if changed:
            raise TrainError(f"{out_dir}: the recipe differs from the run's in {', '.join(changed)}: "
                             "resume with the same recipe and overrides, or start a new run (--out)")
    elif checkpoint or any(os.path.exists(os.path.join(out_dir, name)) for name in ("metrics.jsonl", "eval.json")):
        # (a run that stopped before its first step may have its val-before in eval.json, which a
        # new run there would take for its own; a lone recipe.json is a start that failed)
        raise TrainError(f"{out_dir} already holds a training run: continue it with --resume, or "
                         "choose another --out")
    elif os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise TrainError(f"--out {out_dir} is a file, not a directory")


def _read_json(path: str):
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, OSError) as e:  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
        raise TrainError(f"{path}: not a readable run file ({e})") from None
