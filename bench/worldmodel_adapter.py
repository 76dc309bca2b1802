"""World-model adapter: base vs LoRA adapter exact-match on held-out rollout steps, draft vs tool
latency, adapter size and swap time, all measured in one run.

    nice -n 10 .venv/bin/python bench/worldmodel_adapter.py --kit .cache/kit/kit-XXXX --tasks runs/tasks
        [--episodes-per-task 2] [--max-steps 120] [--eval-limit 150] [--draft-tokens 512]
        [--extra-data KIT/rollouts.jsonl] [--snapshot off|on|both]
        [--out result.json] [--plot out.png] [wm_train.key=value ...]

1. The kit's warm policy rolls out on the suite's val tasks (real sandboxes, the recipe's policy
   sampling; cached as OUT.rollouts.jsonl). The kit's world-model base never saw these episodes.
2. Split by task instance (wm_train.eval_fraction, default here 0.5): the adapter trains on the
   rollouts of one half (`train_adapter`, the recipe's wm_train section), both models are judged
   on the steps of the other half (`evaluate_models`: the rollout's predictor and `ChatFormat.draft_hits`).
3. Latency: mean greedy draft time (4 drafts in flight, as in a rollout batch) against the tool
   time recorded on the same steps (real sandbox) and against the recipe's emulated remote
   latency (rollout.latency) added on top: the "at the embedded recipe's tool latency" ratio.
4. Swap: `HFEngine.load_adapter` of the new version onto the served base, idle engine, median of 5.
5. `--snapshot both`: the same with each task's workspace snapshot ahead of the world model's
   context (world_model.workspace_snapshot; budget world_model.snapshot_tokens): a second adapter
   trained on the same rows with the snapshot, all four models judged on the same held-out steps
   (those that still fit the tiny model's positions); `snapshot.comparison` in the JSON gives
   exact-match points and draft-latency ratios (on / off) per command class; `--plot X.png` also
   draws X-snapshot.png.
Targets (issue 10): adapter >= base + 10 points and >= 60 % exact; drafts >= 16x faster than the
tool; swap < 1 s. Prints JSON; `--plot` draws hit rate per command class, base vs adapter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time


def rollouts(kit: str, tasks_dir: str, recipe, per_task: int, path: str):
    from obsspec.engines.hf import fast_engine
    from obsspec.env.suite import load_tasks
    from obsspec.rollout.batch import rollout_tasks
    from obsspec.models.tiny import load_pretrained
    from obsspec.rollout.config import sampling
    from obsspec.rollout.trajectory import Trajectory
    from obsspec.tokens import ChatFormat

    if os.path.exists(path):
        with open(path) as f:
            return [Trajectory.from_dict(json.loads(line)) for line in f], None
    tasks = [t for t in load_tasks(os.path.join(tasks_dir, "val.jsonl")) for _ in range(per_task)]
    model, tokenizer = load_pretrained(os.path.join(kit, "policy"))
    t0 = time.monotonic()

    async def run():
        async with fast_engine(model, tokenizer) as engine:
            return await rollout_tasks(engine, ChatFormat(tokenizer), tasks, recipe.sandbox,
                                       sampling(recipe.policy, recipe.rollout.seed), concurrency=8)

    trajectories = asyncio.run(run())
    with open(path, "w") as f:
        f.writelines(json.dumps(tr.to_dict(), sort_keys=True) + "\n" for tr in trajectories)
    return trajectories, round(time.monotonic() - t0, 1)


async def swap_seconds(model, tokenizer, path: str, reps: int = 5) -> float:
    from obsspec.engines.hf import HFEngine

    times = []
    async with HFEngine(model, tokenizer) as engine:
        for _ in range(reps):
            t0 = time.monotonic()
            await engine.load_adapter("wm", path)
            times.append(time.monotonic() - t0)
    return round(statistics.median(times), 4)


def emulated_mean(latency) -> float:
    if latency.kind == "none":
        return 0.0
    if latency.kind == "fixed":
        return latency.median_s
    return latency.median_s * math.exp(latency.sigma ** 2 / 2)  # lognormal mean


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base, ad = result["eval"]["base"], result["eval"]["adapter"]
    classes = sorted(base["per_class"])
    x = range(len(classes))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for off, (label, r) in zip((-0.2, 0.2), (("base", base), ("adapter", ad))):
        ax.bar([i + off for i in x], [100 * (r["per_class"][c]["exact_frac"] or 0) for c in classes], 0.4,
               label=f"{label} ({100 * r['exact_frac']:.0f} % overall)")
    ax.set_xticks(list(x), [f"{c}\n({base['per_class'][c]['steps']})" for c in classes])
    ax.set_ylabel("exact match, %")
    ax.axhline(60, color="grey", ls=":", lw=1)
    ax.set_title("world model on held-out rollout steps (steps per class in brackets)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def snapshot_comparison(variants: dict) -> dict:
    """With the snapshot against without, per command class: exact-match points gained and the
    draft-latency ratio (on / off), base and adapter each."""
    out = {}
    for model in ("base", "adapter"):
        off, on = variants["off"]["eval"][model], variants["on"]["eval"][model]
        per_class = {}
        for c in sorted(set(off["per_class"]) | set(on["per_class"])):
            a, b = off["per_class"].get(c, {}), on["per_class"].get(c, {})
            ta, tb = off["per_class_draft_sec_mean"].get(c), on["per_class_draft_sec_mean"].get(c)
            per_class[c] = {
                "steps": b.get("steps", a.get("steps")),
                "exact_off": a.get("exact_frac"), "exact_on": b.get("exact_frac"),
                "exact_points": None if a.get("exact_frac") is None or b.get("exact_frac") is None
                else round(100 * (b["exact_frac"] - a["exact_frac"]), 1),
                "draft_sec_off": ta, "draft_sec_on": tb,
                "draft_sec_ratio_on_over_off": round(tb / ta, 3) if ta and tb else None,
            }
        out[model] = {
            "exact_off": off["exact_frac"], "exact_on": on["exact_frac"],
            "exact_points": round(100 * ((on["exact_frac"] or 0) - (off["exact_frac"] or 0)), 1),
            "unusable_off": off["unusable_frac"], "unusable_on": on["unusable_frac"],
            "draft_sec_off": off["draft_sec_mean"], "draft_sec_on": on["draft_sec_mean"],
            "draft_sec_ratio_on_over_off": round(on["draft_sec_mean"] / off["draft_sec_mean"], 3)
            if off["draft_sec_mean"] and on["draft_sec_mean"] else None,
            "per_class": per_class,
        }
    return out


def plot_snapshot(comparison: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
    for ax, (model, r) in zip(axes, comparison.items()):
        classes = sorted(r["per_class"])
        x = range(len(classes))
        for off, key in ((-0.2, "off"), (0.2, "on")):
            ax.bar([i + off for i in x], [100 * (r["per_class"][c][f"exact_{key}"] or 0) for c in classes], 0.4,
                   label=f"snapshot {key} ({100 * (r[f'exact_{key}'] or 0):.0f} % overall)")
        ax.set_xticks(list(x), [f"{c}\n({r['per_class'][c]['steps']})" for c in classes])
        ax.set_title(f"{model}: exact match on held-out rollout steps")
        ax.set_ylabel("exact match, %")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kit", required=True, help="a tiny model kit folder (policy/, world_model/)")
    p.add_argument("--tasks", required=True, help="the prepared suite the kit was built from")
    p.add_argument("--recipe", default="recipes/tiny-cpu.yaml")
    p.add_argument("--episodes-per-task", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=120)
    p.add_argument("--eval-limit", type=int, default=150)
    p.add_argument("--draft-tokens", type=int, default=512)
    p.add_argument("--extra-data", action="append", default=[], metavar="SOURCE",
                   help="more training sources (e.g. the kit's rollouts.jsonl: train-split tasks, "
                        "disjoint from the val tasks evaluated); repeatable")
    p.add_argument("--out", default="worldmodel_adapter.json")
    p.add_argument("--plot", default="")
    p.add_argument("--snapshot", choices=["off", "on", "both"], default="off",
                   help="the world model reads each task's workspace snapshot ahead of its context "
                        "(world_model.snapshot_tokens): off, on, or both (an adapter trained and "
                        "both models judged each way, on the same steps; JSON ratios per class)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)

    from obsspec.config import load_recipe
    from obsspec.env.suite import load_tasks, spread
    from obsspec.models.tiny import load_pretrained
    from obsspec.tokens import ChatFormat
    from obsspec.worldmodel import data
    from obsspec.worldmodel.evaluate import evaluate_models, gain
    from obsspec.worldmodel.train import train_adapter

    recipe = load_recipe(args.recipe, [f"wm_train.max_steps={args.max_steps}", "wm_train.eval_fraction=0.5",
                                       *args.overrides])
    cfg = recipe.wm_train
    trajectories, rollout_sec = rollouts(args.kit, args.tasks, recipe, args.episodes_per_task,
                                         args.out + ".rollouts.jsonl")
    model, tokenizer = load_pretrained(os.path.join(args.kit, "world_model"))
    fmt = ChatFormat(tokenizer)
    episodes = [data.Episode(tr.task_id, "rollouts", trajectory=tr) for tr in trajectories]
    train_eps, held_eps = data.split_by_task(episodes, cfg.eval_fraction, cfg.seed)
    extra = data.load_episodes(args.extra_data) if args.extra_data else []
    variants = ["off", "on"] if args.snapshot == "both" else [args.snapshot]
    table = None
    if "on" in variants:
        from obsspec.worldmodel.views import WorkspaceSnapshots

        tasks = {t.task_id: t for t in load_tasks(args.tasks)}  # train.jsonl + val.jsonl
        t0 = time.monotonic()
        table = data.snapshot_table(train_eps + extra + held_eps, tasks,
                                    WorkspaceSnapshots(fmt, recipe.world_model.snapshot_tokens, recipe.sandbox))
        snapshot_sec = round(time.monotonic() - t0, 1)
    runs = {}
    for v in variants:
        snaps = table if v == "on" else None
        rows, counts = data.examples(fmt, train_eps + extra, cfg.max_length, snaps)
        cases, dup = data.eval_cases(fmt, held_eps, snaps)
        runs[v] = {"rows": rows, "counts": counts, "cases": cases, "dup": dup}
    # The same held-out steps for every variant; with the snapshot, those whose longer prompt
    # still leaves the tiny model positions to draft in.
    room = recipe.kit.max_length - 64 if table is not None else 10**9
    n = len(runs[variants[0]]["cases"])
    assert all(len(r["cases"]) == n for r in runs.values()), "the variants cut different steps"
    keep = [i for i in range(n) if all(len(r["cases"][i].prompt_ids) <= room for r in runs.values())]
    keep = spread(keep, min(args.eval_limit, len(keep)))
    for r in runs.values():
        r["cases"] = [r["cases"][i] for i in keep]
    results, adapters = {}, {}
    for v in variants:  # train every adapter first, then judge them all back to back (timings)
        r = runs[v]
        print(json.dumps({"snapshot": v, "rollouts": len(trajectories), "rollout_sec": rollout_sec,
                          "train": r["counts"], "held_out_steps": len(r["cases"])}), file=sys.stderr)
        out_dir = args.out + (".adapter" if v == "off" else ".adapter-snapshot")
        model, tokenizer = load_pretrained(os.path.join(args.kit, "world_model"))
        stats = train_adapter(model, tokenizer, r["rows"], cfg, out_dir, display=None)
        print(json.dumps({"snapshot": v, "train": stats}), file=sys.stderr)
        swap = asyncio.run(swap_seconds(model, tokenizer, out_dir))
        adapters[v] = out_dir
        results[v] = {"train_data": r["counts"], "train": stats, "swap_sec_median": swap,
                      "duplicate_steps_removed": r["dup"]}
    for v in variants:
        model, tokenizer = load_pretrained(os.path.join(args.kit, "world_model"))  # a fresh base to serve
        ev = evaluate_models(model, tokenizer, runs[v]["cases"], {"base": None, "adapter": adapters[v]},
                             cap=recipe.sandbox.output_cap, max_tokens=args.draft_tokens,
                             hf_options=recipe.world_model.hf_options)
        results[v].update(eval=ev, gain=gain(ev["base"], ev["adapter"]))
    first = results[variants[0]]
    counts, stats, ev, swap, dup, cases = (first["train_data"], first["train"], first["eval"],
                                           first["swap_sec_median"], first["duplicate_steps_removed"],
                                           runs[variants[0]]["cases"])
    emulated = emulated_mean(recipe.rollout.latency)
    result = {
        "command": " ".join(["bench/worldmodel_adapter.py", *(argv or sys.argv[1:])]),
        "kit": args.kit, "rollout_episodes": len(trajectories), "rollout_sec": rollout_sec,
        "split": {"train_tasks": len({e.task_id for e in train_eps}),
                  "held_out_tasks": len({e.task_id for e in held_eps}),
                  "held_out_steps": len(cases), "duplicate_steps_removed": dup},
        "extra_data": args.extra_data, "train_data": counts, "train": stats, "eval": ev, "gain": gain(ev["base"], ev["adapter"]),
        "draft_tokens_cap": args.draft_tokens, "swap_sec_median": swap,
        "emulated_tool_latency_mean_s": round(emulated, 3),
    }
    if args.snapshot != "off":
        result["snapshot"] = {"variants": variants, "snapshot_tokens": recipe.world_model.snapshot_tokens,
                              "snapshot_build_sec": snapshot_sec, "tasks": len(table),
                              "mean_snapshot_tokens": round(sum(map(len, table.values())) / len(table), 1),
                              "runs": {v: results[v] for v in variants}}
        if len(variants) == 2:
            result["snapshot"]["comparison"] = snapshot_comparison(results)
    for label in ("base", "adapter"):
        r = ev[label]
        tool = (r["tool_sec_mean"] or 0) + emulated
        result[f"{label}_tool_with_emulated_over_draft"] = round(tool / r["draft_sec_mean"], 2) \
            if r["draft_sec_mean"] else None
    a = ev["adapter"]["exact_frac"] or 0
    result["targets"] = {
        "gain_ge_10_points": (result["gain"]["exact_points"] or 0) >= 10,
        "adapter_ge_60_percent": a >= 0.6,
        "drafts_ge_16x_faster": (result["adapter_tool_with_emulated_over_draft"] or 0) >= 16,
        "swap_lt_1s": swap < 1.0,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
    if args.plot:
        plot(result, args.plot)
        if len(variants) == 2:
            plot_snapshot(result["snapshot"]["comparison"], os.path.splitext(args.plot)[0] + "-snapshot.png")
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
