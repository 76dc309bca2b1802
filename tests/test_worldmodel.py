"""Tests of world-model fine-tuning (obsspec/worldmodel): data, LoRA training, adapter versions,
the hf engine's adapter swap, and the `train-worldmodel` command.

Models are tiny Qwen3s built from config (hidden 32) with a tokenizer trained on a handful of
trajectories written here, so the file runs in well under a minute on a CPU without downloads.

Run: .venv/bin/python -m pytest -q tests/test_worldmodel.py
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os

import pytest
import torch
from typer.testing import CliRunner

from test_kit import ROWS, TINY_MODEL, fmt, tokenizer, write_suite  # noqa: F401 - fixtures
from obsspec import chat
from obsspec.cli import app
from obsspec.config import ConfigError, load_recipe
from obsspec.engines import GenerationRequest, HFEngine
from obsspec.engines.lora import AdapterLoadError
from obsspec.models import tiny
from obsspec.rollout.trajectory import Trajectory
from obsspec.worldmodel import data
from obsspec.worldmodel.adapters import AdapterError, AdapterStore, resolve_adapter
from obsspec.worldmodel.config import WorldModelTrainConfig
from obsspec.worldmodel.train import train_adapter

CFG = WorldModelTrainConfig(rank=4, alpha=8, max_steps=3, batch_size=2, learning_rate=5e-2,
                            max_length=1024, eval_fraction=0.3)


def base_model(tokenizer, seed=0, hidden=32):
    cfg = dataclasses.replace(TINY_MODEL, hidden_size=hidden)
    return tiny.build_model(cfg, tokenizer, 1024, seed).eval()


@pytest.fixture(scope="module")
def trained(tokenizer, fmt, tmp_path_factory):
    """(base model, v1 folder, v2 folder): two adapter versions trained on the suite's rows."""
    root = tmp_path_factory.mktemp("adapters")
    model = base_model(tokenizer)
    rows, _ = data.examples(fmt, [data.Episode(r["task_id"], "x", reference=r) for r in ROWS], 1024)
    v1 = train_adapter(model, tokenizer, rows, CFG, str(root / "v1"))
    v2 = train_adapter(model, tokenizer, rows, dataclasses.replace(CFG, seed=1, max_steps=6),
                       str(root / "v2"))
    return model, str(root / "v1"), str(root / "v2"), v1, v2


def greedy(model, prompt, n=12):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


# --------------------------------------------------------------------------------- recipe


def test_wm_train_section_validates_and_rejects_bad_values():
    rec = load_recipe("recipes/tiny-cpu.yaml", ["wm_train.rank=4", "wm_train.target_modules=[q_proj, v_proj]"])
    assert rec.wm_train.rank == 4 and rec.wm_train.target_modules == ("q_proj", "v_proj")
    with pytest.raises(ConfigError, match="unknown key 'wm_train.rnak'"):
        load_recipe(None, ["wm_train.rnak=4"])
    with pytest.raises(ConfigError, match="eval_fraction must be in"):
        load_recipe(None, ["wm_train.eval_fraction=1.5"])
    with pytest.raises(ConfigError, match="target_modules is empty"):
        load_recipe(None, ["wm_train.target_modules=[]"])


# ----------------------------------------------------------------------------------- data


def rollout(fmt, task_id: str, commands: list[tuple[str, str]], malformed: bool = False) -> Trajectory:
    tr = Trajectory.start(0, task_id, fmt.prompt_ids("do it"))
    for command, body in commands:
        action = fmt.action_ids(chat.render_bash(command))
        tr.append_action(action, [0.0] * len(action))
        ids, span = fmt.observation_ids(body)
        tr.append_observation(ids, span, len(fmt.obs_close_ids))
        tr.turns.append(_turn(command, body))
    if malformed:
        action = fmt.action_ids("<tool_call>oops")
        tr.append_action(action, [0.0] * len(action))
        ids, span = fmt.error_observation_ids("malformed call")
        tr.append_observation(ids, span, len(fmt.obs_close_ids), target=False)
    return tr


def _turn(command, body):
    from obsspec.rollout.trajectory import Turn

    return Turn(action=chat.render_bash(command), kind="bash", command=command, observation=body, tool_sec=0.5)


