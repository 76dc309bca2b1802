"""A real `obsspec train` of two GRPO steps on a Qwen3-shaped model folder, for the GPU check.

    folder = model_folder(shape, tokenizer, "runs/gpu-check/policy", device="cuda")
    tasks = task_suite("runs/gpu-check/tasks", sandbox_overrides(), timeout=120)
    result = train("runs/gpu-check/train-hf", folder, tasks, device="cuda", timeout=180)
    result = train(..., vllm_python=".venv-vllm/bin/python")     # the policy on a vLLM server

Both are child processes of the CLI (`python -m obsspec ...`), as a user runs them: the recipe
is recipes/tiny-cpu.yaml with overrides that name the folder as policy (the world model is not
used: `train.speculative=false`), the device, a tiny task suite and two steps of 2 tasks x 2
episodes (1 x 2 on the CPU), with a policy LoRA. The random policy writes no valid call, so every episode ends
after its turns with reward 0 and GRPO's advantages are 0: the steps check that generation,
the sampler check, the loss, the backward and the checkpoint run on the device, not learning.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "recipes", "tiny-cpu.yaml")
STEPS = 2


def model_folder(shape, tokenizer, path: str, device: str) -> str:
    """A random `shape` model with `tokenizer`, saved where `policy.model` can name it
    (bf16 on CUDA, float32 on the CPU: the dtype each trainer runs in)."""
    import torch

    from obsspec.models.qwen3_standin import random_qwen3
    from obsspec.models.tiny import save

    if not os.path.isfile(os.path.join(path, "config.json")):
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        model = random_qwen3(shape, tokenizer, dtype=dtype, device=device)
        save(model, tokenizer, path)
        del model
    return path


def sandbox_overrides() -> tuple[list[str], str]:
    """(overrides, why): bubblewrap with the pinned clock where this machine has both, else what
    it can do. A random policy writes no command that parses, so only the tasks' own setup and
    verifier scripts run, unsandboxed where bubblewrap is missing."""
    import asyncio

    from obsspec.env.episode import preflight
    from obsspec.env.sandbox import SandboxConfig, SandboxUnavailable

    for overrides, cfg in (([], SandboxConfig()),
                           (["sandbox.deterministic=false"], SandboxConfig(deterministic=False))):
        try:
            asyncio.run(preflight(cfg))
            return overrides, "bubblewrap" + ("" if cfg.deterministic else " without the pinned clock (no libfaketime)")
        except SandboxUnavailable as e:
            why = str(e)
    return ["sandbox.isolation=none", "sandbox.deterministic=false"], f"unsandboxed ({why})"


def task_suite(out: str, sandbox: list[str], timeout: float) -> str:
    if not os.path.isfile(os.path.join(out, "train.jsonl")):
        run_cli(["prepare-tasks", RECIPE, "tasks.num_instances=4", "tasks.families=[count-lines]",
                 "tasks.val_fraction=0", "tasks.determinism_check=false", "tasks.workers=2", *sandbox,
                 "--out", out, "--display", "none"], timeout)
    return out


def train(out: str, folder: str, tasks: str, device: str, sandbox: list[str], timeout: float,
          vllm_python: str = "", lora_rank: int = 16, new_tokens: int = 32, tasks_per_step: int = 2) -> dict:
    """Two steps of `obsspec train` on the hf engine (or, with `vllm_python`, on a vLLM server
    that obsspec starts); the steps' metrics, the logprob check and the GPU plan it printed."""
    overrides = [f"rollout.tasks_dir={tasks}", f"policy.model={folder}", f"world_model.model={folder}",
                 f"policy.device={device}", f"world_model.device={device}", "policy.batch_invariant=false",
                 "policy.max_turns=2", f"policy.max_new_tokens={new_tokens}", "policy.max_context=2048",
                 "policy.temperature=1.0", "policy.thinking=false", "policy.tool_format=json",
                 f"train.steps={STEPS}", f"train.tasks_per_step={tasks_per_step}", "train.group_size=2",
                 "train.micro_batch_size=2",
                 f"train.policy_lora_rank={lora_rank}", "train.speculative=false", "train.cotrain_every=0",
                 "train.eval_tasks=0", f"train.save_steps={STEPS}", "train.report_to=none", "train.families=[]",
                 "train.warmup_steps=0", "rollout.latency.kind=none", *sandbox]
    if vllm_python:
        overrides += ["policy.engine=vllm", f"policy.server_url=http://127.0.0.1:{free_port()}",
                      "policy.priority_scheduling=false", "servers.launch=true", f"servers.python={vllm_python}"]
        if device == "cuda":
            overrides += ["servers.gpu_memory_utilization=0.3"]
    t0 = time.monotonic()
    log = run_cli(["train", RECIPE, *overrides, "--out", out, "--display", "plain"], timeout)
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if x.strip()]
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    keys = ("loss", "grad_norm", "reward", "sampler/logp_diff_mean", "sampler/logp_diff_max",
            "sampler/weight_mean", "sampler/weight_clipped_frac", "step_time", "rollout_sec")
    return {"sec": round(time.monotonic() - t0, 1), "steps": summary["steps"],
            "metrics": [{"step": r["step"], **{k: r.get(k) for k in keys if k in r}} for r in rows],
            "logprob_check": summary.get("logprob_check"), "plan": plan_lines(log)}


def plan_lines(log: str) -> list[str]:
    """The GPU plan a start on CUDA prints (obsspec/training/plan.py `render`), from its log."""
    lines = log.splitlines()
    start = next((i for i, x in enumerate(lines) if x.lstrip().startswith("node:")), None)
    if start is None:
        return []
    end = next((i for i in range(start, len(lines)) if lines[i].lstrip().startswith("micro-batch:")), start)
    return [x.rstrip() for x in lines[start:end + 1]]


def run_cli(args: list[str], timeout: float) -> str:
    """`python -m obsspec ARGS` with this checkout first on the path; its stderr and stdout. A
    failure raises with the last lines of its output; past `timeout` the whole process group
    (a vLLM server too) is stopped."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen([sys.executable, "-m", "obsspec", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        raise TimeoutError(f"obsspec {args[0]} ran past its time box ({timeout:.0f} s)") from None
    if proc.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-15:])
        raise RuntimeError(f"obsspec {args[0]} exited {proc.returncode}:\n{tail}")
    return out


def has_vllm(python: str) -> str:
    """Why vLLM's parts cannot run with `python` ('' when they can)."""
    if not python or not os.path.exists(python):
        return f"no Python at {python or '(none)'} (servers.python; `make install-vllm`, or --vllm-python)"
    probe = subprocess.run([python, "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"],
                           capture_output=True)
    return "" if probe.returncode == 0 else f"{python} has no vllm package"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
