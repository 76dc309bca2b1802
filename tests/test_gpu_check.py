"""The GPU check (bench/gpu_check.py) in CPU mode, so that it does not rot between GPU runs: every
part runs on tiny shapes with the Qwen3-id tokenizer; an out-of-memory step is reported beside
its estimate; the wheel set for GPU machines carries obsspec's own pins.

Run: .venv/bin/python -m pytest -q tests/test_gpu_check.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from obsspec.memory import GIB, QWEN3, ModelShape, trainer_memory
from obsspec.training.sampler import TOLERANCE
from test_cli import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))


@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_the_gpu_check_runs_in_cpu_mode(tmp_path):
    """The whole check on the CPU, as `make test` runs it (vLLM's part: skipped, with the reason;
    tests/test_vllm_real.py runs obsspec train on a real vLLM server). The budget is large: on a
    loaded 2-core machine each part takes many times its GPU time box."""
    from obsspec.models.qwen3_standin import QWEN3_IDS

    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "bench/gpu_check.py", "--device", "cpu", "--work", str(tmp_path / "work"),
                        "--vllm-python", str(tmp_path / "no-vllm" / "python"), "--budget", "20000",
                        "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result == json.loads(r.stdout) and {"command", "commit", "date"} <= set(result)
    assert result["device"]["kind"] == "cpu" and result["tokenizer"]["special_ids"] == QWEN3_IDS
    parts = result["parts"]
    engine = parts["engine"]
    assert engine["status"] == "ok" and engine["tokens"] == engine["requests"] * 16
    assert engine["dtype"] == "bfloat16" and engine["logprob_gap_max"] < TOLERANCE and engine["logprob_gap_mean"] < 0.01
    assert engine["invariant_repeat_identical"] is True
    probes = parts["memory"]["probes"]
    assert [(p["checkpointing"], p["tokens"]) for p in probes] == [(True, 64), (True, 128), (False, 64), (False, 128)]
    assert all(p["result"].startswith("ran") and p["estimate_gib"] > 0 and p["measured_gib"] is None for p in probes)
    train = parts["train"]
    assert train["status"] == "ok" and train["steps"] == 2 and [m["step"] for m in train["metrics"]] == [1, 2]
    assert all(m["loss"] is not None for m in train["metrics"])
    assert train["logprob_check"]["tokens"] > 0 and train["logprob_check"]["mean_abs"] < 1e-3
    assert parts["train_vllm"] == {"status": "skipped", "part_sec": parts["train_vllm"]["part_sec"],
                                   "reason": parts["train_vllm"]["reason"]}
    assert "no-vllm" in parts["train_vllm"]["reason"]
    assert "plan" in r.stderr and "train: ok" in r.stderr


class StubTokenizer:
    eos_token_id, pad_token_id = 2, 1

    def __len__(self):
        return 64


def test_an_out_of_memory_step_is_reported_as_does_not_fit_beside_its_estimate(monkeypatch):
    """A step that runs out of memory is "does not fit" with the estimate beside it; the longer
    rows of that setting are not tried, the other setting still is."""
    import torch

    import gpu_memory_probe as probe
    from obsspec.models.qwen3_standin import random_qwen3

    shape = ModelShape("micro", 1, 32, 2, 1, 16, 64, 64, True, 512, 4)
    model = random_qwen3(shape, StubTokenizer(), dtype=torch.float32)
    real, tried = probe.policy_loss_step, []

    def step(peft_model, tokens, vocab, device):
        tried.append((peft_model.get_base_model().is_activation_checkpointing, tokens))
        if tokens >= 64 and not peft_model.get_base_model().is_activation_checkpointing:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(peft_model, tokens, vocab, device)

    monkeypatch.setattr(probe, "policy_loss_step", step)
    rows = probe.probe(model, shape, 4, [32, 64, 128], time.monotonic() + 600, log=lambda line: None)
    results = [(r["checkpointing"], r["tokens"], r["result"]) for r in rows]
    assert results == [(True, 32, "ran (no CUDA: nothing measured)"), (True, 64, "ran (no CUDA: nothing measured)"),
                       (True, 128, "ran (no CUDA: nothing measured)"), (False, 32, "ran (no CUDA: nothing measured)"),
                       (False, 64, "does not fit"), (False, 128, "skipped: 64 tokens did not fit")]
    assert (False, 128) not in tried, "a longer row than one that did not fit was tried"
    oom = rows[4]
    assert oom["estimate_gib"] == round(trainer_memory(shape, 4, rows=1, tokens=64).total(False) / GIB, 2)
    assert oom["error"].startswith("CUDA out of memory") and oom["measured_gib"] is None
    assert "does not fit" in probe.line(oom) and "plan" in probe.line(oom)


def test_the_stand_ins_have_the_parameters_the_plan_counts():
    """A random Qwen3 of a stored shape (built on the meta device: no memory) has exactly the
    parameters obsspec/memory.py counts for that shape, which the memory probe's estimate uses."""
    from obsspec.models.qwen3_standin import random_qwen3

    class Qwen3Sized(StubTokenizer):
        eos_token_id, pad_token_id = 151645, 151643

        def __len__(self):
            return 151669

    for name in ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B"):
        model = random_qwen3(QWEN3[name], Qwen3Sized(), device="meta")
        assert sum(p.numel() for p in model.parameters()) == QWEN3[name].params, name


def test_a_failed_or_late_part_is_reported_and_the_next_part_runs(monkeypatch):
    import gpu_check

    class Stub:
        def engine(self, deadline):
            raise RuntimeError("the engine broke\nsecond line")

        def memory(self, deadline):
            raise TimeoutError("ran past its time box")

    monkeypatch.setattr(gpu_check, "log", lambda line: None)
    broke = gpu_check.run_part(Stub(), "engine", 10)
    assert broke["status"] == "failed" and broke["error"] == "RuntimeError: the engine broke"
    assert broke["output"] == ["second line"]
    assert gpu_check.run_part(Stub(), "memory", 10)["status"] == "timed out"


def test_the_gpu_wheels_carry_obsspecs_pins():
    """make gpu-wheels: the versions it downloads are pyproject.toml's pins (and none twice)."""
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    wheels = dict(w.split("==") for w in re.search(r"^GPU_WHEELS := (.*)$", makefile, re.M).group(1).split())
    pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
    pins = dict(re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', pyproject))
    for name in ("trl", "datasets", "transformers", "peft"):
        assert wheels[name] == pins[name], f"make gpu-wheels: {name} {wheels[name]}, pyproject.toml: {pins[name]}"
    from importlib import metadata

    for name in ("dill", "multiprocess"):  # datasets' own needs, as installed beside it here
        assert wheels[name] == metadata.version(name), name


def test_the_plan_a_start_prints_is_found_in_its_log():
    """bench/gpu_train_run.py keeps the GPU plan that `obsspec train` prints at a start on CUDA."""
    import gpu_train_run
    from obsspec.config import load_recipe
    from obsspec.training.plan import Node, gpu_plan, render

    text = render(gpu_plan(load_recipe(os.path.join(ROOT, "recipes", "terminal-8b.yaml")), Node(8, 80.0), 2))
    log = f"preparing\n{text}\nstep 1/2: reward 0.000\n"
    assert gpu_train_run.plan_lines(log) == text.splitlines() and len(text.splitlines()) > 5
    assert gpu_train_run.plan_lines("step 1/2: reward 0.000\n") == []
