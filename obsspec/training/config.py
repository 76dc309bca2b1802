"""The `train` recipe section: GRPO with speculative rollouts and world-model co-training.

A frozen dataclass like every section (obsspec/fields.py); `obsspec validate --explain` lists it.
One training step = one generation round = one optimizer update: `tasks_per_step` train tasks,
`group_size` episodes each (a GRPO group), split over the processes in micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

from obsspec.fields import doc
from obsspec.worldmodel.config import peft_lora

TRACKERS = ("tensorboard", "wandb")  # transformers' integrations obsspec sends its metrics to too


@dataclass(frozen=True)
class TrainConfig:
    steps: int = doc(40, "Optimizer steps (each: one round of rollouts, then one GRPO update).")
    families: tuple[str, ...] = doc((), "Train (and evaluate) on these families of the suite only "
                                        "(the suite itself is tasks.families, or rollout.tasks_dir); "
                                        "empty = every family of the suite. GRPO learns nothing from "
                                        "tasks the policy never solves (every group's advantage is 0).")
    task_ids: tuple[str, ...] = doc((), "Train on these train tasks of the suite only (a curriculum: e.g. "
                                        "the ones the policy half solves, where GRPO groups have mixed "
                                        "outcomes); empty = every train task of train.families. Val is "
                                        "unaffected. An id the suite's train split lacks is an error.")
    tasks_per_step: int = doc(4, "Train tasks per step (distinct prompts).")
    group_size: int = doc(4, "Episodes per task: the GRPO group whose mean is the baseline, in "
                             "training and in `obsspec rollout` alike.")
    micro_batch_size: int = doc(16, "Episodes per forward/backward pass on one process; the step's "
                                    "episodes are accumulated over as many passes as needed.")
    learning_rate: float = doc(1e-6, "Peak learning rate of the policy (AdamW).")
    lr_scheduler: str = doc("constant", "Learning-rate schedule (a transformers name: constant, "
                                        "cosine, linear, ...).")
    warmup_steps: int = doc(0, "Steps over which the learning rate ramps up from 0 (Adam's first "
                                "updates move every weight by about the learning rate).")
    beta: float = doc(0.0, "KL penalty against the starting policy (0 = none, no reference model).")
    epsilon: float = doc(0.2, "PPO clip range below 1.")
    epsilon_high: float = doc(0.28, "PPO clip range above 1 (DAPO's clip-higher).")
    loss_type: str = doc("dapo", "TRL's GRPO loss normalisation: dapo, grpo, dr_grpo, bnpo.")
    max_grad_norm: float = doc(1.0, "Gradient clipping norm.")
    policy_lora_rank: int = doc(0, "Train a LoRA adapter of this rank on the policy instead of all "
                                   "its weights (PEFT; 0 = full fine-tuning). Needed with "
                                   "policy.engine=vllm: before every round of rollouts the adapter "
                                   "is published as a new version and loaded into the server under "
                                   "a new name, which those rollouts generate with.")
    policy_lora_alpha: int = doc(0, "LoRA alpha of the policy adapter (0 = twice the rank).")
    policy_lora_targets: tuple[str, ...] = doc(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        "Modules of the policy that get LoRA layers (names vLLM's LoRA support serves).")
    importance_correction: str = doc("auto", "Weight each policy token's advantage by the truncated "
                                             "importance ratio min(exp(trainer - sampler logprob), "
                                             "importance_cap), correcting what the rollouts' sampler did "
                                             "differently from the trainer (a vLLM server's kernels, dtype): "
                                             "on, off, or auto (on when policy.engine is vllm; the hf engine "
                                             "samples from the trainer's own weights). Logs "
                                             "sampler/logp_diff_* and sampler/weight_* every step.")
    importance_cap: float = doc(2.0, "Upper bound of the importance weight (truncated importance sampling).")
    logprob_tolerance: float = doc(0.05, "The first step's check (obsspec/training/sampler.py): the run stops "
                                         "when the rollouts' logprobs differ from the trainer's by more than "
                                         "this many nats per policy token on average. 0.05 sits above float32 "
                                         "gaps (1e-5 measured) and below a misconfigured server's (0.12); a bf16 "
                                         "server's gap at long contexts has not been measured here: the check "
                                         "prints mean and p99 (summary.json logprob_check), and this key is "
                                         "where a measured bf16 gap goes.")
    speculative: bool = doc(True, "Roll out with observation speculation (false: sequentially; "
                                  "the same tokens either way, only the time differs).")
    measure_speculation: bool = doc(False, "Measure what speculation saves, not estimate it: each step's "
                                           "episodes also run sequentially on the same seeds (in alternating "
                                           "order from step to step), and the reduction of rollout time is "
                                           "logged per step (paired/*) and over the run with its 95 % "
                                           "interval. Costs a second rollout pass per step; the speculative "
                                           "pass trains.")
    history_cache: bool = doc(True, "Before asking the world model, look the observation up in "
                                    "the history of earlier episodes (same task, same commands): "
                                    "group members and later epochs share prefixes. Verified like "
                                    "any draft; kept across steps and resumes.")
    cotrain_every: int = doc(1, "Train the world model's LoRA adapter on the fresh (context -> "
                                "real observation) pairs every this many steps and swap the new "
                                "version in before the next rollouts (0 = never: the world model "
                                "stays as loaded).")
    cotrain_epochs: float = doc(2.0, "Passes over one step's fresh pairs per co-training round "
                                     "(LoRA settings: the wm_train section).")
    save_steps: int = doc(10, "Checkpoint every this many steps (and at the end): policy, "
                              "optimizer, world-model adapter, history cache, data position, RNG.")
    save_total_limit: int = doc(2, "Complete checkpoints kept (older ones are deleted once a newer "
                                   "one is complete).")
    keep_adapter_versions: int = doc(3, "Adapter versions kept on disk in each store (policy/adapters, "
                                        "world_model/adapters): the newest this many, and always the one "
                                        "serving, the one `latest` names and those a kept checkpoint "
                                        "records; older ones are deleted as new ones are published (a "
                                        "policy LoRA of rank 64 on Qwen3-8B is ~0.7 GB a version); 0 = keep all.")
    keep_rollouts: int = doc(0, "Steps whose rollout folders (rollouts/step-N, ~0.24 GB a step at 256 "
                                "episodes of 32k tokens) are kept: the newest this many, older ones "
                                "deleted as each step ends; metrics.jsonl keeps every step's figures. "
                                "0 = keep all (`train-worldmodel --data RUN` trains on what is kept).")
    collective_timeout_s: float = doc(10800.0, "How long a process waits for the others in a collective "
                                               "(a barrier, a gather), seconds. Work on the main process "
                                               "alone keeps the others waiting: preparing the suite and "
                                               "the kit, starting the servers, val evaluation before and "
                                               "after training, finishing a co-training round. NCCL's "
                                               "default (10 minutes) would end the run there.")
    eval_tasks: int = doc(16, "Val tasks whose success is measured before and after training "
                              "(same tasks and seeds both times; 0 = skip).")
    eval_group_size: int = doc(2, "Episodes per val task in those evaluations.")
    eval_checkpoints: bool = doc(False, "Also measure val success at every checkpoint but the last "
                                        "(which the val after training measures), into its val.json: "
                                        "`obsspec export RUN --best` picks by it, and rotation never "
                                        "deletes the best one. Costs one val evaluation per save.")
    report_to: tuple[str, ...] = doc(("tensorboard",), "Trackers that get TRL's logs and obsspec's own "
                                                      "metrics as well as metrics.jsonl: tensorboard, "
                                                      "wandb (pip install 'obsspec[wandb]'), several "
                                                      "([tensorboard, wandb]) or none.")
    seed: int = doc(0, "Seed of the data order, initialisation and per-episode sampling seeds.")

    def __post_init__(self) -> None:
        for name in ("steps", "tasks_per_step", "micro_batch_size", "save_steps", "save_total_limit",
                     "eval_group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1 (got {getattr(self, name)})")
        if self.group_size < 2:
            raise ValueError(f"train.group_size must be >= 2: GRPO's baseline is the group mean, "
                             f"a group of {self.group_size} has no signal")
        if self.policy_lora_rank < 0 or self.policy_lora_alpha < 0:
            raise ValueError("train.policy_lora_rank and train.policy_lora_alpha must be >= 0")
        if self.policy_lora_rank and not self.policy_lora_targets:
            raise ValueError("train.policy_lora_targets is empty: name the modules that get LoRA layers")
        if self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps must be >= 0 (got {self.warmup_steps})")
        if self.cotrain_every < 0 or self.eval_tasks < 0 or self.cotrain_epochs <= 0:
            raise ValueError("train.cotrain_every and train.eval_tasks must be >= 0, "
                             "train.cotrain_epochs > 0")
        if self.learning_rate <= 0 or self.beta < 0 or self.max_grad_norm <= 0:
            raise ValueError("train.learning_rate and max_grad_norm must be > 0, train.beta >= 0")
        if not (0 <= self.epsilon < 1 and self.epsilon_high >= 0):
            raise ValueError("train.epsilon must be in [0, 1) and train.epsilon_high >= 0")
        if self.loss_type not in ("dapo", "grpo", "dr_grpo", "bnpo"):
            raise ValueError("train.loss_type must be dapo, grpo, dr_grpo or bnpo")
        if self.importance_correction not in ("auto", "on", "off"):
            raise ValueError(f"train.importance_correction must be auto, on or off (got {self.importance_correction!r})")
        if not self.logprob_tolerance > 0:
            raise ValueError(f"train.logprob_tolerance must be > 0 nats (got {self.logprob_tolerance})")
        if not self.importance_cap >= 1:
            raise ValueError(f"train.importance_cap must be >= 1 (got {self.importance_cap}): a cap below 1 "
                             "would shrink every token's weight, not just the outliers'")
        unknown = [name for name in self.report_to if name not in TRACKERS + ("none",)]
        if unknown or ("none" in self.report_to and len(self.report_to) > 1):
            raise ValueError(f"train.report_to must be none or any of {', '.join(TRACKERS)} "
                             f"(got {', '.join(self.report_to) or 'nothing'})")
        if self.keep_adapter_versions < 0 or self.keep_rollouts < 0:
            raise ValueError("train.keep_adapter_versions and train.keep_rollouts must be >= 0 (0 = keep all)")
        if not self.collective_timeout_s > 0:
            raise ValueError(f"train.collective_timeout_s must be > 0 (got {self.collective_timeout_s})")

    def policy_lora(self):
        """The PEFT LoraConfig of the policy adapter, or None (full fine-tuning)."""
        if not self.policy_lora_rank:
            return None
        return peft_lora(self.policy_lora_rank, self.policy_lora_alpha or 2 * self.policy_lora_rank,
                         self.policy_lora_targets)

    @property
    def scheduler_name(self) -> str:
        """The transformers schedule: its 'constant' ignores warm-up steps, 'constant_with_warmup'
        is the same schedule with them."""
        if self.lr_scheduler == "constant" and self.warmup_steps:
            return "constant_with_warmup"
        return self.lr_scheduler

    @property
    def trackers(self) -> list[str]:
        """`report_to` as TRL's `report_to` list ([] for none)."""
        return [name for name in self.report_to if name != "none"]

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.group_size

    def accumulation(self, num_processes: int) -> int:
        """Micro-batches per optimizer step on each process; the step's episodes must split
        evenly over processes and micro-batches (TRL's generation batch has to)."""
        per_process, rem = divmod(self.episodes_per_step, num_processes)
        if rem or per_process % min(self.micro_batch_size, per_process):
            raise ValueError(
                f"train.tasks_per_step x train.group_size = {self.episodes_per_step} episodes per "
                f"step must split evenly over {num_processes} process(es) and micro-batches of "
                f"train.micro_batch_size = {self.micro_batch_size}: change one of them")
        return per_process // min(self.micro_batch_size, per_process)


class TrainError(ValueError):
    """A problem the user can fix (an existing run without --resume, a different recipe)."""
