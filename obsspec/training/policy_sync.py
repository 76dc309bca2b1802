"""The trainer's policy on a vLLM server: a LoRA version per optimizer step.

With `policy.engine: vllm` the rollouts generate on a server, not on the trainer's model, so the
weights must travel. obsspec trains a policy LoRA (`train.policy_lora_rank`) and, before every
round of rollouts whose weights the server does not have yet, the main process saves the
adapter with PEFT, publishes it as the next version under RUN_DIR/policy/adapters (the same
atomic `AdapterStore` the world model's versions use) and loads it into the server under a new
name (`policy-vN`); every process's rollouts then name that adapter, and the version it replaces
is unloaded. Step k+1's rollouts therefore sample from the weights step k's update left — the
same guarantee the hf engine gives by serving the trainer's model object. After a resume the
first round publishes the restored weights the same way. Versions older than the newest
`keep` (`train.keep_adapter_versions`) are deleted after each push (obsspec/training/retention.py):
only the one serving matters to the run, and each is ~0.7 GB at rank 64 on Qwen3-8B.

The server must be able to read RUN_DIR (one machine, or a shared file system) and run with LoRA
enabled (`obsspec serve RECIPE` starts it so; docs/ENGINES.md). `load_adapter` sends the folder
absolute and checks the server's own listing names it afterwards: a push that never lands stops
the run instead of leaving the rollouts on stale weights.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time

from obsspec.worldmodel.adapters import AdapterStore


class PolicySync:
    def __init__(self, engine, out_dir: str, state, rollouts, keep: int = 0):
        self.engine, self.state, self.rollouts, self.keep = engine, state, rollouts, keep
        self.store = AdapterStore(os.path.join(out_dir, "policy", "adapters"), prefix="policy")
        self.work = os.path.join(out_dir, "policy", "training")
        self.synced_step: int | None = None   # the trainer step whose weights the server has
        self.last: dict = {}
        self.pushed = lambda: None            # told of every version loaded (the trainer's sampler check)

    def __call__(self, trainer) -> None:
        step = trainer.state.global_step
        if step == self.synced_step:
            return
        t0 = time.monotonic()
        if self.state.is_main_process:
            model = trainer.accelerator.unwrap_model(trainer.model)
            if not hasattr(model, "peft_config"):
                raise RuntimeError("the policy is not a PEFT model: a vLLM policy needs train.policy_lora_rank > 0")
            tmp = os.path.join(self.work, f"step-{step:06d}")
            model.save_pretrained(tmp)             # the adapter only (PEFT)
            version = self.store.publish(tmp, meta={"step": step})
            shutil.rmtree(tmp, ignore_errors=True)
            old = self.rollouts.policy_adapter
            asyncio.run(self.engine.load_adapter(version.name, version.path))
            if old and old != version.name:
                asyncio.run(self.engine.unload_adapter(old))
            self.store.prune(self.keep, protect={version.version})
        self.pushed()                              # (every process: the check's collectives are shared)
        self.state.wait_for_everyone()             # the others read the version the main one published
        version = self.store.latest()
        self.rollouts.policy_adapter = version.name
        self.synced_step = step
        self.last = {"policy/version": version.version, "policy/sync_sec": round(time.monotonic() - t0, 3)}
