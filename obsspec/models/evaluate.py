"""How well a policy solves validation tasks: real sandbox episodes, sequential turns.

Run: python -m obsspec.models.evaluate TASKS_DIR [kit.key=value ...] [--cache .cache/kit]
     [--policies untrained,warm] [--world-model kit] [--recipe recipes/tiny-cpu.yaml] [--limit N]
     [--out eval.json]

The kit (built if missing) follows the recipe's `kit` section and the overrides.

Per episode: the prompt (obsspec/tokens.py), then up to `task.max_turns` turns of: generate an
action (HFEngine, stop on <|im_end|>; greedy unless a temperature is given, then seeded by
(task, turn)), parse it, and on `bash` run it in the task's sandbox and append its observation,
on `done` stop, on a malformed call append the fixed error observation. An episode also stops
when its tokens reach `max_tokens` (the model's positions). The verifier gives the reward.
Episodes run concurrently (asyncio) and share the engine, which batches their generations.
Commands run with the sandbox's own timeout (a `timeout` parameter of the call is ignored here).

`--world-model` also scores a world model on the val reference trajectories: for every step, a
greedy draft from `wm_prompt_ids(history, action)` (stop at the closing tag, 256 tokens at most),
normalised like a real observation and compared with the real body, exactly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from obsspec import chat
from obsspec.engines.base import GenerationRequest
from obsspec.env.episode import observation, start_sandbox
from obsspec.env.sandbox import SandboxConfig, SandboxError
from obsspec.env.task import Task
from obsspec.tokens import ChatFormat
from obsspec.ui.display import Display, NullDisplay


@dataclass(frozen=True)
class EvalSettings:
    max_action_tokens: int = 192  # per turn
    max_tokens: int = 2048  # per episode (prompt included)
    temperature: float = 0.0
    workers: int = 4  # concurrent episodes


@dataclass
class EpisodeOutcome:
    task_id: str
    reward: float | None  # None: the sandbox failed (excluded from the rates)
    actions: list[str] = field(default_factory=list)  # kinds: bash / done / error
    errors: list[str] = field(default_factory=list)  # the parse error of each malformed action
    first_command: str | None = None
    first_command_is_reference: bool = False
    first_program_is_reference: bool = False  # same first word (ls, find, head ...)
    tokens: int = 0
    infra_error: str = ""


def turn_seed(task_id: str, turn: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{task_id}/{turn}".encode()).digest()[:4], "big")


async def run_episode(engine: Any, fmt: ChatFormat, task: Task, sandbox_config: SandboxConfig,
                      settings: EvalSettings) -> EpisodeOutcome:
    out = EpisodeOutcome(task.task_id, None)
    ids = fmt.prompt_ids(task.instruction)
    try:
        sandbox = await start_sandbox(task, sandbox_config)
    except SandboxError as e:
        out.infra_error = f"setup: {e}"
        return out
    try:
        for turn in range(task.max_turns):
            budget = min(settings.max_action_tokens, settings.max_tokens - len(ids))
            if budget < 1:
                break
            gen = await engine.generate(GenerationRequest(
                prompt_ids=ids, max_new_tokens=budget, temperature=settings.temperature,
                seed=turn_seed(task.task_id, turn), stop_token_ids=fmt.stop_token_ids))
            ids += gen.token_ids
            action = fmt.parse_action(gen.token_ids)
            out.actions.append(action.kind)
            if action.kind == "done":
                break
            if action.kind == "error":
                out.errors.append(action.error)
                obs, _ = fmt.error_observation_ids(action.error)
            else:
                if out.first_command is None:
                    out.first_command = action.command
                    reference = task.solution[0] if task.solution else ""
                    out.first_command_is_reference = action.command == reference
                    out.first_program_is_reference = action.command.split()[:1] == reference.split()[:1]
                result = await sandbox.run(action.command)
                obs, _ = fmt.observation_ids(observation(result, sandbox_config))
            ids += obs
        out.reward = await sandbox.verify(task.verify, task.verify_files)
    except SandboxError as e:
        out.infra_error = str(e)
    finally:
        await sandbox.close()
        out.tokens = len(ids)
    return out


async def evaluate_policy(engine: Any, fmt: ChatFormat, tasks: list[Task], sandbox_config: SandboxConfig,
                          settings: EvalSettings = EvalSettings(), display: Display | None = None,
                          label: str = "evaluating") -> dict:
    """Success rates of the policy behind `engine` on `tasks`; see `summarize`."""
    display = display or NullDisplay()
    gate = asyncio.Semaphore(settings.workers)

    async def one(task: Task) -> EpisodeOutcome:
        async with gate:
            outcome = await run_episode(engine, fmt, task, sandbox_config, settings)
        display.advance(1)
        return outcome

    display.start(len(tasks), label)
    t0 = time.monotonic()
    try:
        outcomes = await asyncio.gather(*(one(t) for t in tasks))
    finally:
        display.finish()
    return {**summarize(outcomes), "sec": round(time.monotonic() - t0, 1),
            "episodes": [asdict(o) for o in outcomes]}


def summarize(outcomes: list[EpisodeOutcome]) -> dict:
    scored = [o for o in outcomes if o.reward is not None]
    actions = [kind for o in scored for kind in o.actions]
    n = len(scored)
    return {
        "tasks": len(outcomes), "infra_errors": len(outcomes) - n,
        "mean_reward": round(sum(o.reward for o in scored) / n, 4) if n else None,
        "success_frac": round(sum(o.reward == 1.0 for o in scored) / n, 4) if n else None,
        "actions": len(actions),
        "parse_valid_frac": round(sum(k != "error" for k in actions) / len(actions), 4) if actions else None,
        "done_called_frac": round(sum("done" in o.actions for o in scored) / n, 4) if n else None,
        "first_command_reference_frac":
            round(sum(o.first_command_is_reference for o in scored) / n, 4) if n else None,
        "first_program_reference_frac":
            round(sum(o.first_program_is_reference for o in scored) / n, 4) if n else None,
        "mean_turns": round(len(actions) / n, 2) if n else None,
    }


# ---------------------------------------------------------------------------------------------


async def evaluate_world_model(engine: Any, fmt: ChatFormat, trajectories: list[dict], cap: int,
                               max_new_tokens: int = 256, display: Display | None = None) -> dict:
    """Greedy drafts of a world model for every step of reference trajectories, compared with the
    real body after the same normalisation a real observation gets (exact string = exact ids)."""
    display = display or NullDisplay()
    cases = []
    for row in trajectories:
        history = fmt.prompt_ids(row["instruction"])
        for step in row["steps"]:
            action = fmt.action_ids(chat.render_bash(step["command"]))
            cases.append((fmt.wm_prompt_ids(history, action), step["observation"]))
            history = history + action + fmt.observation_ids(step["observation"])[0]

    async def one(prompt: list[int], body: str) -> tuple[bool, bool, bool]:
        gen = await engine.generate(GenerationRequest(
            prompt_ids=prompt, max_new_tokens=max_new_tokens, temperature=0.0,
            stop_token_ids=fmt.wm_stop_token_ids, stop_strings=fmt.wm_stop_strings))
        draft = chat.split_draft(fmt.decode(gen.token_ids))
        display.advance(1)
        exact = draft is not None and chat.normalize_draft(draft, cap=cap) == body
        return draft is not None, exact, body.startswith(chat.NO_OUTPUT + "\n")

    display.start(len(cases), "world model drafts")
    try:
        results = await asyncio.gather(*(one(p, b) for p, b in cases))
    finally:
        display.finish()
    quiet = [r for r in results if r[2]]
    loud = [r for r in results if not r[2]]
    frac = lambda rs, i: round(sum(r[i] for r in rs) / len(rs), 4) if rs else None  # noqa: E731
    return {"steps": len(results), "finished_frac": frac(results, 0), "exact_frac": frac(results, 1),
            "no_output_steps": len(quiet), "exact_frac_no_output": frac(quiet, 1),
            "exact_frac_with_output": frac(loud, 1)}


def _policy(which: str, paths: Any, cfg: Any):
    from obsspec.models import tiny

    if which == "warm":
        return tiny.load_pretrained(paths.policy)
    if which == "untrained":  # the same random initialisation the warm start began from
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(paths.tokenizer)
        return tiny.build_model(cfg.policy, tokenizer, cfg.max_length, cfg.seed).eval(), tokenizer
    return tiny.load_pretrained(which)  # a folder or a hub name


async def _main_async(args) -> dict:
    from obsspec.config import load_recipe
    from obsspec.engines.hf import HFEngine
    from obsspec.env.suite import load_tasks
    from obsspec.models.kit import ensure_kit
    from obsspec.ui.display import make_display

    display = make_display(args.display)
    recipe = load_recipe(args.recipe, args.overrides)
    tasks = load_tasks(f"{args.tasks_dir}/val.jsonl")[: args.limit or None]
    names = [n for n in args.policies.split(",") if n]
    paths = ensure_kit(args.tasks_dir, args.cache, recipe.kit, display) \
        if {"untrained", "warm"} & set(names) or args.world_model == "kit" else None
    settings = EvalSettings(temperature=args.temperature, workers=args.workers,
                            max_tokens=recipe.kit.max_length)
    results = {"command": " ".join(["python -m obsspec.models.evaluate", *args.argv]),
               "kit": paths.root if paths else None, "settings": asdict(settings)}
    for which in names:
        model, tokenizer = _policy(which, paths, recipe.kit)
        async with HFEngine(model, tokenizer) as engine:
            r = await evaluate_policy(engine, ChatFormat(tokenizer), tasks, recipe.sandbox, settings,
                                      display, f"policy {which}")
        results[which] = r
        display.log(f"{which}: " + json.dumps({k: v for k, v in r.items() if k != "episodes"}))
    if args.world_model:
        from obsspec.models.kit import read_trajectories
        from obsspec.models.tiny import load_pretrained

        rows = [r for r in read_trajectories(args.tasks_dir) if r.get("split") == "val"][: args.limit or None]
        where = paths.world_model if args.world_model == "kit" else args.world_model
        model, tokenizer = load_pretrained(where)
        async with HFEngine(model, tokenizer) as engine:
            results["world_model"] = await evaluate_world_model(
                engine, ChatFormat(tokenizer), rows, recipe.sandbox.output_cap, display=display)
        display.log("world model: " + json.dumps(results["world_model"]))
    return results


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m obsspec.models.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("tasks_dir", help="a prepared task suite; its val.jsonl is evaluated")
    p.add_argument("overrides", nargs="*", help="recipe overrides, e.g. kit.policy.epochs=2")
    p.add_argument("--cache", default=".cache/kit", help="kit cache (built if missing)")
    p.add_argument("--policies", default="untrained,warm",
                   help="comma-separated: untrained, warm, or a model folder / hub name")
    p.add_argument("--world-model", default="", help="also score greedy drafts of a world model on the "
                   "val reference steps: 'kit' (the kit's base) or a model folder / hub name")
    p.add_argument("--recipe", default="recipes/tiny-cpu.yaml", help="recipe whose sandbox settings apply")
    p.add_argument("--limit", type=int, default=0, help="evaluate only the first N val tasks (0 = all)")
    p.add_argument("--workers", type=int, default=4, help="concurrent episodes")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--out", default="", help="write the full results (with episodes) here as JSON")
    p.add_argument("--display", default="auto", choices=["auto", "rich", "plain", "none"])
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    results = asyncio.run(_main_async(args))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    brief = {k: ({kk: vv for kk, vv in v.items() if kk != "episodes"} if isinstance(v, dict) else v)
             for k, v in results.items()}
    print(json.dumps(brief, indent=2))


if __name__ == "__main__":
    main()
