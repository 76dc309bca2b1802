"""What an export takes from a training run: which checkpoint, the bases, the figures measured.

    source = read_run("runs/train-tiny-cpu", step=None, best=False)
    source.checkpoint, source.step, source.note        # checkpoints/checkpoint-N, N, one line
    source.policy_base, source.wm_base, source.wm_adapter
    source.val, source.speculation                     # for the model card

The checkpoint is, in order: `--step N` (a complete checkpoint of that step); `--best` (the
complete checkpoint of highest measured val success: `val.json`, which `train.eval_checkpoints`
writes, and for the last step the val after training); else the newest complete checkpoint —
for a run that was killed, the note says which one and which interrupted saves it skipped.
The world model is the adapter version that checkpoint recorded (`obsspec_state.json`: the one
serving the next rollouts) on its base; none recorded = the run's starting adapter, or the base.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from obsspec.export import ExportError
from obsspec.jsonl import read_jsonl
from obsspec.rollout.gate import SKIP_REASONS
from obsspec.rollout.metrics import mean_of
from obsspec.training import checkpoints as ck


@dataclass
class RunSource:
    run_dir: str
    recipe: dict
    checkpoint: str
    step: int
    steps: int                      # the run's planned steps (train.steps)
    finished: bool                  # summary.json is there: the run ended
    picked: str                     # how the checkpoint was chosen, one phrase
    note: str                       # one line for the console
    policy_base: str | None
    policy_lora: bool
    wm_base: str | None
    wm_adapter: str | None          # an adapter folder to merge into wm_base (None: the base as is)
    wm_version: int | None
    val: dict = field(default_factory=dict)          # before / at_step / candidates
    speculation: dict = field(default_factory=dict)  # measured over steps 1..step


def read_run(run_dir: str, step: int | None = None, best: bool = False) -> RunSource:
    if step is not None and best:
        raise ExportError("--step and --best pick a checkpoint each: give one of them")
    if not os.path.isdir(run_dir):
        raise ExportError(f"{run_dir}: no such folder")
    recipe = _json(os.path.join(run_dir, "recipe.json"))
    if not isinstance(recipe, dict) or "train" not in recipe:
        raise ExportError(f"{run_dir}: not a training run (no recipe.json of `obsspec train`)")
    root = os.path.join(run_dir, "checkpoints")
    found = ck.find_checkpoints(root)
    summary = _json(os.path.join(run_dir, "summary.json"))
    finished = isinstance(summary, dict)
    evals = _json(os.path.join(run_dir, "eval.json")) or {}
    last = summary.get("steps") if finished else None
    measured = _measured(found.complete, evals, last)
    if not found.complete:
        raise ExportError(f"{run_dir}: no complete checkpoint to export (the run saves every "
                          f"train.save_steps = {recipe['train'].get('save_steps')} steps)")
    if step is not None:
        checkpoint = os.path.join(root, f"checkpoint-{step}")
        if checkpoint not in found.complete:
            have = ", ".join(str(ck.step_of(p)) for p in found.complete)
            why = "its save was interrupted" if os.path.isdir(checkpoint) else "there is none"
            raise ExportError(f"{run_dir}: no complete checkpoint of step {step} ({why}; "
                              f"complete: {have})")
        picked = f"--step {step}"
    elif best:
        checkpoint = ck.best(measured)
        if checkpoint is None:
            raise ExportError(f"{run_dir}: no checkpoint has a measured val success: train with "
                              "train.eval_checkpoints=true (and train.eval_tasks > 0), or pick one "
                              "with --step N")
        picked = (f"--best: val success {measured[checkpoint]:.3f}, the highest of "
                  f"{len(measured)} measured checkpoint(s)")
    else:
        checkpoint = found.resume_from
        picked = "the newest complete checkpoint"
    n = ck.step_of(checkpoint)
    steps = recipe["train"].get("steps", n)
    name = os.path.basename(checkpoint)
    if finished or step is not None or best:
        note = f"exporting {name} (step {n} of {steps}; {picked})"
    else:
        skipped = ", ".join(os.path.basename(p) for p in found.incomplete)
        note = (f"{run_dir} did not finish (no summary.json): exporting its newest complete "
                f"checkpoint, {name} (step {n} of {steps})"
                + (f"; skipping {skipped}: its save was interrupted" if skipped else ""))
    source = RunSource(run_dir, recipe, checkpoint, n, steps, finished, picked, note,
                       *_bases(run_dir, recipe, checkpoint))
    source.val = {"before": evals.get("before"),
                  "at_step": ck.read_val(checkpoint) or (evals.get("after") if n == last else None),
                  "measured": {ck.step_of(p): v for p, v in sorted(measured.items(), key=lambda x: ck.step_of(x[0]))}}
    source.speculation = speculation(_metrics(run_dir), n)
    return source


def _measured(complete: list[str], evals: dict, last: int | None) -> dict[str, float]:
    """checkpoint -> val success measured on its weights."""
    out = {}
    for path in complete:
        val = ck.read_val(path)
        if val is None and ck.step_of(path) == last and isinstance(evals.get("after"), dict):
            val = evals["after"]  # the val after training measured the last checkpoint's weights
        if val is not None and isinstance(val.get("success_frac"), (int, float)):
            out[path] = float(val["success_frac"])
    return out


def _bases(run_dir: str, recipe: dict, checkpoint: str):
    """(policy base, policy is a LoRA, world-model base, adapter to merge, its version)."""
    from obsspec.training.setup import MODELS_FILE  # the bases the run loaded

    models = _json(os.path.join(run_dir, MODELS_FILE)) or {}
    lora = os.path.isfile(os.path.join(checkpoint, "adapter_config.json"))
    policy = models.get("policy") or (_adapter_base(checkpoint) if lora else None)
    version = ck.read_state(checkpoint).get("wm_version")
    adapter = None
    if version is not None:
        from obsspec.worldmodel.adapters import AdapterStore

        adapter = AdapterStore(os.path.join(run_dir, "world_model", "adapters")).get(version).path
    elif recipe.get("world_model", {}).get("adapter"):
        from obsspec.worldmodel.adapters import resolve_adapter

        adapter = resolve_adapter(recipe["world_model"]["adapter"]).path
    wm = models.get("world_model") or (_adapter_base(adapter) if adapter else None)
    if wm is None and recipe.get("world_model", {}).get("model") not in (None, "", "tiny"):
        wm = recipe["world_model"]["model"]
    return policy, lora, wm, adapter, version


def _adapter_base(folder: str) -> str | None:
    config = _json(os.path.join(folder, "adapter_config.json")) or {}
    return config.get("base_model_name_or_path")


# ---------------------------------------------------------------------------------------------
# The speculation figures of steps 1..N (the same reductions as the end-of-run table)


def speculation(rows: list[dict], step: int) -> dict:
    rows = [r for r in rows if isinstance(r.get("step"), int) and r["step"] <= step]
    if not rows:
        return {}
    saved = sum(r.get("latency_saved_sec") or 0.0 for r in rows)
    rollout = sum(r.get("rollout_sec") or 0.0 for r in rows)
    classes: dict[str, list[int]] = {}
    for r in rows:
        for cls, (hits, n) in (r.get("spec/wm_class_hits") or {}).items():
            classes.setdefault(cls, [0, 0])
            classes[cls][0] += hits
            classes[cls][1] += n
    return {"steps": len(rows),
            "hit_rate_mean": mean_of([r.get("spec/exact_frac") for r in rows]),
            "wm_hit_rate_mean": mean_of([r.get("spec/exact_frac_wm") for r in rows]),
            "cache_hit_rate_mean": mean_of([r.get("spec/exact_frac_cache") for r in rows]),
            "hits": {src: sum(r.get(f"spec/hits_{src}") or 0 for r in rows) for src in ("wm", "cache", "sibling")},
            "wm_class_hits": dict(sorted(classes.items())),
            "skipped_frac_mean": mean_of([r.get("spec/skipped_frac") for r in rows]),
            "skips": {reason: sum(r.get(f"spec/skipped_{reason}") or 0 for r in rows) for reason in SKIP_REASONS},
            "committed_delay_frac_max": max((r.get("committed_delay_frac") or 0.0 for r in rows), default=None),
            "latency_saved_sec": saved, "rollout_sec": rollout,
            "latency_saved_frac_mean": mean_of([r.get("latency_saved_frac") for r in rows]),
            "wm_loss_last": next((r["wm/loss"] for r in reversed(rows) if r.get("wm/loss") is not None), None)}


def _metrics(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    return read_jsonl(path, ExportError) if os.path.exists(path) else []


def _json(path: str):
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, OSError) as e:
        raise ExportError(f"{path}: not a readable run file ({e})") from None
