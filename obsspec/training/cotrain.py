"""World-model co-training: a new LoRA adapter version after every k policy steps.

After a step's rollouts, its fresh (context -> real observation) pairs — the rollouts' own token
ids, loss on observation bodies + closing tags (`warmstart.trajectory_examples`) — train the
adapter further, continuing from the version in use. Training runs in a child process
(`python -m obsspec.training.cotrain`): it runs alongside the policy's GRPO update instead of
after it, and it is its own single-process job even when the trainer is distributed. Before the
next step's rollouts the child is awaited, its adapter published as a new version
(obsspec/worldmodel/adapters.py `AdapterStore`: atomic, with a `latest` pointer) and swapped into
the world model's engine under a new name; the previous version is unloaded. A failed child is
reported loudly and counted; the engine keeps serving the version it had (drafts are verified
either way, so a stale adapter costs hit rate, never correctness).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time

from obsspec.models.warmstart import trajectory_examples

DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                   "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


class CoTrainer:
    def __init__(self, recipe, base_path: str, engine, predictor, out_dir: str, display):
        from obsspec.worldmodel.adapters import AdapterStore

        self.recipe, self.base_path, self.engine = recipe, base_path, engine
        self.predictor, self.display = predictor, display
        self.every = recipe.train.cotrain_every
        self.store = AdapterStore(os.path.join(out_dir, "world_model", "adapters"))
        self.work = os.path.join(out_dir, "world_model", "training")
        self.version: int | None = None     # the version serving rollouts (None = as loaded)
        self.failures = 0
        self.last_stats: dict = {}
        self._child: tuple[subprocess.Popen, int, str, float] | None = None

    # -- hooks of the rollout function -----------------------------------------------------------
    def after_rollouts(self, result) -> None:
        if result.step % self.every:
            return
        self.finish()
        rows = trajectory_examples(result.trajectories, self.recipe.wm_train.max_length)
        if not rows:
            return
        os.makedirs(self.work, exist_ok=True)
        data = os.path.join(self.work, f"step-{result.step:06d}.rows.jsonl")
        with open(data, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        out = os.path.join(self.work, f"step-{result.step:06d}.adapter")
        cfg = dataclasses.replace(self.recipe.wm_train, epochs=self.recipe.train.cotrain_epochs, max_steps=0)
        cmd = [sys.executable, "-m", "obsspec.training.cotrain", "--base", self.base_path,
               "--rows", data, "--out", out, "--config", json.dumps(dataclasses.asdict(cfg))]
        current = self.store.get(self.version) if self.version is not None else None
        if current is not None:
            cmd += ["--init", current.path]
        env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV and not k.startswith("ACCELERATE_")}
        log = open(out + ".log", "w")
        self._child = (subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT),
                       result.step, out, time.monotonic())
        log.close()

    def before_rollouts(self, step: int) -> None:
        self.finish()

    # -- the swap --------------------------------------------------------------------------------
    def finish(self) -> None:
        """Await the running child (if any), publish its adapter and swap it in."""
        if self._child is None:
            return
        proc, step, out, t0 = self._child
        self._child = None
        rc = proc.wait()
        stats_path = os.path.join(out, "stats.json")
        if rc != 0 or not os.path.exists(stats_path):
            self.failures += 1
            tail = open(out + ".log").read()[-600:] if os.path.exists(out + ".log") else ""
            self.display.log(f"world-model co-training after step {step} FAILED (exit {rc}); the "
                             f"world model keeps adapter version {self.version}. Log {out}.log:\n{tail}")
            return
        with open(stats_path) as f:
            stats = json.load(f)
        stats.update(step=step, wall_sec=round(time.monotonic() - t0, 2))
        version = self.store.publish(out, meta=stats)
        self.last_stats = stats
        self._serve(version)

    def _serve(self, version) -> None:
        old = self.predictor.adapter
        t0 = time.monotonic()
        asyncio.run(self.engine.load_adapter(version.name, version.path))
        self.predictor.adapter = version.name
        if old and old != version.name:
            asyncio.run(self.engine.unload_adapter(old))
        self.version = version.version
        self.last_stats["swap_sec"] = round(time.monotonic() - t0, 4)

    def restore(self, version: int | None) -> None:
        """After a resume: serve the version the checkpoint recorded (later ones were made by
        steps that are now redone; they stay on disk, superseded by the next publish)."""
        if version is not None:
            self._serve(self.store.get(version))

    def metrics(self) -> dict:
        s = self.last_stats
        return {"wm/version": self.version, "wm/cotrain_failures": self.failures,
                "wm/loss": s.get("train_loss"), "wm/train_sec": s.get("train_sec"),
                "wm/examples": s.get("examples"), "wm/swap_sec": s.get("swap_sec")}

    def close(self) -> None:
        if self._child is not None:
            self._child[0].kill()
            self._child[0].wait()
            self._child = None


# ---------------------------------------------------------------------------------------------
# The child process


def main(argv: list[str] | None = None) -> None:
    import argparse

    from obsspec.models.tiny import load_pretrained
    from obsspec.worldmodel.config import WorldModelTrainConfig
    from obsspec.worldmodel.train import train_adapter

    p = argparse.ArgumentParser(prog="python -m obsspec.training.cotrain",
                                description="Train one co-training adapter version (run by obsspec train).")
    p.add_argument("--base", required=True)
    p.add_argument("--rows", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--config", required=True, help="wm_train fields as JSON")
    p.add_argument("--init", default=None, help="the adapter to continue from")
    args = p.parse_args(argv)
    fields = json.loads(args.config)
    fields["target_modules"] = tuple(fields["target_modules"])
    fields["data"] = tuple(fields.get("data", ()))
    cfg = WorldModelTrainConfig(**fields)
    model, tokenizer = load_pretrained(args.base)
    with open(args.rows) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    stats = train_adapter(model, tokenizer, rows, cfg, args.out, init_adapter=args.init)
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump(stats, f)


if __name__ == "__main__":
    main()
