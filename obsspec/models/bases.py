"""Pretrained tiny bases: the kit trained long once, evaluated, and shipped with the project.

    obsspec build-bases recipes/tiny-cpu-bases.yaml      # obsspec/models/bases_build.py

A recipe with `kit.bases` set (tiny-cpu.yaml: `tiny-cpu`, the folder obsspec/bases/tiny-cpu/)
starts from those models instead of building its kit, when they were built for its task suite:
`kit_for` (obsspec/build.py) asks `bases_mismatch` first and builds the kit only when it
names a reason, which the log shows.

A bases folder is a kit folder (tokenizer/, policy/, world_model/, kit.json) plus `manifest.json`:
the command that built it, its inputs and their sha256 (the recipe's sections, the prepared
suite's files), what it fits (`built_for`), sizes, the build's time, the machine and the
measured quality (policy success per family, world-model exact hits per command class, both on
held-out val tasks with the rollout's own decoding and hit test).

The build (obsspec/models/bases_build.py) works in `--work` (default .cache/bases/<recipe name>): the prepared suite, the kit
folder with its stage outputs and trainer checkpoints (`build_kit(..., checkpoint_steps)`), the
evaluation. Killed at any point, the same command goes on from there. On one machine the same
inputs give the same bytes; another CPU may round differently during training (the manifest
records the machine).
"""

from __future__ import annotations

import hashlib
import json
import os

SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bases")
MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
SUITE_FILES = ("train.jsonl", "val.jsonl")  # the tasks themselves: generated from seeds, the same on any machine


class BasesError(ValueError):
    """A bases folder that is not there or not whole: one line for the user."""


def bases_dir(name: str) -> str:
    """A bases folder named by `kit.bases`: a path, or the name of one shipped under obsspec/bases/."""
    if os.sep in name or name.startswith("."):
        return os.path.abspath(os.path.expanduser(name))
    return os.path.join(SHIPPED, name)


def read_manifest(root: str) -> dict:
    path = os.path.join(root, MANIFEST)
    if not os.path.isfile(path):
        raise BasesError(f"kit.bases: no {MANIFEST} in {root} (build it with `obsspec build-bases`)")
    with open(path) as f:
        return json.load(f)


def suite_hashes(tasks_dir: str) -> dict[str, str | None]:
    def sha(name: str) -> str | None:
        path = os.path.join(tasks_dir, name)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    return {name: sha(name) for name in SUITE_FILES}


def bases_mismatch(manifest: dict, tasks_dir: str, snapshot_tokens: int, max_context: int,
                   hint_tokens: int = 0) -> str | None:
    """Why these bases do not fit a recipe on the suite in `tasks_dir`, or None when they do: the
    same train and val tasks (so no val task was trained on and the policy knows the families),
    the same world-model snapshot and hint budgets, and positions for the policy's context."""
    built = manifest["built_for"]
    if suite_hashes(tasks_dir) != built["suite"]:
        return (f"built for another task suite ({built['tasks']['num_instances']} instances of "
                f"{', '.join(built['tasks']['families']) or 'all families'}, seed {built['tasks']['seed']})")
    if snapshot_tokens != built["snapshot_tokens"]:
        return f"built with world_model snapshot tokens {built['snapshot_tokens']}, the recipe has {snapshot_tokens}"
    if hint_tokens != built.get("hint_tokens", 0):
        return f"built with world_model hint tokens {built.get('hint_tokens', 0)}, the recipe has {hint_tokens}"
    if max_context > built["max_length"]:
        return f"policy.max_context {max_context} exceeds their {built['max_length']} positions"
    return None
