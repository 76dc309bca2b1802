"""The tiny training run, with world-model co-training on and off, in one invocation.

    .venv/bin/python bench/train_tiny.py [--recipe recipes/tiny-cpu.yaml] [--out runs/bench-train]
        [--variants cotrain,no_cotrain] [--plot bench/results/train_tiny.png] [key=value ...]

Each variant is a real `obsspec train` run (a child process) on the same task suite, the same
kit and the same seeds; only `train.cotrain_every` differs (the recipe's vs 0). The policy's episodes are
therefore the same token for token in both (speculation is lossless; the world model changes only
the time) until a tool prints something different the second time (`token_identity` says at
which step, and whether the first difference is in an observation — the tool — or in an action,
which would be a bug); the hit-rate curves show what co-training adds. Tool latency is the recipe's EMULATED remote-sandbox latency (labelled in the output).
Prints one JSON object: per variant the per-step reward, success and hit rate, the mean reward
of the first and last third of the steps, val success before/after, the share of rollout time
hidden by speculation, and wall times; the baseline for the hit rate is the no-co-training run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = {"cotrain": [], "no_cotrain": ["train.cotrain_every=0"]}  # cotrain: the recipe's cadence


def run_variant(recipe: str, out: str, overrides: list[str]) -> dict:
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "obsspec", "train", recipe, *overrides, "--out", out, "--display", "plain"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if x.strip()]
    summary = json.load(open(os.path.join(out, "summary.json")))
    return {"wall_sec": round(time.monotonic() - t0, 1),
            "reward": [r.get("reward") for r in rows],
            "success": [r.get("success_frac") for r in rows],
            "hit_rate": [r.get("spec/exact_frac") for r in rows],
            "cache_hits": [r.get("cache/hits") for r in rows],
            "wm_version": [r.get("wm/version") for r in rows],
            "latency_saved_frac": [r.get("latency_saved_frac") for r in rows],
            "step_sec": [r.get("step_time") for r in rows],
            **{k: summary.get(k) for k in ("reward_first_third", "reward_last_third", "hit_rate_mean",
                                           "latency_saved_sec", "latency_saved_frac", "eval")}}


def token_identity(a_dir: str, b_dir: str) -> dict:
    """Step by step, are the two runs' episodes token-identical? The first difference is either
    in an observation (a tool printed something else: the runs then legitimately diverge) or in
    an action (a losslessness bug)."""
    import glob

    from obsspec.rollout_run import compare
    from obsspec.rollout.trajectory import Trajectory

    def load(d, step):
        path = glob.glob(os.path.join(d, "rollouts", f"step-{step:06d}", "trajectories-*.jsonl"))[0]
        return [Trajectory.from_dict(json.loads(x)) for x in open(path) if x.strip()]

    step = 1
    while glob.glob(os.path.join(a_dir, "rollouts", f"step-{step:06d}")):
        c = compare(load(a_dir, step), load(b_dir, step))
        if not c["token_identical"]:
            return {"identical_steps": step - 1, "first_difference_step": step,
                    "first_in_observation": c["differing_first_in_observation"],
                    "first_in_action": c["differing_first_in_action"]}
        step += 1
    return {"identical_steps": step - 1, "first_difference_step": None}


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in result["variants"].items():
        steps = range(1, len(r["reward"]) + 1)
        a.plot(steps, r["reward"], marker=".", label=name)
        b.plot(steps, [h if h is not None else float("nan") for h in r["hit_rate"]], marker=".", label=name)
    a.set(title="mean reward per step", xlabel="step", ylabel="reward")
    b.set(title="hit rate per step (spec/exact_frac)", xlabel="step", ylim=(0, 1.05))
    for ax in (a, b):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"obsspec train {result['recipe']} ({result['latency']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", default="recipes/tiny-cpu.yaml")
    p.add_argument("--out", default="runs/bench-train")
    p.add_argument("--variants", default="cotrain,no_cotrain")
    p.add_argument("--plot", default="")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    from obsspec.config import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    if "cotrain" in args.variants.split(",") and recipe.train.cotrain_every == 0:
        raise SystemExit("the cotrain variant needs train.cotrain_every > 0 in the recipe or the overrides")
    lat = recipe.rollout.latency
    result = {"recipe": args.recipe, "overrides": args.overrides,
              "latency": f"EMULATED {lat.kind} median {lat.median_s}s" if lat.kind != "none" else "no emulated latency",
              "variants": {}}
    for name in args.variants.split(","):
        out = os.path.join(args.out, name)
        if os.path.exists(out):
            raise SystemExit(f"{out} exists: remove it or choose another --out")
        result["variants"][name] = run_variant(args.recipe, out, [*args.overrides, *VARIANTS[name]])
        print(json.dumps({"variant": name, **result["variants"][name]}), flush=True)
    v = result["variants"]
    if "cotrain" in v and "no_cotrain" in v:
        result["hit_rate_gain_over_no_cotrain"] = (
            (v["cotrain"]["hit_rate_mean"] or 0) - (v["no_cotrain"]["hit_rate_mean"] or 0))
        result["same_rewards"] = v["cotrain"]["reward"] == v["no_cotrain"]["reward"]
        result["token_identity"] = token_identity(os.path.join(args.out, "cotrain"),
                                                  os.path.join(args.out, "no_cotrain"))
    print(json.dumps(result, indent=2))
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
