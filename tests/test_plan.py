"""The GPU plan: model shapes, memory estimates, placement on a node, and one-line refusals.

Arithmetic only, so every test runs on a CPU in well under a second (the saved-tensor check runs a
two-layer model of a few thousand parameters).

Run: .venv/bin/python -m pytest -q tests/test_plan.py
"""

import os

import pytest
import torch
from typer.testing import CliRunner

from obsspec.cli import app
from obsspec.config import load_recipe
from obsspec.training.grpo import TrainError, dry_run_plan, training_plan
from obsspec.memory import (GIB, QWEN3, ModelShape, layer_bytes, model_shape, server_memory,
                                     trainer_memory)
from obsspec.training import plan as plan_mod
from obsspec.training.plan import Node, PlanError, check_launch, gpu_plan, render, uses_checkpointing

EIGHT_80 = Node(8, 80.0)


def gpu8b(*overrides, node=EIGHT_80, processes=2):
    return gpu_plan(load_recipe("recipes/terminal-8b.yaml", list(overrides)), node, processes)


# -- shapes and estimates ------------------------------------------------------------------------------

def test_stored_qwen3_shapes_give_the_published_sizes():
    sizes = {name: s.params / 1e9 for name, s in QWEN3.items()}
    assert sizes["Qwen/Qwen3-0.6B"] == pytest.approx(0.596, abs=0.002)
    assert sizes["Qwen/Qwen3-8B"] == pytest.approx(8.19, abs=0.01)
    assert sizes["Qwen/Qwen3-32B"] == pytest.approx(32.76, abs=0.01)
    assert QWEN3["Qwen/Qwen3-8B"].kv_bytes_per_token == 144 * 1024  # 2 x 36 x 8 x 128 x 2 bytes


def test_a_model_folder_is_read_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, '
        '"head_dim": 16, "intermediate_size": 96, "vocab_size": 300, "tie_word_embeddings": true, '
        '"max_position_embeddings": 512, "dtype": "float32"}')
    s = model_shape(str(tmp_path))
    assert (s.layers, s.kv_heads, s.positions, s.weight_bytes, s.tied) == (2, 2, 512, 4, True)
    assert model_shape("someone/unknown-model") is None


def _saved_bytes_per_token_and_layer(shape: ModelShape, lora_rank: int, autocast: bool) -> float:
    """What autograd keeps, counted with saved-tensor hooks on a real Qwen3 (bf16 weights)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    def saved(layers: int, tokens: int) -> int:
        torch.manual_seed(0)
        cfg = Qwen3Config(hidden_size=shape.hidden, num_attention_heads=shape.heads, head_dim=shape.head_dim,
                          num_key_value_heads=shape.kv_heads, intermediate_size=shape.mlp,
                          num_hidden_layers=layers, vocab_size=shape.vocab, tie_word_embeddings=False)
        cfg._attn_implementation = "sdpa"
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
        if lora_rank:
            model = get_peft_model(model, LoraConfig(r=lora_rank, target_modules=list(shape.linear_dims())))
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        seen = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in params:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids = torch.randint(0, shape.vocab, (1, tokens))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, use_cache=False)
        return sum(seen.values())

    per_layer = lambda tokens: saved(2, tokens) - saved(1, tokens)  # noqa: E731
    return (per_layer(64) - per_layer(32)) / 32   # per token (constant terms cancel)


@pytest.mark.parametrize("lora_rank,autocast", [(4, True), (0, True), (4, False)])
def test_activation_bytes_are_what_autograd_keeps(lora_rank, autocast):
    """The formula the plan's activations rest on, against a real Qwen3 layer (unpadded rows)."""
    shape = ModelShape("small", 2, 64, 4, 2, 32, 96, 128, False, 512)   # q_dim 128 != hidden, like 0.6B
    measured = _saved_bytes_per_token_and_layer(shape, lora_rank, autocast)
    assert measured == layer_bytes(shape, lora_rank, padded=False, lora_input_bytes=2 if autocast else 4)


