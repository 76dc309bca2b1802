"""train.report_to: the tracker names a recipe takes, the one-line error for a missing package,
and the figures obsspec adds to what the trackers get (tests/test_export.py checks a real run's
TensorBoard and W&B logs).

Run: .venv/bin/python -m pytest -q tests/test_trackers.py
"""

import subprocess
import sys

import pytest

from obsspec.config import ConfigError, load_recipe
from obsspec.training.trackers import scalars, val_scalars
from test_cli import ROOT


@pytest.mark.parametrize("value, want", [("tensorboard", ["tensorboard"]), ("none", []), ("wandb", ["wandb"]),
                                         ("[tensorboard,wandb]", ["tensorboard", "wandb"]),
                                         ("tensorboard,wandb", ["tensorboard", "wandb"])])
def test_report_to_takes_one_tracker_several_or_none(value, want):
    assert load_recipe("recipes/tiny-cpu.yaml", [f"train.report_to={value}"]).train.trackers == want


@pytest.mark.parametrize("value", ["mlflow", "[none,wandb]"])
def test_report_to_refuses_unknown_trackers_and_none_with_others(value):
    with pytest.raises(ConfigError, match="train.report_to must be none or any of tensorboard, wandb"):
        load_recipe("recipes/tiny-cpu.yaml", [f"train.report_to={value}"])


BLOCKED = """
import sys
sys.modules["wandb"] = None  # as if it were not installed
from obsspec.cli import app
app(sys.argv[1:], prog_name="obsspec")
"""


def test_wandb_without_the_package_is_one_line_naming_the_install(tmp_path):
    r = subprocess.run([sys.executable, "-c", BLOCKED, "train", "recipes/tiny-cpu.yaml", "train.report_to=wandb",
                        "--out", str(tmp_path / "run"), "--display", "none"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip() == ("error: train.report_to: wandb is not installed: pip install 'obsspec[wandb]' "
                                "(or wandb==0.31.0)")
    assert not (tmp_path / "run" / "models.json").exists(), "it failed before loading any model"


def test_the_trackers_get_the_rows_numbers_not_twice_and_per_class_hit_rates():
    row = {"step": 3, "loss": 0.5, "spec/exact_frac": 0.25, "wm/version": 2, "wm/loss": None,
           "spec/wm_class_hits": {"ls": [1, 4], "cat": [0, 0]}, "success_by_kind": {"a/b": [1, 2]},
           "cache/hits": 0, "flag": True}
    got = scalars(row, skip={"loss": 0.5, "spec/exact_frac": 0.25})
    assert got == {"wm/version": 2.0, "cache/hits": 0.0, "spec/wm_hit_rate/ls": 0.25}
    evals = {"success_frac": 0.5, "reward_mean": 0.5, "episodes": 4, "success_by_kind": {"f/k": [1, 2]}}
    assert val_scalars(evals) == {"eval_success_frac": 0.5, "eval_reward_mean": 0.5, "eval_success/f/k": 0.5}


def test_pyproject_pins_the_wandb_it_names():
    text = open(f"{ROOT}/pyproject.toml").read()
    assert 'wandb = ["wandb==0.31.0"]' in text and '"wandb==0.31.0"' in text.split("dev = [", 1)[1].split("]", 1)[0]


def test_the_cotraining_worker_replies_through_what_a_library_prints_on_import(tmp_path):
    """transformers prints '[INFO] Running in WANDB offline mode' on import when WANDB_MODE is
    offline, before the worker moves its stdout to the log: a line for the log, not a reply."""
    from obsspec.training.cotrain import Worker

    worker = object.__new__(Worker)
    worker.log_path = str(tmp_path / "worker.log")
    worker.proc = subprocess.Popen([sys.executable, "-c", "print('[INFO] Running in WANDB offline mode'); "
                                    "print('{\"ok\": true, \"stats\": {}}')"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
    try:
        assert worker.reply() == {"ok": True, "stats": {}}
    finally:
        worker.close()
    assert "WANDB offline" in (tmp_path / "worker.log").read_text()
