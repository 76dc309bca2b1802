"""Val success at each checkpoint (`train.eval_checkpoints`): what `obsspec export --best` picks by.

At a checkpoint save — not the last one, whose weights the val after training measures — and
before obsspec's state marks the checkpoint complete, the main process runs the val episodes on
the weights just saved (the same tasks and seeds as before and after training; the episodes go
to eval/val-step-NNNNNN/) and writes the figures into the checkpoint as `val.json`
(obsspec/training/checkpoints.py reads them; its rotation keeps the best checkpoint). The
trackers get them as `eval/*` at that step. With a vLLM policy server, the server first gets the
weights just saved (every process takes part in that sync, as before each round of rollouts).
"""

from __future__ import annotations

import os

from transformers import TrainerCallback

from obsspec.jsonl import write_json
from obsspec.training.checkpoints import VAL_FILE
from obsspec.training.trackers import val_scalars


class CheckpointVal(TrainerCallback):
    def __init__(self, run):
        self.run = run
        self.trainer = None  # set once the trainer exists (the policy sync needs it)

    def on_save(self, args, state, control, **kwargs):
        t = self.run.recipe.train
        if not (t.eval_checkpoints and t.eval_tasks) or state.global_step >= args.max_steps:
            return
        step = state.global_step
        self.run.sync_policy(self.trainer)
        if not self.run.state.is_main_process:
            return
        evals = self.run.evaluate(f"val at step {step}", f"val-step-{step:06d}")
        write_json(os.path.join(args.output_dir, f"checkpoint-{step}", VAL_FILE), {**evals, "step": step})
        logs = val_scalars(evals)
        if logs:
            self.trainer.callback_handler.on_log(args, state, control, logs)