def test_trainer_estimate_at_32k_tokens():
    s = QWEN3["Qwen/Qwen3-8B"]
    two = trainer_memory(s, 64, rows=2, tokens=32768)
    assert two.weights / GIB == pytest.approx(15.26, abs=0.01)
    assert two.tile == 4096 * 32768 * 2, "the fused LM head holds one bf16 tile, not the logits"
    logits = 2 * 32768 * s.vocab * (2 + 4)   # bf16 logits and their fp32 log-softmax: 55.6 GiB
    assert two.lm_head < logits / 20, "the LM head's term must not be the full logits"
    assert two.total(True) / GIB < 72 < trainer_memory(s, 64, rows=3, tokens=32768).total(True) / GIB
    assert two.total(False) > 8 * two.total(True), "checkpointing is what makes 32k tokens fit"


def test_server_kv_cache_and_its_sequences():
    m = server_memory(QWEN3["Qwen/Qwen3-8B"], 4, 0.9, 80, 32768, 64)
    assert m.budget == int(0.9 * 80 * GIB) and m.weights == QWEN3["Qwen/Qwen3-8B"].params * 2 // 4
    assert m.kv_total == 4 * (m.budget - m.weights - m.lora - m.reserve)
    assert m.sequences == m.kv_total // (32768 * 147456) == 58


# -- the shipped layouts --------------------------------------------------------------------------------

@pytest.mark.parametrize("memory", [80.0, 79.2])   # (79.2: what CUDA reports for an 80 GB H100)
def test_terminal_8b_fits_one_node_of_8_gpus_of_80_gb(memory):
    plan = gpu8b(node=Node(8, memory))
    where = {p["process"]: p["gpus"] for p in plan["processes"]}
    assert where == {"trainer": [0, 1], "policy server": [2, 3, 4, 5], "world-model server": [6], "co-training": [7]}
    assert plan["checkpointing"] and plan["micro_batch"] == plan["largest_micro_batch"] == 2
    for gpu in plan["gpus"].values():
        side = sum(o["gib"] for o in gpu["occupants"] if not o["server_share"])
        assert side <= gpu["usable_gib"] and gpu["servers_share"] <= 1
    server = next(p for p in plan["processes"] if p["process"] == "policy server")
    assert server["tensor_parallel"] == 4 and server["sequences"] >= 50


def test_terminal_32b_needs_141_gb_gpus_and_says_why_on_80():
    recipe = load_recipe("recipes/terminal-32b.yaml")
    plan = gpu_plan(recipe, Node(8, 141.0), 2)
    assert plan["micro_batch"] == 1 and plan["largest_micro_batch"] == 1
    with pytest.raises(PlanError, match=r"GPU 0 needs 111\.\d GiB.*weights and LoRA state take 70\.\d"):
        gpu_plan(recipe, EIGHT_80, 2)


def test_one_gpu_is_refused_in_one_line():
    with pytest.raises(PlanError, match="names GPU 2 but the node has 1 GPU.*needs 8 GPUs"):
        gpu8b(node=Node(1, 80.0))
    on_one = ["servers.trainer_gpus=0", "servers.policy_gpus=0", "servers.world_model_gpus=0", "servers.cotrain_gpu=0"]
    with pytest.raises(PlanError, match="take 1.80 of it.*servers.gpu_memory_utilization to 0.45"):
        gpu8b(*on_one, node=Node(1, 80.0), processes=1)
    with pytest.raises(PlanError, match="GPU 0 needs .* over the .*even one row does not fit") as e:
        gpu8b(*on_one, "servers.gpu_memory_utilization=0.3", "train.micro_batch_size=1", node=Node(1, 80.0),
              processes=1)
    assert "\n" not in str(e.value)


def test_a_micro_batch_too_large_is_refused_naming_the_key():
    with pytest.raises(PlanError) as e:
        gpu8b("train.micro_batch_size=4")
    message = str(e.value)
    assert message.startswith("GPU 0 needs 108.") and "36.1 over the 72.0" in message
    assert message.endswith("set train.micro_batch_size=2, the largest that fits") and "\n" not in message


def test_full_fine_tuning_of_8b_is_refused():
    with pytest.raises(PlanError, match=r"full fine-tuning of Qwen/Qwen3-8B \(train.policy_lora_rank=0\) keeps "
                                        r"its bf16 weights, gradients and AdamW moments, 61.0 of the 72.0"):
        gpu8b("policy.engine=hf", "policy.priority_scheduling=false", "train.policy_lora_rank=0")