def test_split_is_by_task_instance_and_stable(fmt):
    eps = [data.Episode(f"t{i}", "a") for i in range(40)] + [data.Episode(f"t{i}", "b") for i in range(40)]
    train, held = data.split_by_task(eps, 0.25, seed=0)
    assert held and train
    assert not {e.task_id for e in train} & {e.task_id for e in held}, "a task on both sides of the split"
    assert {e.source for e in held if e.task_id == held[0].task_id} == {"a", "b"}
    # stable: a task's side does not depend on what else is in the data
    _, held_sub = data.split_by_task(eps[:20], 0.25, seed=0)
    assert {e.task_id for e in held_sub} <= {e.task_id for e in held}


def test_examples_target_observations_only_and_duplicates_are_counted(fmt):
    tr = rollout(fmt, "t1", [("ls", "a.txt\n\n(exit_code=0)")], malformed=True)
    eps = [data.Episode("t1", "x", trajectory=tr), data.Episode("t1", "y", trajectory=tr)]
    rows, counts = data.examples(fmt, eps, 4096)
    assert counts["duplicates"] == 1 and counts["examples"] == 1
    (row,) = rows
    target = [t for t, m in zip(row["input_ids"], row["completion_mask"]) if m]
    assert target == fmt.wm_target_ids("a.txt\n\n(exit_code=0)"), "target is not body + closing tag"
    error_body = fmt.encode(chat.error_observation("malformed call"))
    assert fmt.decode(target).count(fmt.decode(error_body)) == 0, "an error observation became a target"


def test_example_context_is_the_rollouts_world_model_prompt(fmt):
    """One prompt construction: every target begins right after `wm_prompt_ids(history, action)`
    and the evaluation case of that step has exactly that prompt."""
    row = ROWS[0]
    (ex,), _ = data.examples(fmt, [data.Episode(row["task_id"], "s", reference=row)], 1024)
    cases, _ = data.eval_cases(fmt, [data.Episode(row["task_id"], "s", reference=row)])
    starts = [i for i, m in enumerate(ex["completion_mask"]) if m and not ex["completion_mask"][i - 1]]
    assert [tuple(ex["input_ids"][:s]) for s in starts] == [c.prompt_ids for c in cases]
    history = fmt.prompt_ids(row["instruction"])
    action = fmt.action_ids(chat.render_bash(row["steps"][0]["command"]))
    assert cases[0].prompt_ids == tuple(fmt.wm_prompt_ids(history, action))


