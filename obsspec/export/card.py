"""The model card (README.md) and obsspec.json of an export.

`record` is obsspec.json: the command and commit that made the export, the run, the checkpoint
and how it was picked, each folder's base, dtype, size and time, the val figures and
speculation's measured figures. `model_card` renders the same facts for people, with the recipe
and how to load, serve and train on from the folders. A hub name as base goes into the card's
metadata (`base_model`); a local base folder does not (the hub would refuse it).
"""

from __future__ import annotations

import json
import os

import yaml

from obsspec.export.source import RunSource
from obsspec.provenance import commit

RECIPE_KEYS = (("policy", ("model", "temperature", "top_p", "max_turns", "max_new_tokens", "max_context",
                           "tool_format", "thinking")),
               ("world_model", ("model", "adapter", "max_tokens")),
               ("train", ("steps", "tasks_per_step", "group_size", "learning_rate", "lr_scheduler",
                          "warmup_steps", "beta", "epsilon", "epsilon_high", "loss_type",
                          "policy_lora_rank", "cotrain_every", "seed")),
               ("rollout", ("predictor", "depth")))


def record(source: RunSource, models: dict, command: str, seconds: float, out: str) -> dict:
    return {"command": command, "commit": commit(), "out": os.path.abspath(out),
            "run": os.path.abspath(source.run_dir), "recipe_name": source.recipe.get("name"),
            "checkpoint": os.path.relpath(source.checkpoint, source.run_dir), "step": source.step,
            "steps": source.steps, "run_finished": source.finished, "picked": source.picked,
            "note": source.note, "policy": models["policy"], "world_model": models["world_model"],
            "val": source.val, "speculation": source.speculation, "seconds": round(seconds, 2)}


def model_card(source: RunSource, summary: dict) -> str:
    recipe, policy, wm = source.recipe, summary["policy"], summary["world_model"]
    out = os.path.abspath(summary["out"])
    bases = [b for b in (policy.get("base"), wm.get("base")) if b and _hub_name(b)]
    lines = ["---", "library_name: transformers", "tags: [obsspec, grpo, reinforcement-learning, terminal-agent]"]
    if bases:
        lines.append(f"base_model: {bases[0]}")
    lines += ["---", "",
              f"# {recipe.get('name', 'obsspec')}: step {source.step} of {source.steps}", "",
              f"A terminal agent's policy trained with GRPO by obsspec (`obsspec train`), with observation "
              f"speculation in its rollouts, and the world model co-trained alongside it. Exported from "
              f"`{os.path.abspath(source.run_dir)}`, {os.path.relpath(source.checkpoint, source.run_dir)} "
              f"({source.picked}{'' if source.finished else '; the run did not finish'}).", "",
              "| folder | what | base | dtype | size |", "|---|---|---|---|---|"]
    for name, m in (("policy", policy), ("world_model", wm)):
        if m.get("folder"):
            lines.append(f"| `{m['folder']}/` | {m['trained']} | {_code(m.get('base'))} | {m['dtype']} | "
                         f"{m['bytes'] / 1e6:.1f} MB |")
        else:
            lines.append(f"| - | {name.replace('_', ' ')}: not exported ({m.get('why')}) | | | |")
        if m.get("adapter_folder"):
            lines.append(f"| `{m['adapter_folder']}/` | the {name.replace('_', ' ')}'s LoRA alone | "
                         f"{_code(m.get('base'))} | | |")
    lines += ["", "## Val success", ""] + _val_lines(source.val)
    lines += ["", "## Speculation, measured in training", ""] + _spec_lines(source.speculation)
    lines += ["", "## Use", "", "```bash",
              f"vllm serve {out}/policy   # an OpenAI-compatible server",
              "```", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
              f"model = AutoModelForCausalLM.from_pretrained(\"{out}/policy\")",
              f"tokenizer = AutoTokenizer.from_pretrained(\"{out}/policy\")", "```", "",
              "Train on from here, or roll out with obsspec (a recipe's model keys take the folders):", "",
              "```bash",
              f"obsspec train RECIPE policy.model={out}/policy"
              + (f" world_model.model={out}/world_model" if wm.get("folder") else "") + " --out runs/next",
              "```", "",
              "The policy's prompt layout (system prompt, tool-call form, observations) is obsspec's "
              "(docs/CHAT.md): prompt it the way its recipe did.", "",
              "## Recipe", "", "| key | value |", "|---|---|"]
    for section, keys in RECIPE_KEYS:
        for key in keys:
            if key in recipe.get(section, {}):
                lines.append(f"| `{section}.{key}` | `{json.dumps(recipe[section][key])}` |")
    lines += ["", "<details><summary>the whole resolved recipe</summary>", "", "```yaml",
              yaml.safe_dump(recipe, sort_keys=True, width=100).rstrip(), "```", "", "</details>", "",
              f"Made by `{summary['command']}` at obsspec commit `{summary['commit']}` "
              "(obsspec.json has every figure above).", ""]
    return "\n".join(lines)