def test_co_training_that_overflows_its_gpu_names_the_key():
    with pytest.raises(PlanError, match=r"GPU 7 .*8 row\(s\) of wm_train.max_length=32768 .*attention mask "
                                        r"\d+\.\d.*set wm_train.micro_batch_size=1,"):
        gpu8b("wm_train.micro_batch_size=8")
    with pytest.raises(PlanError, match=r"GPU 7 .*activations \d+\.\d.*set wm_train.activation_checkpointing=true"):
        gpu8b("wm_train.activation_checkpointing=false")


def test_co_training_estimate_follows_the_code():
    """One row a pass pads nothing (no mask); the loss scores the labelled tokens in chunks, so its
    logits do not grow with the rows (before: 18.6 GiB of full logits at 4 x 2,048 tokens)."""
    from obsspec.memory import ALL_LINEAR, LOGITS_CHUNK_BYTES, cotrain_memory
    from obsspec.models import warmstart

    s = QWEN3["Qwen/Qwen3-0.6B"]
    short, long = (cotrain_memory(s, 8, ALL_LINEAR, 1, n, checkpointing=True) for n in (2048, 32768))
    assert short.logits == long.logits == (LOGITS_CHUNK_BYTES // (4 * s.vocab)) * s.vocab * 16
    assert warmstart.LOGITS_CHUNK_BYTES == LOGITS_CHUNK_BYTES, "the plan counts the chunk the loss uses"
    assert long.mask == 0 and cotrain_memory(s, 8, ALL_LINEAR, 2, 2048).mask > 0
    off = cotrain_memory(s, 8, ALL_LINEAR, 1, 32768)
    assert off.activations > 10 * long.activations
    plan = gpu8b()
    gpu7 = plan["gpus"]["7"]["occupants"][0]
    assert gpu7["process"] == "co-training" and gpu7["gib"] == pytest.approx(long.total() / GIB, abs=0.01)


def test_checkpointing_only_where_the_trainers_model_does_not_generate():
    cuda = load_recipe("recipes/terminal-8b.yaml")
    assert uses_checkpointing(cuda.policy, cuda=True)
    assert not uses_checkpointing(cuda.policy, cuda=False)
    hf = load_recipe("recipes/terminal-8b.yaml", ["policy.engine=hf", "policy.priority_scheduling=false"])
    assert not uses_checkpointing(hf.policy, cuda=True), "a checkpointed layer in training mode drops the KV cache"


# -- starts and the CLI -----------------------------------------------------------------------------------

def test_a_start_on_gpus_refuses_before_anything_loads(monkeypatch, tmp_path):
    """`obsspec train` on a node the layout does not fit: the plan's one line, no model loaded,
    nothing written."""
    import obsspec.training.setup as setup
    from obsspec.training.grpo import run_training

    monkeypatch.setattr(plan_mod, "detect_node", lambda named=0: Node(1, 80.0, "detected"))
    monkeypatch.setattr(setup, "build_run", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(PlanError, match="names GPU 2 but the node has 1 GPU"):
        run_training(load_recipe("recipes/terminal-8b.yaml", ["servers.trainer_gpus=0"]), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_cuda_recipe_where_torch_sees_no_gpu_stops_in_one_line_before_anything(tmp_path):
    """`obsspec train recipes/terminal-8b.yaml` on a machine whose torch has no GPU: one line
    that says why (a CPU build, or no driver for its CUDA), before a task is prepared."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = CliRunner().invoke(app, ["train", "recipes/terminal-8b.yaml", "--out", str(tmp_path / "run")])
    assert r.exit_code == 2, r.output
    assert "sees no GPU" in r.output or "CPU build" in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "run").exists()


def test_launch_must_match_the_trainer_gpus(monkeypatch):
    recipe = load_recipe("recipes/terminal-8b.yaml")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    check_launch(recipe, 1, 1, 2)
    with pytest.raises(PlanError, match="4 process.*--num_processes 2"):
        check_launch(recipe, 0, 0, 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    with pytest.raises(PlanError, match="rank 0 runs on GPU 2.*CUDA_VISIBLE_DEVICES=0,1"):
        check_launch(recipe, 0, 0, 2)


def test_dry_run_prints_placement_and_every_gpus_estimate():
    r = CliRunner().invoke(app, ["train", "recipes/terminal-8b.yaml", "--dry-run", "--gpus", "8",
                                 "--gpu-memory-gb", "80"])
    assert r.exit_code == 0, r.output
    assert "policy server       GPUs 2,3,4,5 (tensor parallel 4)" in r.output
    assert "58 sequences of 32,768 tokens" in r.output
    for g in range(8):
        assert f"GPU  {g}  " in r.output
    assert "activation checkpointing on" in r.output and "logits tile 0.25" in r.output


def test_dry_run_exits_2_on_a_plan_that_does_not_fit():
    r = CliRunner().invoke(app, ["train", "recipes/terminal-8b.yaml", "train.micro_batch_size=4", "--dry-run",
                                 "--gpus", "8", "--gpu-memory-gb", "80"])
    assert r.exit_code == 2
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "train.micro_batch_size=2" in errors[0]
    assert "GPU  0  trainer rank 0       108." in r.output, "the plan that overflowed is printed first"
    r = CliRunner().invoke(app, ["train", "recipes/terminal-8b.yaml", "--dry-run", "--gpus", "8"])
    assert r.exit_code == 2 and "--gpu-memory-gb" in r.output


def test_tiny_recipes_have_no_gpu_plan_and_keep_their_batches():
    for name in ("tiny-cpu", "tiny-cpu-vllm", "tiny-cpu-bases"):
        recipe = load_recipe(f"recipes/{name}.yaml")
        assert recipe.policy.device == "cpu"
        plan, text = dry_run_plan(recipe, gpus=8, gpu_memory_gb=80)
        assert plan["gpu"] is None and "GPU" not in text
    assert training_plan(load_recipe("recipes/tiny-cpu.yaml"))["per_step"]["micro_batch"] == 16


def test_render_shows_both_activation_figures():
    text = render(gpu8b())
    assert "activations 36.3 + attention mask 6.0 (checkpointing on; off: 665.6)" in text


def test_gpu_options_without_dry_run_are_refused():
    r = CliRunner().invoke(app, ["train", "recipes/terminal-8b.yaml", "--gpus", "8", "--gpu-memory-gb", "80"])
    assert r.exit_code == 2 and "go with --dry-run" in r.output


def test_the_simulators_gpu_presets_take_the_plans_capacity():
    from obsspec.sim.presets import preset

    for name, recipe, memory in (("h100-8b", "terminal-8b", 80.0), ("h100-32b", "terminal-32b", 141.0)):
        plan = gpu_plan(load_recipe(f"recipes/{recipe}.yaml"), Node(8, memory), 2)
        server = next(p for p in plan["processes"] if p["process"] == "policy server")
        cfg = preset(name)
        assert cfg.engine.max_batch == server["sequences"] // len(server["gpus"]), name
        assert cfg.workload.episodes == 256 // len(server["gpus"]), name
    assert os.path.exists("recipes/terminal-8b.yaml")
    with pytest.raises(TrainError):
        dry_run_plan(load_recipe("recipes/terminal-8b.yaml"), gpus=-1, gpu_memory_gb=80)


def test_priority_admission_lets_committed_work_in_first():
    """The GPU presets' engine (vLLM --scheduling-policy priority): a committed request that
    arrives behind a speculative one is admitted first when one place frees."""
    from obsspec.sim.config import EngineSpec
    from obsspec.sim.engine import FluidEngine

    order = []
    for mode in ("equal", "priority"):
        engine = FluidEngine(EngineSpec(single_tok_s=10.0, peak_tok_s=10.0, max_batch=1, spec_priority=mode))
        engine.submit(5, 0, kind="running")
        engine.submit(5, 1, kind="speculative")
        engine.submit(5, 0, kind="committed")
        engine.advance(engine.next_completion(), finish_one=True)
        order.append(engine.decoding[0].meta["kind"])
    assert order == ["speculative", "committed"]


def test_a_model_of_unknown_shape_is_run_without_a_plan_not_refused():
    recipe = load_recipe("recipes/terminal-8b.yaml", ["policy.model=someone/other-8b"])
    plan, text = dry_run_plan(recipe, gpus=8, gpu_memory_gb=80)
    assert "skipped" in plan["gpu"] and "policy.model 'someone/other-8b' is unknown" in text
