"""`build_bases`: what `obsspec build-bases` runs (obsspec/models/bases.py says what bases are).

    manifest = build_bases(recipe, "obsspec/bases/tiny-cpu", ".cache/bases/tiny-cpu-bases", display)
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import time

from obsspec.models.bases import MANIFEST, MANIFEST_FORMAT, BasesError, suite_hashes
from obsspec.progress import Display, NullDisplay
from obsspec.provenance import commit

CHECKPOINT_STEPS = 100  # trainer checkpoints of a bases build, about every this many steps (whole epochs)


def build_bases(recipe, out: str, work: str, display: Display | None = None, command: str = "",
                eval_group_size: int = 4) -> dict:
    """Prepare the recipe's suite, build its kit with checkpoints, evaluate it on the val split,
    and write the bases (kit folder + manifest) to `out`, replacing what was there. Resumable:
    every stage's output stays in `work`."""
    import asyncio

    from obsspec.env.suite import prepare_tasks, suite_settings
    from obsspec.models.evaluate import evaluate_val
    from obsspec.models.kit import KitPaths, build_kit, kit_key
    from obsspec.rollout.config import sampling

    display = display or NullDisplay()
    snapshot_tokens, hint_tokens = recipe.world_model.snapshot_budget, recipe.world_model.hint_tokens
    tasks_dir = os.path.join(work, "tasks")
    prepared = os.path.join(tasks_dir, "manifest.json")
    if not os.path.exists(prepared):
        display.log(f"bases: preparing the task suite in {tasks_dir}")
        asyncio.run(prepare_tasks(recipe.tasks, recipe.sandbox, tasks_dir, display))
    with open(prepared) as f:
        if json.load(f)["tasks"] != suite_settings(recipe.tasks):  # a work folder of other settings
            raise BasesError(f"{tasks_dir} was prepared with other tasks.* settings than the recipe's: "
                             "give another --work (or remove that folder)")
    settings = sampling(recipe.policy, recipe.rollout.seed)
    key = kit_key(tasks_dir, recipe.kit, recipe.sandbox, settings, snapshot_tokens, hint_tokens)
    paths = KitPaths.under(os.path.join(work, f"kit-{key[:16]}"))
    if not os.path.exists(paths.report):
        display.log(f"bases: building the models in {paths.root} (resumable: run the same command again)")
        build_kit(tasks_dir, paths.root, recipe.kit, recipe.sandbox, settings, display, snapshot_tokens,
                  checkpoint_steps=CHECKPOINT_STEPS, reuse_from=work, hint_tokens=hint_tokens)
    t0 = time.monotonic()  # the manifest's `evaluate_and_write_sec` (kit.json has the build's)
    quality_path = os.path.join(paths.root, "quality.json")
    if not os.path.exists(quality_path):
        display.log("bases: evaluating on the val split (policy episodes, world-model drafts)")
        quality = asyncio.run(evaluate_val(recipe, tasks_dir, policies=("warm",), world_model="kit",
                                           group_size=eval_group_size, paths=paths, display=display))
        with open(quality_path, "w") as f:
            json.dump(quality, f, indent=2, sort_keys=True)
    with open(quality_path) as f:
        quality = json.load(f)
    manifest = _manifest(recipe, paths, tasks_dir, snapshot_tokens, quality, command,
                         round(time.monotonic() - t0, 1))
    _install(paths, manifest, out)
    display.log(f"bases: written to {out}")
    return manifest


def _manifest(recipe, paths, tasks_dir: str, snapshot_tokens: int, quality: dict, command: str,
              sec: float) -> dict:
    import torch
    import transformers

    kit = paths.read_report()
    with open(os.path.join(tasks_dir, "manifest.json")) as f:
        suite = json.load(f)

    def size(folder: str) -> int:
        return sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(folder) for n in ns)

    def policy_figures(q: dict) -> dict:
        keys = ("success_frac", "per_family", "groups", "mixed_group_frac", "parse_valid_frac", "episodes")
        return {k: q.get(k) for k in keys}

    def wm_figures(q: dict) -> dict:
        keys = ("steps", "exact_frac", "unusable_frac", "per_class", "classes_with_output_hit", "draft_sec_mean")
        return {k: q.get(k) for k in keys}

    return {
        "format": MANIFEST_FORMAT,
        "command": command,
        "built_for": {"suite": suite_hashes(tasks_dir), "tasks": suite["tasks"],
                      "snapshot_tokens": snapshot_tokens, "max_length": recipe.kit.max_length,
                      **({"hint_tokens": recipe.world_model.hint_tokens} if recipe.world_model.hint_tokens else {})},
        "inputs": {"kit": dataclasses.asdict(recipe.kit), "sandbox": dataclasses.asdict(recipe.sandbox),
                   "policy": dataclasses.asdict(recipe.policy), "suite_sha256": suite["sha256"],
                   "suite_counts": suite["counts"], "families": suite["families"]},
        "models": {name: {"parameters": kit[name]["parameters"], "bytes": size(getattr(paths, name)),
                          "steps": kit[name]["steps"], "train_sec": kit[name]["train_sec"],
                          "eval_loss": kit[name].get("eval_loss")}
                   for name in ("policy", "world_model")},
        # (the world model's listing stage and copy curriculum, kit.listing_steps and kit.copy_steps:
        # before its real rows)
        **{stage: {k: kit[stage].get(k) for k in ("examples", "steps", "train_sec", "eval_loss")}
           for stage in ("world_model_listings", "world_model_copies") if stage in kit},
        "vocab": kit["tokenizer"]["vocab"],
        "build_sec": kit["build_sec"], "evaluate_and_write_sec": sec,
        # (a build that copied its earlier stages from another kit: that kit and its own build_sec)
        **({"stages_from": kit["stages_from"]} if "stages_from" in kit else {}),
        "quality": {"policy": policy_figures(quality.get("warm", {})),
                    **{k: wm_figures(v) for k, v in quality.items() if k.startswith("world_model_")},
                    "sampling": quality.get("sampling")},
        "code": commit(),
        "machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "transformers": transformers.__version__},
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def _install(paths, manifest: dict, out: str) -> None:
    """Copy the kit's models (not its stage outputs) and the manifest into `out`, replacing it whole."""
    tmp = out.rstrip("/") + ".new"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in ("tokenizer", "policy", "world_model"):
        shutil.copytree(getattr(paths, name), os.path.join(tmp, name))
    shutil.copy(paths.report, os.path.join(tmp, "kit.json"))
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.write("\n")
    if os.path.exists(out):
        shutil.rmtree(out)
    os.rename(tmp, out)
