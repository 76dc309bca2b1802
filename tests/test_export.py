"""`obsspec export` on a real micro training run: folders that load as they are and generate what
the policy generated in training, the model card, picking a checkpoint (--step, --best, a killed
run), bad input, and a run that starts from an export. With wandb installed the same run also
logs to W&B offline, and the run folder holds what it logged.

Run: .venv/bin/python -m pytest -q tests/test_export.py
"""

import json
import os
import shutil

import pytest

from policy_turns import read_trajectories, regenerate
from test_cli import cli
from test_training_cli import common

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200),
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")]

HAS_WANDB = __import__("obsspec.training.trackers", fromlist=["installed"]).installed("wandb")
TEMPERATURE = 0.3  # test_training_cli.common's sampling: policy.temperature, max_new_tokens, max_context


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two steps of full fine-tuning with a reward that gives every group signal (so the weights
    move), val measured before, at checkpoint 1 and after; W&B offline when installed."""
    from obsspec.config import load_recipe
    from obsspec.training import grpo, rollouts as R

    root = tmp_path_factory.mktemp("export")
    r = cli("prepare-tasks", "recipes/tiny-cpu.yaml", "tasks.num_instances=12", "tasks.families=[dir-stats]",
            "tasks.val_fraction=0.25", "tasks.determinism_check=false", "--out", str(root / "tasks"),
            "--display", "none")
    assert r.returncode == 0, r.stderr[-2000:]

    original = R.Rollouts.reward

    def alternating(self, prompts=None, completions=None, verifier_reward=None, log_metric=None, **kw):
        original(self, verifier_reward=verifier_reward, log_metric=log_metric)  # (logs the step's metrics)
        return [float(i % 2) for i in range(len(verifier_reward))]  # every group has signal

    trackers = "[tensorboard,wandb]" if HAS_WANDB else "tensorboard"
    base = common(root)
    recipe = load_recipe(base[0], [*base[1:], "train.steps=2", "train.eval_checkpoints=true",
                                   f"train.report_to={trackers}"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R.Rollouts, "reward", alternating)
        mp.setenv("WANDB_MODE", "offline")
        mp.delenv("WANDB_DIR", raising=False)
        grpo.run_training(recipe, str(root / "run"))
    return root


def hf_regenerate(model_dir, trajectories):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from obsspec.engines.hf import HFEngine
    from obsspec.tokens import ChatFormat

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return regenerate(HFEngine(model, tokenizer, batch_invariant=True), ChatFormat(tokenizer), trajectories,
                      temperature=TEMPERATURE, max_new=48, max_context=1024)


@pytest.fixture(scope="module")
def exported(trained):
    r = cli("export", str(trained / "run"), "--out", str(trained / "out"), "--adapters")
    assert r.returncode == 0, r.stderr[-3000:]
    return trained / "out", r


def test_the_exported_policy_generates_what_the_policy_generated_at_that_step(trained, exported):
    """Through transformers (from_pretrained of the folder, obsspec's sampler): every policy turn
    of the val episodes after training — the last checkpoint's weights — comes out token for
    token, same prompt, seed and temperature; the base's weights do not give them all."""
    out, r = exported
    assert "exporting checkpoint-2 (step 2 of 2; the newest complete checkpoint)" in r.stderr
    val_after = read_trajectories(trained / "run" / "eval" / "val-after")
    same, total = hf_regenerate(out / "policy", val_after)
    assert total > 0 and same == total, f"{same}/{total} turns regenerated exactly"
    models = json.loads((trained / "run" / "models.json").read_text())
    same, total = hf_regenerate(models["policy"], val_after)
    assert same < total, "the base generates the trained policy's turns too: this test could not fail"
    # an earlier step: checkpoint-1's weights made step 2's rollouts
    r = cli("export", str(trained / "run"), "--step", "1", "--out", str(trained / "out-1"))
    assert r.returncode == 0 and "exporting checkpoint-1 (step 1 of 2; --step 1)" in r.stderr, r.stderr
    step2 = read_trajectories(trained / "run" / "rollouts" / "step-000002")
    same, total = hf_regenerate(trained / "out-1" / "policy", step2)
    assert same == total, f"{same}/{total} turns of step 2's rollouts regenerated exactly"


def test_the_folders_load_as_they_are_in_the_bases_dtype_with_tokenizer_and_template(trained, exported):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = exported
    models = json.loads((trained / "run" / "models.json").read_text())
    for name in ("policy", "world_model"):
        names = set(os.listdir(out / name))
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja", "generation_config.json", "README.md"} <= names, names
        assert not any(n.startswith("adapter_") for n in names), "a merged folder needs no PEFT"
        base = AutoModelForCausalLM.from_pretrained(models[name])
        assert AutoModelForCausalLM.from_pretrained(str(out / name)).dtype == base.dtype
    assert AutoTokenizer.from_pretrained(str(out / "policy")).chat_template
    # the world model: the adapter version checkpoint-2 recorded, merged: its logits are the
    # base-plus-adapter's (the drafts it served), and differ from the base's
    state = json.loads((trained / "run" / "checkpoints" / "checkpoint-2" / "obsspec_state.json").read_text())
    version = trained / "run" / "world_model" / "adapters" / f"v{state['wm_version']:06d}"
    ids = torch.tensor([read_trajectories(trained / "run" / "rollouts" / "step-000002")[0]["ids"][:200]])
    merged = AutoModelForCausalLM.from_pretrained(str(out / "world_model"))
    with torch.no_grad():
        want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(models["world_model"]),
                                         str(version))(ids).logits
        got, plain = merged(ids).logits, AutoModelForCausalLM.from_pretrained(models["world_model"])(ids).logits
    assert (got - want).abs().max() < 1e-4 and (plain - want).abs().max() > 1e-3
    # --adapters: the world model's LoRA alone (the policy was fully fine-tuned: none)
    assert sorted(os.listdir(out / "world_model-lora")) == ["adapter_config.json", "adapter_model.safetensors"]
    assert not (out / "policy-lora").exists()


