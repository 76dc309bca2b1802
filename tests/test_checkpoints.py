"""Checkpoints are complete or skipped: which one a resume takes, what rotation keeps, and where
TensorBoard logs. No model, no training: folders made by hand (the kill test of a real run is in
tests/test_training_cli.py).

Run: .venv/bin/python -m pytest -q tests/test_checkpoints.py
"""

import os

import pytest

from obsspec.training import checkpoints as C


def make(root, step: int, trainer: bool = True, state: str | None = "{}") -> str:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_text("weights")
    if trainer:
        (path / C.TRAINER_STATE).write_text("{}")
    if state is not None:
        (path / C.STATE_FILE).write_text(state)
    return str(path)


def names(paths) -> list[str]:
    return [os.path.basename(p) for p in paths]


def test_resume_takes_the_newest_complete_checkpoint_and_names_the_interrupted_ones(tmp_path):
    make(tmp_path, 2)
    make(tmp_path, 4)
    make(tmp_path, 6, state=None)              # killed before obsspec's state
    make(tmp_path, 8, trainer=False, state=None)  # killed inside the trainer's save
    make(tmp_path, 10, state='{"wm_ver')       # a truncated state (written in place by older versions)
    found = C.find_checkpoints(str(tmp_path))
    assert names(found.complete) == ["checkpoint-2", "checkpoint-4"]
    assert found.resume_from == str(tmp_path / "checkpoint-4")
    assert names(found.incomplete) == ["checkpoint-6", "checkpoint-8", "checkpoint-10"]
    line = found.describe(str(tmp_path))
    assert "\n" not in line and "checkpoint-4 (step 4)" in line
    assert "skipping checkpoint-6, checkpoint-8, checkpoint-10" in line


def test_with_no_complete_checkpoint_the_resume_starts_from_step_0(tmp_path):
    make(tmp_path, 2, state=None)
    found = C.find_checkpoints(str(tmp_path))
    assert found.resume_from is None and names(found.incomplete) == ["checkpoint-2"]
    assert found.describe("RUN/checkpoints").startswith("resuming from step 0: RUN/checkpoints holds no complete")
    assert C.find_checkpoints(str(tmp_path / "none")).resume_from is None  # no folder yet


def test_write_state_marks_complete_only_at_the_end(tmp_path, monkeypatch):
    path = make(tmp_path, 3, state=None)
    seen = []
    monkeypatch.setattr(C, "reached", lambda point, d: seen.append((point, C.is_complete(d))))
    C.write_state(path, {"wm_version": 2})
    assert seen == [("trainer-saved", False), ("state-written", False), ("complete", True)]
    assert [p for p, _ in seen] == list(C.POINTS)
    assert C.read_state(path) == {"wm_version": 2} and not os.path.exists(os.path.join(path, C.STATE_FILE + ".tmp"))


@pytest.mark.parametrize("keep", [1, 2])
def test_rotation_never_gives_the_newest_complete_checkpoint_up_for_an_interrupted_one(tmp_path, keep):
    make(tmp_path, 1)
    make(tmp_path, 2)
    make(tmp_path, 3, state=None)  # the save in progress (or killed)
    C.rotate(str(tmp_path), keep)
    assert names(C.find_checkpoints(str(tmp_path)).complete) == ["checkpoint-1", "checkpoint-2"][-keep:]
    assert (tmp_path / "checkpoint-3").exists()
    C.write_state(str(tmp_path / "checkpoint-3"), {})  # now complete: the older ones go
    C.rotate(str(tmp_path), keep)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-3"][-keep:]


def test_rotation_removes_interrupted_saves_older_than_a_complete_one_and_half_removed_ones(tmp_path):
    make(tmp_path, 1, state=None)
    make(tmp_path, 2)
    (tmp_path / ".removing-checkpoint-0").mkdir()  # a removal that was killed half-way
    C.rotate(str(tmp_path), 5)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2"]


def test_rotation_keeps_the_checkpoint_of_best_measured_val_success(tmp_path):
    for step, val in ((2, None), (4, 0.75), (6, 0.25), (8, 0.75), (10, 0.5), (12, None)):
        path = make(tmp_path, step)
        if val is not None:
            (tmp_path / f"checkpoint-{step}" / C.VAL_FILE).write_text(f'{{"success_frac": {val}}}')
    (tmp_path / "checkpoint-10" / C.VAL_FILE).write_text("{broken")  # unreadable: not measured
    C.rotate(str(tmp_path), keep=2)
    # the newest two, and the best (the newest of the two at 0.75: it trained longer)
    assert names(C.find_checkpoints(str(tmp_path)).complete) == ["checkpoint-8", "checkpoint-10", "checkpoint-12"]
    assert C.best({str(tmp_path / "checkpoint-4"): 0.75, str(tmp_path / "checkpoint-8"): 0.75}) == path.replace(
        "checkpoint-12", "checkpoint-8")
    assert C.best({}) is None


def test_each_trainer_logs_to_its_own_tensorboard_folder(tmp_path, monkeypatch):
    """Two runs in one process: each trainer's TensorBoard callback gets its run's folder (it
    used to come from an environment variable that the first run set for the whole process)."""
    pytest.importorskip("tensorboard")
    from types import SimpleNamespace

    from transformers.integrations import TensorBoardCallback

    from obsspec.training.grpo import log_tensorboard_to

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    trainers = [SimpleNamespace(callback_handler=SimpleNamespace(callbacks=[TensorBoardCallback()]))
                for _ in range(2)]
    for i, trainer in enumerate(trainers):
        log_tensorboard_to(trainer, str(tmp_path / f"run{i}" / "tensorboard"))
    assert [t.callback_handler.callbacks[0].logging_dir for t in trainers] == \
        [str(tmp_path / "run0" / "tensorboard"), str(tmp_path / "run1" / "tensorboard")]
    assert "TENSORBOARD_LOGGING_DIR" not in os.environ
