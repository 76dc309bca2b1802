"""Trackers (`train.report_to`): TensorBoard and/or Weights & Biases get obsspec's metrics too.

    trackers = Trackers(recipe.train, out_dir, is_main)   # checks the packages first (one line)
    trackers.start(recipe_dict)                          # W&B: a run whose files go to RUN/wandb
    trackers.log_val(trainer, evals["before"])           # val figures as eval/* at the current step
    trackers.finish()

transformers' own callbacks send TRL's logs (loss, reward, clipping, ...). obsspec's per-step
figures — hit rate by source, time hidden, speculation skipped and why, committed work delayed,
world-model co-training, policy sync — reach them because `MetricsLog` (obsspec/training/setup.py)
runs before them and adds `scalars(row)` into the very log dict they then send; the val figures
are sent through the same callbacks with transformers' `eval_` prefix (shown as `eval/...`).

W&B's run is started here rather than by transformers' callback (which only joins a running one):
its files then go to RUN/wandb (unless WANDB_DIR says otherwise), its name is the run folder's,
its config is the resolved recipe, and it is finished when the run ends, so a second run in the
same process is a second W&B run. WANDB_MODE=offline keeps everything in that folder
(`wandb sync RUN/wandb/offline-run-*` uploads it later); WANDB_PROJECT names the project
(default "obsspec").
"""

from __future__ import annotations

import importlib.util
import os

from obsspec.training.config import TrainConfig, TrainError

WANDB_PIN = "wandb==0.31.0"  # the version tested here (pyproject's `wandb` extra)
INSTALL = {"wandb": f"pip install 'obsspec[wandb]' (or {WANDB_PIN})", "tensorboard": "pip install tensorboard"}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # (a module set to None in sys.modules: blocked)
        return False


def check_installed(trackers: list[str]) -> None:
    """One line naming the install for a tracker whose package is missing."""
    for name in trackers:
        if not installed(name):
            raise TrainError(f"train.report_to: {name} is not installed: {INSTALL[name]}")


def scalars(row: dict, skip=()) -> dict:
    """The numbers of a metrics.jsonl row a tracker can plot: numeric values, and each command
    class's world-model hit rate (`spec/wm_hit_rate/CLASS`) from its [hits, compared] pair."""
    out = {k: float(v) for k, v in row.items()
           if k not in skip and k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    for cls, (hits, n) in sorted((row.get("spec/wm_class_hits") or {}).items()):
        if n:
            out[f"spec/wm_hit_rate/{cls}"] = hits / n
    return out


def val_scalars(evals: dict) -> dict:
    """A val evaluation (TrainingRun.evaluate) as `eval_*` logs: success, reward, per kind."""
    out = {}
    for key in ("success_frac", "reward_mean"):
        if isinstance(evals.get(key), (int, float)):
            out[f"eval_{key}"] = float(evals[key])
    for kind, (wins, n) in sorted((evals.get("success_by_kind") or {}).items()):
        if n:
            out[f"eval_success/{kind}"] = wins / n
    return out


class Trackers:
    def __init__(self, t: TrainConfig, out_dir: str, is_main: bool):
        self.names, self.out_dir, self.is_main = t.trackers, out_dir, is_main
        check_installed(self.names)
        self._wandb = None

    def start(self, config: dict) -> None:
        """Start W&B's run (main process only) before any model loads: a missing login fails now."""
        if "wandb" not in self.names or not self.is_main:
            return
        import wandb

        folder = os.environ.get("WANDB_DIR") or self.out_dir
        os.makedirs(folder, exist_ok=True)
        try:
            wandb.init(dir=folder, project=os.environ.get("WANDB_PROJECT", "obsspec"),
                       name=os.path.basename(os.path.normpath(self.out_dir)), config=config,
                       reinit="finish_previous")
        except (wandb.errors.UsageError, wandb.errors.CommError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise TrainError(f"train.report_to: wandb could not start ({first}): `wandb login`, "
                             "or WANDB_MODE=offline to log into the run folder only") from None
        self._wandb = wandb

    def log_val(self, trainer, evals: dict | None) -> None:
        """Val figures to every tracker at the trainer's current step (0 before training)."""
        logs = val_scalars(evals or {})
        if self.names and logs:
            trainer.callback_handler.on_log(trainer.args, trainer.state, trainer.control, logs)

    def finish(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