def _val_lines(val: dict) -> list[str]:
    def pct(v):
        return "-" if v is None else f"{100 * v:.1f} %"

    before, at = val.get("before") or {}, val.get("at_step") or {}
    if not before and not at:
        return ["Not measured (train.eval_tasks = 0)."]
    lines = ["| | success | episodes |", "|---|---|---|",
             f"| before training (the base) | {pct(before.get('success_frac'))} | {before.get('episodes', '-')} |",
             f"| this checkpoint | {pct(at.get('success_frac'))} | {at.get('episodes', '-')} |"]
    measured = val.get("measured") or {}
    if len(measured) > 1:
        lines += ["", "Val success of every measured checkpoint: "
                  + ", ".join(f"step {s}: {pct(v)}" for s, v in measured.items()) + "."]
    kinds = at.get("success_by_kind") or {}
    if kinds:
        lines += ["", "By task kind at this checkpoint: "
                  + ", ".join(f"{k} {w}/{n}" for k, (w, n) in sorted(kinds.items())) + "."]
    if not at:
        lines += ["", "This checkpoint's own val success was not measured (train.eval_checkpoints)."]
    return lines


def _spec_lines(s: dict) -> list[str]:
    def pct(v):
        return "-" if v is None else f"{100 * v:.1f} %"

    if not s:
        return ["No step's metrics (metrics.jsonl) up to this checkpoint."]
    share = s["latency_saved_sec"] / s["rollout_sec"] if s["rollout_sec"] else None
    classes = ", ".join(f"{c} {h}/{n}" for c, (h, n) in s["wm_class_hits"].items()) or "-"
    return ["| over steps 1-%d | |" % s["steps"], "|---|---|",
            f"| hit rate (drafts that matched the real output exactly, mean over steps) | {pct(s['hit_rate_mean'])} |",
            f"| hits by source: world model / history cache / sibling episodes | "
            f"{s['hits']['wm']} / {s['hits']['cache']} / {s['hits']['sibling']} |",
            f"| world model's own hit rate (mean); by command class (hits/compared) | "
            f"{pct(s['wm_hit_rate_mean'])}; {classes} |",
            f"| speculation skipped (mean share; busy / no time / low gain / world model not worth asking) | "
            f"{pct(s['skipped_frac_mean'])}; "
            + " / ".join(str(s["skips"].get(r, 0)) for r in ("busy", "no_time", "low_gain", "wm_cost")) + " |",
            f"| committed work delayed by speculation (worst step) | {pct(s['committed_delay_frac_max'])} |",
            f"| speculative overlap with tools (an upper bound of time hidden, not a saving) | "
            f"{s['latency_saved_sec']:.1f} s of {s['rollout_sec']:.1f} s ({pct(share)}) |",
            f"| world model's last co-training loss | "
            f"{'-' if s['wm_loss_last'] is None else round(s['wm_loss_last'], 4)} |"]


def _code(text) -> str:
    return f"`{text}`" if text else "-"


def _hub_name(base: str) -> bool:
    return not os.path.isabs(base) and not base.startswith((".", "~")) and base.count("/") == 1