def test_the_card_and_record_say_what_was_exported(trained, exported):
    out, _ = exported
    record = json.loads((out / "obsspec.json").read_text())
    assert record["command"].startswith("obsspec export ") and record["commit"]
    assert record["step"] == 2 and record["checkpoint"] == "checkpoints/checkpoint-2" and record["run_finished"]
    evals = json.loads((trained / "run" / "eval.json").read_text())
    assert record["val"]["at_step"] == evals["after"] and record["val"]["before"] == evals["before"]
    metrics = [json.loads(x) for x in (trained / "run" / "metrics.jsonl").read_text().splitlines()]
    assert record["speculation"]["hits"]["sibling"] == sum(m["spec/hits_sibling"] for m in metrics)
    state = json.loads((trained / "run" / "checkpoints" / "checkpoint-2" / "obsspec_state.json").read_text())
    assert record["world_model"]["adapter_version"] == state["wm_version"] is not None
    assert record["policy"]["dtype"] == "float32" and record["policy"]["trained"] == "all weights"
    card = (out / "README.md").read_text()
    for text in ("step 2 of 2", "## Val success", "## Speculation, measured in training", "vllm serve",
                 "`train.learning_rate` | `0.01`", "hit rate", "speculative overlap with tools", record["commit"]):
        assert text in card, text
    assert (out / "policy" / "README.md").read_text() == card


def test_checkpoint_val_is_measured_and_best_picks_by_it(trained, tmp_path):
    run = trained / "run"
    val = json.loads((run / "checkpoints" / "checkpoint-1" / "val.json").read_text())
    episodes = read_trajectories(run / "eval" / "val-step-000001")
    assert val["step"] == 1 and val["success_frac"] == sum(t["reward"] == 1.0 for t in episodes) / len(episodes)
    assert not (run / "checkpoints" / "checkpoint-2" / "val.json").exists(), "the val after training measures it"
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    after = json.loads((copy / "eval.json").read_text())["after"]["success_frac"]
    val["success_frac"] = after + 0.5
    (copy / "checkpoints" / "checkpoint-1" / "val.json").write_text(json.dumps(val))
    r = cli("export", str(copy), "--best", "--out", str(tmp_path / "best"))
    assert r.returncode == 0 and "exporting checkpoint-1 (step 1 of 2; --best: val success" in r.stderr, r.stderr
    val["success_frac"] = after - 0.5 if after >= 0.5 else after
    (copy / "checkpoints" / "checkpoint-1" / "val.json").write_text(json.dumps(val))
    r = cli("export", str(copy), "--best", "--out", str(tmp_path / "best-2"))
    assert r.returncode == 0 and "exporting checkpoint-2" in r.stderr, r.stderr


