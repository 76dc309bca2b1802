"""The GPU check: obsspec's GPU path on one GPU, offline, in under ten minutes (docs/GPU_CHECK.md).

    .venv/bin/python bench/gpu_check.py [--device cuda|cpu] [--parts engine,memory,train,train_vllm]
        [--vllm-python PATH] [--work runs/gpu-check] [--budget 570] [--out bench/results/gpu_check.json]

Nothing is downloaded: the models are random-initialised Qwen3 shapes (obsspec/memory.py `QWEN3`)
with a tokenizer that has Qwen3's special tokens at Qwen3's ids (obsspec/models/qwen3_standin.py).
The parts, in order, each in its own time box (a part past its box stops and says so):
- engine      the hf engine (obsspec/engines/hf.py) generating from the Qwen3-8B shape in bf16:
              8 sampled requests in batched mode, their tokens/s and how far the engine's logprobs
              are from a full forward's; one seeded request twice in batch-invariant mode.
- memory      the trainer's peak memory for the 8B shape, LoRA r64, micro-batch 1, at 4k-32k tokens
              with activation checkpointing on and off, beside the plan's estimate (bench/gpu_memory_probe.py).
- train       `obsspec train`: two GRPO steps with a policy LoRA on the hf engine, on the Qwen3-0.6B
              shape saved as a model folder, on a tiny task suite (bench/gpu_train_run.py).
- train_vllm  the same with the policy on a vLLM server that obsspec starts; skipped with the
              reason where vLLM is not installed (--vllm-python).
On a machine without CUDA (or --device cpu) the same parts run on tiny shapes (bf16 but for the
trained folder, float32 as the CPU trainer runs) and nothing is measured: tests/test_gpu_check.py
runs it so in `make test`, so the check does not rot.
Prints one JSON object (stamped: bench/provenance.py) and, on stderr, a line per part and the
plan-vs-measured table. Exits 1 when a part failed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import shutil
import sys
import time
import warnings

from provenance import emit, stamp

import gpu_memory_probe
import gpu_train_run
from obsspec.memory import GIB, QWEN3, ModelShape

PARTS = ("engine", "memory", "train", "train_vllm")
BUDGET = 570       # seconds for all parts: ten minutes with the imports and the JSON
BOXES = {"engine": 90, "memory": 180, "train": 180, "train_vllm": 240}   # seconds, each at most (at BUDGET)
GPU = {"engine": QWEN3["Qwen/Qwen3-8B"], "memory": QWEN3["Qwen/Qwen3-8B"], "train": QWEN3["Qwen/Qwen3-0.6B"],
       "lengths": [4096, 8192, 16384, 32768], "requests": 8, "new_tokens": 128, "train_tokens": 32,
       "train_tasks": 2}
TINY = ModelShape("tiny-qwen3", 2, 64, 4, 2, 32, 128, 151936, True, 4096)   # (vLLM on CPUs: head_dim >= 32)
CPU = {"engine": TINY, "memory": TINY, "train": TINY, "lengths": [64, 128], "requests": 4, "new_tokens": 16,
       "train_tokens": 16, "train_tasks": 1}
LORA_RANK = 64     # terminal-8b.yaml's train.policy_lora_rank
INSTRUCTIONS = ["Count the lines of data/notes.txt and write the number to count.txt.",
                "List the files under logs/ larger than 1 KB, one per line, into big.txt.",
                "Rename every .jpeg file in photos/ to .jpg.",
                "Write the most frequent word of essay.txt to top.txt."]


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# The parts


class Check:
    def __init__(self, device: str, work: str, vllm_python: str):
        import torch

        self.torch, self.device, self.work, self.vllm_python = torch, device, work, vllm_python
        self.cuda = device == "cuda"
        self.sizes = GPU if self.cuda else CPU
        self.dtype = torch.bfloat16  # the engine's and the probe's model (the trained folder: train's dtype)
        t0 = time.monotonic()
        from obsspec.models.qwen3_standin import QWEN3_IDS, qwen3_tokenizer

        self.tokenizer = qwen3_tokenizer()
        self.tokenizer_info = {"sec": round(time.monotonic() - t0, 1), "ids": len(self.tokenizer),
                               "special_ids": {t: self.tokenizer.convert_tokens_to_ids(t) for t in QWEN3_IDS}}
        self.model = None   # the engine's and the memory probe's model (the same shape)

    def big_model(self):
        if self.model is None:
            from obsspec.models.qwen3_standin import random_qwen3

            self.model = random_qwen3(self.sizes["engine"], self.tokenizer, dtype=self.dtype, device=self.device)
        return self.model

    def engine(self, deadline: float) -> dict:
        from obsspec.tokens import ChatFormat

        fmt = ChatFormat(self.tokenizer, thinking=False, tool_format="json")
        t0 = time.monotonic()
        model = self.big_model()
        out = {"shape": self.sizes["engine"].name, "dtype": str(self.dtype).removeprefix("torch."),
               "build_sec": round(time.monotonic() - t0, 1)}
        out.update(asyncio.run(self._generate(model, fmt, deadline)))
        return out

    async def _generate(self, model, fmt, deadline: float) -> dict:
        from obsspec.engines.base import GenerationRequest
        from obsspec.engines.hf import HFEngine

        n, new = self.sizes["requests"], self.sizes["new_tokens"]
        requests = [GenerationRequest(prompt_ids=fmt.prompt_ids(INSTRUCTIONS[i % len(INSTRUCTIONS)]),
                                      max_new_tokens=new, temperature=1.0, seed=i) for i in range(n)]
        engine = HFEngine(model, self.tokenizer, batch_invariant=False, max_batch_size=n, device=self.device)
        try:  # (the first pass pays for CUDA's and the kernels' start-up: not in the timing)
            await engine.generate(dataclasses.replace(requests[0], max_new_tokens=2, request_id=""))
            t0 = time.perf_counter()
            gens = await asyncio.gather(*(engine.generate(r) for r in requests))
            sec = time.perf_counter() - t0
        finally:
            await asyncio.to_thread(engine.close)
        tokens = sum(len(g.token_ids) for g in gens)
        out = {"requests": n, "prompt_tokens": len(requests[0].prompt_ids), "tokens": tokens,
               "sec": round(sec, 2), "tokens_per_sec": round(tokens / sec, 1)}
        out.update(self._logprob_gap(model, requests, gens))
        if time.monotonic() < deadline:  # a request's own forward passes: the same twice?
            engine = HFEngine(model, self.tokenizer, batch_invariant=True, device=self.device)
            try:
                short = GenerationRequest(prompt_ids=requests[0].prompt_ids, max_new_tokens=min(new, 32),
                                          temperature=1.0, seed=7)
                a = await engine.generate(short)
                b = await engine.generate(dataclasses.replace(short, request_id=""))
            finally:
                await asyncio.to_thread(engine.close)
            out["invariant_repeat_identical"] = a.token_ids == b.token_ids and a.logprobs == b.logprobs
        return out

    def _logprob_gap(self, model, requests, gens) -> dict:
        """|engine - full forward| of each sampled token's logprob at the sampling temperature:
        what the sampler check (obsspec/training/sampler.py) sees with policy.engine=hf."""
        torch = self.torch
        gaps = []
        with torch.no_grad():
            for r, g in zip(requests, gens):
                ids = torch.tensor([list(r.prompt_ids) + list(g.token_ids)], device=self.device)
                logits = model(input_ids=ids, logits_to_keep=len(g.token_ids) + 1).logits[0, :-1].float()
                full = torch.log_softmax(logits / r.temperature, -1).gather(
                    1, torch.tensor(g.token_ids, device=self.device)[:, None])[:, 0]
                gaps.append((full - torch.tensor(g.logprobs, device=self.device)).abs())
        gap = torch.cat(gaps)
        return {"logprob_gap_mean": float(gap.mean()), "logprob_gap_max": float(gap.max())}

    def memory(self, deadline: float) -> dict:
        shape = self.sizes["memory"]
        log(f"memory: {shape.name}, LoRA r{LORA_RANK}, micro-batch 1 (a padded row), plan vs measured:")
        model = self.big_model()
        self.free(keep_model=True)  # (nothing of the engine's left to count)
        rows = gpu_memory_probe.probe(model, shape, LORA_RANK, self.sizes["lengths"], deadline, log)
        del model
        self.free()  # (wrapped by PEFT now; the parts in other processes need the GPU)
        return {"shape": shape.name, "lora_rank": LORA_RANK, "rows": 1, "padded": True,
                "gpu_gib": round(self.torch.cuda.get_device_properties(0).total_memory / GIB, 1) if self.cuda else None,
                "probes": rows}

    def train(self, deadline: float, vllm: bool = False) -> dict:
        if vllm:
            why = gpu_train_run.has_vllm(self.vllm_python)
            if why:
                return {"status": "skipped", "reason": why}
        self.free()
        shape = self.sizes["train"]
        t0 = time.monotonic()
        folder = os.path.join(self.work, shape.name.replace("/", "-"))
        gpu_train_run.model_folder(shape, self.tokenizer, folder, self.device)
        self.free()
        sandbox, how = gpu_train_run.sandbox_overrides()
        tasks = gpu_train_run.task_suite(os.path.join(self.work, "tasks"), sandbox, deadline - time.monotonic())
        prepared = round(time.monotonic() - t0, 1)
        out = os.path.join(self.work, "train-vllm" if vllm else "train-hf")
        shutil.rmtree(out, ignore_errors=True)  # (a run of an earlier check)
        result = gpu_train_run.train(out, folder, tasks, self.device, sandbox, deadline - time.monotonic(),
                                     vllm_python=self.vllm_python if vllm else "",
                                     new_tokens=self.sizes["train_tokens"], tasks_per_step=self.sizes["train_tasks"])
        return {"shape": shape.name, "engine": "vllm" if vllm else "hf", "sandbox": how,
                "setup_sec": prepared, **result}

    def free(self, keep_model: bool = False) -> None:
        if not keep_model:
            self.model = None
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Running them


def run_part(check: Check, name: str, box: float) -> dict:
    t0 = time.monotonic()
    deadline = t0 + box
    log(f"{name}: up to {box:.0f} s")
    try:
        out = check.train(deadline, vllm=True) if name == "train_vllm" else getattr(check, name)(deadline)
        out.setdefault("status", "timed out" if time.monotonic() > deadline else "ok")
    except Exception as e:  # noqa: BLE001 - a failed part is reported; the next one runs
        first, _, rest = str(e).partition("\n")
        out = {"status": "timed out" if isinstance(e, TimeoutError) else "failed",
               "error": f"{type(e).__name__}: {first}", **({"output": rest.splitlines()} if rest else {})}
    out["part_sec"] = round(time.monotonic() - t0, 1)
    log(f"{name}: {out['status']} in {out['part_sec']} s" + (f" ({out.get('reason') or out.get('error')})"
                                                             if out["status"] != "ok" else ""))
    return out


def versions() -> dict:
    from importlib import metadata

    found = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "pyarrow", "tokenizers"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="", help="default: cuda when there is one")
    p.add_argument("--parts", default=",".join(PARTS), help=f"a comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--vllm-python", default=os.path.join(gpu_train_run.ROOT, ".venv-vllm", "bin", "python"),
                   help="the Python of vLLM's environment (servers.python)")
    p.add_argument("--work", default="runs/gpu-check", help="models, tasks and runs go here")
    p.add_argument("--budget", type=float, default=BUDGET, help="seconds for all parts together; each part's "
                   "time box grows with it (a loaded CPU machine needs more)")
    p.add_argument("--out", default="", help="also write the JSON here")
    args = p.parse_args()
    parts = [x for x in args.parts.split(",") if x]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    t0 = time.monotonic()
    import torch

    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here")
    os.makedirs(args.work, exist_ok=True)
    check = Check(device, os.path.abspath(args.work), args.vllm_python)
    gpu = device == "cuda"
    result = {**stamp(), "device": {"kind": device, "name": torch.cuda.get_device_name(0) if gpu else "cpu",
                                    "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / GIB, 1)
                                    if gpu else None},
              "versions": versions(), "tokenizer": check.tokenizer_info, "parts": {}}
    for name in PARTS:
        left = args.budget - (time.monotonic() - t0)
        if name not in parts:
            continue
        if left < 20:
            result["parts"][name] = {"status": "skipped",
                                     "reason": f"the check's budget ({args.budget:.0f} s) is spent"}
            continue
        result["parts"][name] = run_part(check, name, min(BOXES[name] * args.budget / BUDGET, left))
    result["wall_sec"] = round(time.monotonic() - t0, 1)
    emit(result, args.out)
    return 1 if any(x["status"] in ("failed", "timed out") for x in result["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
