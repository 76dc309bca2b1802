"""What a training run keeps on disk: adapter versions pruned to the newest k (never the one
serving, `latest`, or one a kept checkpoint records), the co-training job's files removed, each
step's rollout folders rotated.

Run: .venv/bin/python -m pytest -q tests/test_retention.py
"""

import json
import os
from types import SimpleNamespace

import pytest

from obsspec.config import load_recipe
from obsspec.training import checkpoints
from obsspec.training.retention import RolloutRotation, recorded_versions
from obsspec.worldmodel.adapters import AdapterStore


def adapter_folder(path, tag="x") -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"r": 8, "tag": tag}, f)
    with open(os.path.join(path, "adapter_model.safetensors"), "wb") as f:
        f.write(b"\0" * 64)
    return str(path)


def numbers(store) -> list[int]:
    return [v.version for v in store.versions()]


def test_pruning_keeps_the_newest_the_latest_and_the_protected(tmp_path):
    store = AdapterStore(str(tmp_path / "adapters"))
    for i in range(6):
        store.publish(adapter_folder(tmp_path / f"t{i}"))
    assert store.prune(0) == [] and numbers(store) == [1, 2, 3, 4, 5, 6], "0 keeps all"
    assert store.prune(2, protect={2}) == [1, 3, 4]
    assert numbers(store) == [2, 5, 6] and store.latest().version == 6
    assert store.publish(adapter_folder(tmp_path / "t7")).version == 7, "numbers still only grow"
    # `latest` is kept even when it is not among the newest (a pointer a reader follows)
    (tmp_path / "adapters" / "latest").write_text("v000002\n")
    assert store.prune(1) == [5, 6] and numbers(store) == [2, 7]
    # a deletion a crash cut short is out of the listing, and the next publish clears it
    os.rename(store.get(2).path, str(tmp_path / "adapters" / ".removing-v000002"))
    assert numbers(store) == [7]
    store.publish(adapter_folder(tmp_path / "t8"))
    assert sorted(os.listdir(tmp_path / "adapters")) == ["latest", "v000007", "v000008"]


def _checkpoint(root, step: int, wm_version: int | None) -> None:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / checkpoints.TRAINER_STATE).write_text("{}")
    checkpoints.write_state(str(path), {"wm_version": wm_version, "history": None})


class _Engine:
    def __init__(self):
        self.loaded = []

    async def load_adapter(self, name, path):
        assert os.path.isdir(path)
        self.loaded.append(name)

    async def unload_adapter(self, name):
        self.loaded.remove(name)


class _Worker:
    """Stands in for the co-training process: each job's adapter appears where it asked."""

    def __init__(self):
        self.job = None

    def submit(self, job):
        self.job = job
        adapter_folder(job["out"])

    def reply(self):
        return {"ok": True, "stats": {"train_loss": 0.5}}


def test_world_model_versions_are_pruned_except_the_serving_and_the_checkpointed(tmp_path):
    from obsspec.training.cotrain import CoTrainer

    recipe = load_recipe("recipes/tiny-cpu.yaml", ["train.keep_adapter_versions=2"])
    engine, predictor = _Engine(), SimpleNamespace(adapter=None)
    co = CoTrainer(recipe.wm_train, recipe.train, "unused", engine, predictor, str(tmp_path), None)
    co._worker = _Worker()
    for step in range(1, 7):
        rows = os.path.join(co.work, f"step-{step:06d}.rows.jsonl")
        os.makedirs(co.work, exist_ok=True)
        open(rows, "w").close()
        co.start(step, rows)
        co.finish()
        if step == 2:  # a complete checkpoint records the version serving after step 2
            _checkpoint(tmp_path / "checkpoints", 2, co.version)
    assert co.version == 6 and engine.loaded == ["wm-v6"], "the engine serves one version"
    assert numbers(co.store) == [2, 5, 6], "the newest 2, and the one a checkpoint records"
    assert recorded_versions(str(tmp_path / "checkpoints")) == {2}
    assert os.listdir(co.work) == [], "each job's rows and adapter are removed once published"
    co.restore(2)  # --resume from that checkpoint serves it again
    assert engine.loaded == ["wm-v2"]


def test_policy_versions_are_pruned_to_the_newest_k(tmp_path):
    from obsspec.training.policy_sync import PolicySync

    class Model:
        peft_config = {}

        def save_pretrained(self, path):
            adapter_folder(path)

    state = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    engine = _Engine()
    rollouts = SimpleNamespace(policy_adapter=None)
    sync = PolicySync(engine, str(tmp_path), state, rollouts, keep=2)
    for step in range(5):
        trainer = SimpleNamespace(state=SimpleNamespace(global_step=step), model=Model(),
                                  accelerator=SimpleNamespace(unwrap_model=lambda m: m))
        sync(trainer)
    assert numbers(sync.store) == [4, 5] and engine.loaded == ["policy-v5"] and rollouts.policy_adapter == "policy-v5"
    assert os.listdir(sync.work) == []


def test_rollout_folders_rotate_per_process(tmp_path):
    from obsspec.worldmodel.data import source_files

    root = tmp_path / "rollouts"
    for step in range(1, 6):
        for name in (f"step-{step:06d}", f"step-{step:06d}.rank1"):
            (root / name).mkdir(parents=True)
            (root / name / "trajectories-speculative.jsonl").write_text("")
    (root / "discarded" / "step-000003.123").mkdir(parents=True)
    assert RolloutRotation(str(tmp_path), 0, 0)() == [], "0 keeps all"
    assert RolloutRotation(str(tmp_path), 0, 2)() == ["step-000001", "step-000002", "step-000003"]
    assert RolloutRotation(str(tmp_path), 1, 3)() == ["step-000001.rank1", "step-000002.rank1"]
    assert sorted(os.listdir(root)) == ["discarded", "step-000003.rank1", "step-000004", "step-000004.rank1",
                                        "step-000005", "step-000005.rank1"]
    # what `obsspec train-worldmodel --data RUN` then reads: the kept steps of every process
    found = [os.path.basename(os.path.dirname(f)) for f in source_files(str(tmp_path))]
    assert sorted(found) == ["step-000003.rank1", "step-000004", "step-000004.rank1", "step-000005",
                             "step-000005.rank1"]


def test_the_keys_say_what_to_change():
    for bad in ("train.keep_adapter_versions=-1", "train.keep_rollouts=-2", "train.collective_timeout_s=0"):
        with pytest.raises(Exception, match=bad.split("=")[0].split(".")[1]):
            load_recipe("recipes/tiny-cpu.yaml", [bad])
    with pytest.raises(Exception, match="train.collective_timeout_s"):
        load_recipe("recipes/tiny-cpu-vllm.yaml", ["servers.launch=true", "train.collective_timeout_s=60"])
