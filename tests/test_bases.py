"""Pretrained bases (obsspec/models/bases.py): a resumable build, and recipes that use them only
when they were built for the recipe's suite.

Run: .venv/bin/python -m pytest -q tests/test_bases.py
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from typer.testing import CliRunner

from obsspec import build
from obsspec.cli import app
from obsspec.config import load_recipe
from obsspec.models import bases, kit, warmstart
from obsspec.progress import NullDisplay
from test_kit import SAMPLING, SANDBOX, TINY, write_suite


class Killed(Exception):
    pass


class KillAt(NullDisplay):
    """A display that raises at the n-th step of one training: a build killed mid-way."""

    def __init__(self, label: str, n: int):
        self.label, self.n, self.current, self.steps = label, n, "", 0

    def start(self, total, label=""):
        self.current = label

    def advance(self, k=1):
        if self.current == self.label:
            self.steps += k
            if self.steps >= self.n:
                raise Killed()


def weights(path: str) -> bytes:
    with open(os.path.join(path, "model.safetensors"), "rb") as f:
        return f.read()


def test_a_killed_build_resumes_from_its_checkpoint_to_the_same_bytes(tmp_path, monkeypatch):
    """Killed in the world model's training after a checkpoint, the build keeps the tokenizer
    and the policy it finished and resumes the world model from the checkpoint; the result is
    byte for byte that of an uninterrupted build (checkpoints fall on epoch ends: 6 rows in
    batches of 2 are 3 steps, and checkpoint_steps=2 rounds to 3)."""
    suite = write_suite(tmp_path / "suite")
    cfg = dataclasses.replace(TINY, world_model=dataclasses.replace(TINY.world_model, epochs=3.0))
    whole = str(tmp_path / "whole")
    kit.build_kit(suite, whole, cfg, SANDBOX, SAMPLING, NullDisplay(), checkpoint_steps=2)
    assert not [n for n in os.listdir(whole) if n.startswith((".", "kit.partial"))], "checkpoints removed"

    broken = str(tmp_path / "broken")
    with pytest.raises(Killed):
        kit.build_kit(suite, broken, cfg, SANDBOX, SAMPLING, KillAt("world_model", 5), checkpoint_steps=2)
    assert os.path.isdir(os.path.join(broken, ".world_model-trainer", "checkpoint-3"))
    assert not os.path.exists(os.path.join(broken, "kit.json"))
    trained = []
    original = warmstart.train
    monkeypatch.setattr(warmstart, "train", lambda *a, **k: trained.append(a[7]) or original(*a, **k))
    logged = []
    display = NullDisplay()
    display.log = logged.append
    report = kit.build_kit(suite, broken, cfg, SANDBOX, SAMPLING, display, checkpoint_steps=2)
    assert trained == ["world_model"], "the finished policy is not trained again"
    assert any("resuming from" in m and "checkpoint-3" in m for m in logged)
    assert report["world_model"]["steps"] == 9 and report["policy"]["steps"] == 3
    for name in ("policy", "world_model"):
        assert weights(os.path.join(broken, name)) == weights(os.path.join(whole, name)), name


def write_tasks(suite: str, val_words: str = "val") -> None:
    for split in ("train", "val"):
        with open(os.path.join(suite, f"{split}.jsonl"), "w") as f:
            f.write(json.dumps({"task_id": f"{split}-1", "words": val_words if split == "val" else "t"}) + "\n")


def fake_bases(root: str, suite: str, **built_for) -> str:
    os.makedirs(root)
    manifest = {"built_for": {"suite": bases.suite_hashes(suite), "snapshot_tokens": 0, "max_length": 2048,
                              "tasks": {"num_instances": 8, "families": ["count-lines"], "seed": 0},
                              **built_for}}
    with open(os.path.join(root, bases.MANIFEST), "w") as f:
        json.dump(manifest, f)
    return root


def test_a_recipe_uses_the_bases_only_on_the_suite_they_were_built_for(tmp_path, monkeypatch):
    suite = write_suite(tmp_path / "suite")
    write_tasks(suite)
    root = fake_bases(str(tmp_path / "bases"), suite)
    built = []
    monkeypatch.setattr(kit, "ensure_kit", lambda *a, **k: built.append(a) or "kit")
    recipe = load_recipe(None, [f"kit.bases={root}"])
    assert build.kit_for(recipe, suite) == kit.KitPaths.under(root) and not built

    logged = []
    display = NullDisplay()
    display.log = logged.append
    write_tasks(suite, val_words="another val task")  # another suite: its val tasks may have been trained on
    assert build.kit_for(recipe, suite, display) == "kit" and len(built) == 1
    assert "do not fit" in logged[-1] and "another task suite" in logged[-1] and "8 instances of count-lines" in logged[-1]

    write_tasks(suite)
    snapshot = load_recipe(None, [f"kit.bases={root}", "world_model.workspace_snapshot=true",
                                      "policy.max_context=1024"])
    assert build.kit_for(snapshot, suite, display) == "kit" and "snapshot tokens 0" in logged[-1]
    hinted = load_recipe(None, [f"kit.bases={root}", "world_model.hint_tokens=128", "policy.max_context=1024"])
    assert build.kit_for(hinted, suite, display) == "kit" and "hint tokens 0, the recipe has 128" in logged[-1]
    assert built[-1] and build.kit_for(load_recipe(None, [f"kit.bases={root}"]), suite) == kit.KitPaths.under(root)
    assert bases.bases_mismatch(bases.read_manifest(root), suite, 0, 4096).startswith("policy.max_context 4096")
    assert build.kit_for(load_recipe(None, []), suite) == "kit", "no kit.bases: always the kit"


def test_bases_names_and_missing_folders_are_clear(tmp_path):
    assert bases.bases_dir("tiny-cpu") == os.path.join(bases.SHIPPED, "tiny-cpu")
    assert bases.bases_dir(str(tmp_path / "b")) == str(tmp_path / "b")
    with pytest.raises(bases.BasesError, match="no manifest.json in .*nowhere.*obsspec build-bases"):
        bases.read_manifest(str(tmp_path / "nowhere"))
    result = CliRunner().invoke(app, ["validate", f"kit.bases={tmp_path}/nowhere"])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "obsspec build-bases" in result.output
    result = CliRunner().invoke(app, ["build-bases", "recipes/tiny-cpu.yaml", "kit.bases="])
    assert result.exit_code == 2 and "--out DIR or kit.bases" in result.output


def test_a_work_folder_of_other_task_settings_is_refused(tmp_path):
    from obsspec.env.suite import suite_settings
    from obsspec.models.bases_build import build_bases

    recipe = load_recipe("recipes/tiny-cpu.yaml", [])
    os.makedirs(tmp_path / "tasks")
    other = dataclasses.replace(recipe.tasks, num_instances=7)
    with open(tmp_path / "tasks" / "manifest.json", "w") as f:
        json.dump({"tasks": suite_settings(other)}, f)
    with pytest.raises(bases.BasesError, match="other tasks.* settings.*--work"):
        build_bases(recipe, str(tmp_path / "out"), str(tmp_path))


@pytest.mark.parametrize("name", ["tiny-cpu.yaml", "tiny-cpu-bases.yaml", "tiny-cpu-vllm.yaml"])
def test_the_shipped_bases_fit_the_recipes_that_name_them(name, monkeypatch):
    """`bases_mismatch` on the shipped manifest, short of preparing the suite (its files' hashes
    stand in; the suite's settings are compared instead): a recipe that names the shipped bases
    but reads other hints, or draws another suite, would silently build its quick kit."""
    from obsspec.env.suite import suite_settings

    recipe = load_recipe(f"recipes/{name}")
    assert recipe.kit.bases == "tiny-cpu"
    manifest = bases.read_manifest(bases.bases_dir("tiny-cpu"))
    assert manifest["built_for"]["tasks"] == suite_settings(recipe.tasks)
    monkeypatch.setattr(bases, "suite_hashes", lambda tasks_dir: manifest["built_for"]["suite"])
    wm = recipe.world_model
    assert bases.bases_mismatch(manifest, "unprepared", wm.snapshot_budget, recipe.policy.max_context,
                                wm.hint_tokens) is None