def test_a_killed_run_exports_its_newest_complete_checkpoint_and_says_which(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained / "run", copy)
    (copy / "summary.json").unlink()
    (copy / "checkpoints" / "checkpoint-2" / "obsspec_state.json").unlink()  # its save was cut short
    r = cli("export", str(copy), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (f"{copy} did not finish (no summary.json): exporting its newest complete checkpoint, "
            "checkpoint-1 (step 1 of 2); skipping checkpoint-2: its save was interrupted") in r.stderr
    assert json.loads((tmp_path / "out" / "obsspec.json").read_text())["step"] == 1


@pytest.mark.parametrize("args, message", [
    (["{tmp}"], "not a training run"),
    (["{tmp}/nowhere"], "no such folder"),
    (["{run}", "--step", "7"], "no complete checkpoint of step 7 (there is none; complete: 1, 2)"),
    (["{run}", "--step", "1", "--best"], "--step and --best"),
    (["{run}", "--out", "{run}"], "already exists and is not empty"),
])
def test_bad_input_is_one_line(trained, tmp_path, args, message):
    args = [a.format(tmp=tmp_path, run=trained / "run") for a in args]
    r = cli("export", *args, *(["--out", str(tmp_path / "o")] if "--out" not in args else []))
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_run_starts_from_the_export_and_its_rollouts_are_the_trained_policys(trained, exported):
    """policy.model / world_model.model = the exported folders: the new run's val episodes before
    training are, token for token, the first run's val episodes after training."""
    out, _ = exported
    r = cli("train", *common(trained), f"policy.model={out / 'policy'}", f"world_model.model={out / 'world_model'}",
            "train.steps=1", "train.cotrain_every=0", "--out", str(trained / "next"), "--display", "none")
    assert r.returncode == 0, r.stderr[-3000:]
    before = read_trajectories(trained / "next" / "eval" / "val-before")
    after = read_trajectories(trained / "run" / "eval" / "val-after")
    assert [t["ids"] for t in before] == [t["ids"] for t in after]
    base = read_trajectories(trained / "run" / "eval" / "val-before")
    assert [t["ids"] for t in base] != [t["ids"] for t in after], "training changed no val episode"


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install 'obsspec[wandb]')")
def test_wandb_offline_gets_trls_and_obsspecs_metrics_in_the_run_folder(trained):
    from wandb_log import logged

    steps = logged(trained / "run" / "wandb")
    keys = set().union(*steps)
    for key in ("train/loss", "train/reward", "train/spec/exact_frac", "train/spec/hits_wm", "train/spec/hits_cache",
                "train/spec/hits_sibling", "train/latency_saved_sec", "train/spec/skipped_frac",
                "train/spec/skipped_busy", "train/committed_delay_frac", "train/wm/version", "train/rollout_sec",
                "eval/success_frac"):
        assert key in keys, f"{key} not logged to W&B (logged: {sorted(keys)})"
    val = [s for s in steps if "eval/success_frac" in s]
    assert [s["train/global_step"] for s in val] == [0, 1, 2], "val before, at checkpoint 1, after"
    evals = json.loads((trained / "run" / "eval.json").read_text())
    assert val[-1]["eval/success_frac"] == evals["after"]["success_frac"]


def test_tensorboard_gets_obsspecs_metrics_and_the_val_figures_too(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trained / "run" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for key in ("train/loss", "train/spec/exact_frac", "train/spec/hits_sibling", "train/latency_saved_sec",
                "train/wm/version", "train/rollout_sec", "eval/success_frac"):
        assert key in tags, f"{key} not in TensorBoard's log (has: {sorted(tags)})"
    assert [e.step for e in events.Scalars("eval/success_frac")] == [0, 1, 2]