def test_sources_are_recognised_and_bad_ones_are_one_line(tmp_path, fmt):
    suite = write_suite(tmp_path / "suite")
    run = tmp_path / "run"
    run.mkdir()
    tr = rollout(fmt, "t9", [("ls", "x\n\n(exit_code=0)")])
    (run / "trajectories-sequential.jsonl").write_text(json.dumps(tr.to_dict()) + "\n")
    eps = data.load_episodes([suite, str(run)])
    assert sum(e.reference is not None for e in eps) == len(ROWS) and eps[-1].trajectory.task_id == "t9"
    with pytest.raises(data.DataError, match="no such data source"):
        data.load_episodes([str(tmp_path / "nope")])
    (tmp_path / "bad.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(data.DataError, match="bad.jsonl:1"):
        data.load_episodes([str(tmp_path / "bad.jsonl")])


# ------------------------------------------------------------------------------- training


def test_train_adapter_learns_saves_and_leaves_the_base_as_it_was(tokenizer, fmt, tmp_path):
    from peft import PeftModel

    model = base_model(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {k: p.requires_grad for k, p in model.named_parameters()}
    attrs = set(vars(model))
    rows, _ = data.examples(fmt, [data.Episode(r["task_id"], "x", reference=r) for r in ROWS], 1024)
    stats = train_adapter(model, tokenizer, rows, dataclasses.replace(CFG, max_steps=8), str(tmp_path / "a"),
                          eval_rows=rows[:2])
    assert stats["steps"] == 8 and stats["examples"] == len(rows) and stats["adapter_bytes"] > 0
    assert type(model).__name__ == "Qwen3ForCausalLM" and not hasattr(model, "peft_config")
    assert model.state_dict().keys() == before.keys()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "the base was modified"
    assert {k: p.requires_grad for k, p in model.named_parameters()} == flags
    assert set(vars(model)) == attrs, "training left attributes (e.g. a bound forward) on the base"
    peft = PeftModel.from_pretrained(copy.deepcopy(model), str(tmp_path / "a"))
    lora_b = [p for n, p in peft.named_parameters() if "lora_B" in n]
    assert lora_b and all(p.abs().sum() > 0 for p in lora_b), "training left lora_B at zero"
    # continuing a version starts from its weights, and moves them
    more = train_adapter(model, tokenizer, rows, dataclasses.replace(CFG, max_steps=2), str(tmp_path / "b"),
                         init_adapter=str(tmp_path / "a"))
    assert more["init_adapter"] == str(tmp_path / "a")
    cont = PeftModel.from_pretrained(copy.deepcopy(model), str(tmp_path / "b"))
    diffs = [(a - b).abs().max().item() for (_, a), (_, b) in
             zip(sorted((n, p) for n, p in peft.named_parameters() if "lora_" in n),
                 sorted((n, p) for n, p in cont.named_parameters() if "lora_" in n))]
    assert 0 < max(diffs) < 1.0


def test_unknown_target_module_is_refused_before_training(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="no module named attn_qkv"):
        train_adapter(base_model(tokenizer), tokenizer, [{"input_ids": [1, 2], "completion_mask": [0, 1]}],
                      dataclasses.replace(CFG, target_modules=("attn_qkv",)), str(tmp_path / "a"))


# -------------------------------------------------------------------------- adapter store


def test_publish_makes_numbered_versions_and_moves_latest(trained, tmp_path):
    _, v1, v2, _, _ = trained
    store = AdapterStore(str(tmp_path / "adapters"))
    assert store.latest() is None
    a = store.publish(v1, meta={"loss": 1.0})
    b = store.publish(v2)
    assert (a.version, a.name, b.version, b.name) == (1, "wm-v1", 2, "wm-v2")
    assert store.latest() == b and store.get(1) == a and a.meta()["loss"] == 1.0
    assert {"adapter_config.json", "adapter_model.safetensors", "version.json"} <= set(os.listdir(b.path))
    with pytest.raises(AdapterError, match="no adapter version 7"):
        store.get(7)
    # what world_model.adapter= accepts
    run_dir = str(tmp_path)
    assert resolve_adapter(run_dir) == b and resolve_adapter(f"{run_dir}@1") == a
    assert resolve_adapter(store.root) == b and resolve_adapter(a.path).path == a.path
    assert resolve_adapter("") is None
    with pytest.raises(AdapterError):
        resolve_adapter(str(tmp_path / "missing"))


def test_a_crash_while_publishing_leaves_no_version_behind(trained, tmp_path, monkeypatch):
    import shutil

    _, v1, v2, _, _ = trained
    store = AdapterStore(str(tmp_path / "adapters"))
    store.publish(v1)
    real_copy = shutil.copy2
    calls = []

    def crash(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_copy(src, dst)

    monkeypatch.setattr(shutil, "copy2", crash)
    with pytest.raises(OSError):
        store.publish(v2)
    monkeypatch.undo()
    assert [v.version for v in store.versions()] == [1] and store.latest().version == 1
    assert not [n for n in os.listdir(store.root) if n.startswith(".")], "half a version left behind"
    with pytest.raises(AdapterError, match="not a PEFT adapter folder"):
        store.publish(str(tmp_path))
    assert store.publish(v2).version == 2


# ---------------------------------------------------------------------- hf engine adapter swap


def test_engine_swaps_versions_in_place_refuses_bad_ones_and_keeps_serving(trained, tokenizer, tmp_path):
    model, v1, v2, _, _ = trained
    from peft import PeftModel

    prompt = list(range(5, 17))
    ref1 = greedy(PeftModel.from_pretrained(copy.deepcopy(model), v1).eval(), prompt)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(open(os.path.join(v1, "adapter_config.json")).read())
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    other = tmp_path / "other"  # an adapter made for a model of another width
    train_adapter(base_model(tokenizer, hidden=48), tokenizer, [{"input_ids": [1, 2, 3], "completion_mask": [0, 1, 1]}],
                  dataclasses.replace(CFG, max_steps=1, batch_size=1), str(other))

    def req(n=12):
        return GenerationRequest(prompt, max_new_tokens=n, temperature=0, adapter="wm")

    async def main():
        async with HFEngine(copy.deepcopy(model), tokenizer) as engine:
            await engine.load_adapter("wm", v1)
            first = await engine.generate(req())
            long_run = asyncio.create_task(engine.generate(req(200)))  # in progress during the swap
            while not engine.decode_steps(long_run_id(engine) or ""):
                await asyncio.sleep(0.001)
            await engine.load_adapter("wm", v2)  # waits for the running version's requests
            during = await long_run
            second = await engine.generate(req())
            await engine.load_adapter("wm", v1)  # an idle swap (its time: bench/worldmodel_adapter.py)
            await engine.load_adapter("wm", v2)
            errors = []
            for bad in (broken, other, tmp_path / "nothing"):
                with pytest.raises(AdapterLoadError) as e:
                    await engine.load_adapter("wm", bad)
                errors.append(str(e.value))
            after_bad = await engine.generate(req())
            return first, during, second, after_bad, errors

    first, during, second, after_bad, errors = asyncio.run(main())
    assert list(first.token_ids) == ref1
    assert second.logprobs != first.logprobs, "outputs did not change after the swap to a new version"
    assert list(during.token_ids[:12]) == list(first.token_ids) and \
        during.logprobs[:12] == pytest.approx(first.logprobs, abs=1e-5), \
        "a generation in progress did not finish on the version it started with"
    assert after_bad.logprobs == pytest.approx(second.logprobs, abs=1e-6) and \
        list(after_bad.token_ids) == list(second.token_ids), "a refused adapter disturbed the version served"
    assert "cannot be read" in errors[0] and "does not fit this model" in errors[1] and "cannot be read" in errors[2]


def long_run_id(engine):
    with engine._cond:  # the one request in flight  # noqa: SLF001 - test introspection
        return next(iter(engine._by_id), None)


# ------------------------------------------------------------------------------ the command


@pytest.fixture(scope="module")
def wm_folder(tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("wm") / "world_model"
    tiny.save(base_model(tokenizer), tokenizer, path)
    return str(path)


def cli(*args):
    return CliRunner().invoke(app, ["train-worldmodel", *args])


def test_train_worldmodel_trains_publishes_and_evaluates(wm_folder, tmp_path):
    suite = write_suite(tmp_path / "suite")
    common = [f"world_model.model={wm_folder}", "wm_train.max_steps=2", "wm_train.batch_size=2",
              "wm_train.rank=2", "wm_train.eval_max_tokens=24", "wm_train.max_length=1024",
              "wm_train.eval_fraction=0.3", "--display", "none"]
    out = tmp_path / "wm"
    os.makedirs(out / ".training")  # a crashed run's leftovers: started over, never published
    result = cli(*common, "--data", suite, "--out", str(out))
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["adapter"]["version"] == 1 and summary["train"]["steps"] == 2
    assert set(summary["eval"]["models"]) == {"base", "wm-v1"} and summary["eval"]["steps"] > 0
    assert summary["train_data"]["held_out_tasks"] == summary["eval"]["held_out_tasks"] > 0
    assert not (out / ".training").exists() and (out / "adapters" / "latest").read_text().strip() == "v000001"
    assert "adapter gain over base" in result.output
    # evaluate the published version on its own, then train a second version from the first
    again = cli(*common, "--eval-only", str(out), "--eval-on", suite, "--out", str(tmp_path / "e"))
    assert again.exit_code == 0, again.output
    assert set(json.loads((tmp_path / "e" / "summary.json").read_text())["eval"]["models"]) == {"base", "wm-v1"}
    cont = cli(*common, f"wm_train.init_adapter={out}", "--data", suite, "--out", str(out))
    assert cont.exit_code == 0, cont.output
    assert AdapterStore(str(out / "adapters")).latest().version == 2


@pytest.mark.parametrize("args, message", [
    (["--data", "/nonexistent/suite"], "no such data source"),
    (["--eval-only", "/nonexistent/adapter", "--data", "/tmp"], "neither an adapter folder"),
    (["wm_train.rank=0"], "wm_train.rank"),
])
def test_train_worldmodel_user_errors_are_one_line_and_exit_2(args, message):
    result = cli(*args, "--display", "none")
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_rollout_refuses_a_missing_adapter_before_any_work(tmp_path):
    result = CliRunner().invoke(app, ["rollout", f"world_model.adapter={tmp_path}/none",
                                      "--out", str(tmp_path / "r"), "--display", "none"])
    assert result.exit_code == 2 and "adapter" in result.output
    assert not (tmp_path / "r").exists()


def test_a_source_line_that_is_not_a_trajectory_is_one_line(tmp_path):
    """`"str"` or non-UTF-8 lines in an --eval-on source were tracebacks."""
    from obsspec.worldmodel import data

    for text in (b'"str"\n', b'{"a": "caf\xe9"}\n'):
        (tmp_path / "x.jsonl").write_bytes(text)
        with pytest.raises(data.DataError, match="x.jsonl:1: neither a reference trajectory"):
            data._read(str(tmp_path / "x.jsonl"))
