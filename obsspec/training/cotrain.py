"""World-model co-training: a new LoRA adapter version after every k policy steps.

After a step's rollouts, its fresh (context -> real observation) pairs — the rollouts' own token
ids, loss on observation bodies + closing tags (`warmstart.trajectory_examples`; an episode past
`wm_train.max_length` in windows that keep each observation whole, obsspec/windows.py) — train the
adapter further, continuing from the version in use (the first one from the recipe's
`world_model.adapter` when it names one, else a fresh adapter on the base). Training runs in one long-lived worker
process (`python -m obsspec.training.cotrain`), which imports the libraries and loads the base
model once and then trains one adapter per job: it runs alongside the policy's GRPO update instead
of after it, and it is its own single-process job even when the trainer is distributed. Before the
next step's rollouts the job is awaited, its adapter published as a new version
(obsspec/worldmodel/adapters.py `AdapterStore`: atomic, with a `latest` pointer) and swapped into
the world model's engine under a new name; the previous version is unloaded, and versions past
`train.keep_adapter_versions` are deleted (never the one serving or one a complete checkpoint
records: obsspec/training/retention.py), as are the job's rows and adapter. A failed job or a
dead worker is reported loudly and counted (a dead worker is restarted for the next job); the
engine keeps serving the version it had (drafts are verified either way, so a stale adapter costs
hit rate, never correctness).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

from obsspec.models.warmstart import trajectory_examples
from obsspec.training.retention import recorded_versions

DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                   "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


class Worker:
    """The co-training process, seen from the trainer: one JSON job per line on its stdin, one
    JSON reply per line on its stdout; its logs go to `log_path`."""

    def __init__(self, base_path: str, log_path: str, gpu: str = ""):
        env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV and not k.startswith("ACCELERATE_")}
        if gpu:  # servers.cotrain_gpu: its own GPU of the layout (obsspec/training/plan.py)
            env["CUDA_VISIBLE_DEVICES"] = gpu
        self.log_path = log_path
        with open(log_path, "a") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "obsspec.training.cotrain", "--base", base_path],
                                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, text=True)

    def submit(self, job: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except OSError:  # a dead worker: `reply` reports it with the end of its log
            pass

    def reply(self) -> dict:
        """The running job's reply; a worker that died says so, with the end of its log."""
        for line in iter(self.proc.stdout.readline, ""):
            try:
                reply = json.loads(line)
            except ValueError:
                reply = None
            if isinstance(reply, dict) and "ok" in reply:
                return reply
            # printed before the worker moved stdout to its log (transformers' import prints a
            # line when WANDB_MODE=offline): the log's, not a reply
            with open(self.log_path, "a") as log:
                log.write(line)
        rc = self.proc.wait()
        with open(self.log_path) as f:
            tail = f.read()[-600:]
        return {"ok": False, "dead": True, "error": f"the co-training worker exited ({rc}):\n{tail}"}

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class CoTrainer:
    def __init__(self, wm_train, train, base_path: str, engine, predictor, out_dir: str, display,
                 initial: str | None = None, gpu: str = ""):
        """`wm_train`, `train`: the recipe's sections (the adapter's training; `cotrain_every`,
        `cotrain_epochs`, `keep_adapter_versions`); `initial`: the adapter the run started with
        (`world_model.adapter`), which the first version continues from, None = a fresh adapter on
        the base; `gpu`: `servers.cotrain_gpu`, the worker's GPU ("" = the default device)."""
        from obsspec.worldmodel.adapters import AdapterStore

        self.wm_train, self.train, self.gpu = wm_train, train, gpu
        self.base_path, self.engine, self.initial = base_path, engine, initial
        self.predictor, self.display = predictor, display
        self.every = train.cotrain_every
        self.store = AdapterStore(os.path.join(out_dir, "world_model", "adapters"))
        self.checkpoints = os.path.join(out_dir, "checkpoints")
        self.work = os.path.join(out_dir, "world_model", "training")
        self.version: int | None = None     # the version serving rollouts (None = as loaded)
        self.failures = 0
        self.last_stats: dict = {}
        self._worker: Worker | None = None
        self._job: tuple[int, str, float] | None = None   # (step, adapter dir, start time)

    # -- hooks of the rollout function -----------------------------------------------------------
    def after_rollouts(self, result) -> None:
        if result.step % self.every:
            return
        self.finish()
        snapshots = getattr(self.predictor, "snapshots", None)  # world_model.workspace_snapshot
        prefixes = snapshots.prefixes(result.trajectories) if snapshots is not None else None
        # an episode longer than wm_train.max_length trains in windows, each target whole
        rows = trajectory_examples(result.trajectories, self.wm_train.max_length, prefixes, cut=True)
        if not rows:  # every call malformed (or every target too long): nothing real to learn from
            if self.display is not None:
                served = f"v{self.version}" if self.version is not None else "the one loaded"
                self.display.log(f"world model: step {result.step} has no observation to train on; "
                                 f"the adapter in use stays {served}")
            return
        os.makedirs(self.work, exist_ok=True)
        data = os.path.join(self.work, f"step-{result.step:06d}.rows.jsonl")
        with open(data, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        self.start(result.step, data)

    def before_rollouts(self, step: int) -> None:
        self.finish()

    def start(self, step: int, rows_path: str) -> None:
        """Hand the worker one job: train the next version on `rows_path`."""
        out = os.path.join(self.work, f"step-{step:06d}.adapter")
        cfg = dataclasses.replace(self.wm_train, epochs=self.train.cotrain_epochs, max_steps=0)
        current = self.store.get(self.version) if self.version is not None else None
        job = {"rows": rows_path, "out": out, "config": dataclasses.asdict(cfg),
               "init": current.path if current is not None else self.initial}
        os.makedirs(self.work, exist_ok=True)
        if self._worker is None:
            self._worker = Worker(self.base_path, os.path.join(self.work, "worker.log"), self.gpu)
        self._worker.submit(job)
        self._job = (step, out, time.monotonic())

    # -- the swap --------------------------------------------------------------------------------
    def finish(self) -> None:
        """Await the running job (if any), publish its adapter and swap it in."""
        if self._job is None:
            return
        step, out, t0 = self._job
        self._job = None
        reply = self._worker.reply()
        if reply.get("dead"):
            self._worker.close()
            self._worker = None   # restarted for the next job
        try:
            if not reply.get("ok"):
                self.failures += 1
                self.display.log(f"world-model co-training after step {step} FAILED; the world model keeps "
                                 f"adapter version {self.version}. {reply.get('error', '')}")
                return
            stats = dict(reply["stats"], step=step, wall_sec=round(time.monotonic() - t0, 2))
            version = self.store.publish(out, meta=stats)
        finally:  # the job's files: ~0.1 GB a step at 256 episodes of 32k tokens
            shutil.rmtree(out, ignore_errors=True)
            _remove(out.removesuffix(".adapter") + ".rows.jsonl")
        self.last_stats = stats
        self._serve(version)
        self.store.prune(self.train.keep_adapter_versions,
                         protect={self.version} | recorded_versions(self.checkpoints))

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
        self._job = None
        if self._worker is not None:
            self._worker.proc.kill()
            self._worker.close()
            self._worker = None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# ---------------------------------------------------------------------------------------------
# The worker process


def main(argv: list[str] | None = None) -> None:
    import argparse
    import traceback

    p = argparse.ArgumentParser(prog="python -m obsspec.training.cotrain",
                                description="The world-model co-training worker (started by obsspec train): "
                                            "reads one JSON job per line on stdin, trains that adapter, "
                                            "writes one JSON reply per line.")
    p.add_argument("--base", required=True, help="the world model's base (a model folder)")
    args = p.parse_args(argv)
    # Replies go through a private copy of stdout; whatever the libraries print goes to the log.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    from obsspec.models.tiny import load_pretrained
    from obsspec.worldmodel.config import WorldModelTrainConfig
    from obsspec.worldmodel.train import train_adapter

    model, tokenizer = load_pretrained(args.base)
    for line in sys.stdin:
        try:
            job = json.loads(line)
            fields = dict(job["config"])
            fields["target_modules"] = tuple(fields["target_modules"])
            with open(job["rows"]) as f:
                rows = [json.loads(x) for x in f if x.strip()]
            stats = train_adapter(model, tokenizer, rows, WorldModelTrainConfig(**fields), job["out"],
                                  init_adapter=job["init"])
            reply = {"ok": True, "stats": stats}
        except Exception:  # reported to the trainer, which keeps its adapter and counts the failure
            error = traceback.format_exc()
            print(error, file=sys.stderr, flush=True)
            reply = {"ok": False, "error": error[-800:]}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
