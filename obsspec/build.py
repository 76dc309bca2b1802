"""A recipe's working parts: the one place where a recipe becomes engines, predictors and tools.

    policy_path, wm_path = model_paths(recipe, display)          # builds the tiny kit if named
    servers = launch_servers(recipe, policy_path, wm_path, out_dir, display)  # servers.launch
    policy, tokenizer = make_engine(recipe.policy, policy_path, recipe.policy.max_batch_size)
    wm_engine = world_model_engine(recipe, wm_path, tokenizer)
    predictor = world_model_predictor(recipe, ChatFormat(tokenizer), wm_engine, adapter=None, seed=0)
    make_tool = tool_factory(recipe, recorded=None)

The rollout command (obsspec/rollout_run.py), training (obsspec/training/setup.py),
`train-worldmodel` (obsspec/worldmodel/run.py) and the benchmarks all build through here, so a
recipe means the same engines and predictors everywhere. Engines for evaluations and training
data, built from models already in memory, come from `obsspec.engines.hf.fast_engine`.
"""

from __future__ import annotations

import json
import os

from obsspec.config import Recipe
from obsspec.rollout.config import PolicyConfig
from obsspec.env.suite import prepare_tasks, suite_settings
from obsspec.env.task import Task
from obsspec.progress import Display
from obsspec.rollout.predictors import (HistoryCache, NoPredictor, Oracle, Predictor, WithHistory,
                                        WorldModelPredictor)
from obsspec.rollout.tools import EmulatedLatency, ReplayTool, SandboxTool
from obsspec.rollout.trajectory import Trajectory


class RolloutError(ValueError):
    """A problem with the user's inputs (missing replay run, oracle without a recording, a model
    folder that is not there, a world model with another tokenizer)."""


# ---------------------------------------------------------------------------------------------
# Tasks, models and engines


async def ensure_tasks(recipe: Recipe, display: Display) -> str:
    """The recipe's prepared task suite (rollout.tasks_dir or RUN_DIR/tasks), prepared if missing."""
    tasks_dir = recipe.rollout.tasks_dir or os.path.join(recipe.run_dir, "tasks")
    if not os.path.exists(os.path.join(tasks_dir, "trajectories.jsonl")):
        display.log(f"no prepared task suite at {tasks_dir}: preparing it now")
        await prepare_tasks(recipe.tasks, recipe.sandbox, tasks_dir, display)
    elif not recipe.rollout.tasks_dir:
        # RUN_DIR/tasks is the recipe's own suite: one prepared from other tasks.* settings (another
        # recipe's, or before an override) would be used silently while recipe.json says otherwise
        manifest = os.path.join(tasks_dir, "manifest.json")
        built = None
        if os.path.exists(manifest):
            with open(manifest) as f:
                built = json.load(f).get("tasks")
        want = suite_settings(recipe.tasks)
        if built is not None and built != want:
            keys = sorted(k for k in set(built) | set(want) if built.get(k) != want.get(k))
            raise RolloutError(f"{tasks_dir} was prepared with other settings of tasks.{', tasks.'.join(keys)}: "
                               f"prepare it again (obsspec prepare-tasks RECIPE --out {tasks_dir}), or name a "
                               "suite with rollout.tasks_dir")
    return tasks_dir


def model_paths(recipe: Recipe, display: Display) -> tuple[str, str]:
    """Policy and world-model locations; builds the tiny kit when either is 'tiny'."""
    policy, wm = recipe.policy.model, recipe.world_model.model
    for section, name in (("policy", policy), ("world_model", wm)):
        # a local folder that is not there fails now, not after minutes of kit build
        if name.startswith(("/", "./", "../", "~")) and not os.path.isdir(os.path.expanduser(name)):
            raise RolloutError(f"{section}.model: no model folder at {name}")
    if "tiny" in (policy, wm):
        from obsspec.models.kit import kit_for

        kit = kit_for(recipe, recipe.rollout.tasks_dir or os.path.join(recipe.run_dir, "tasks"), display)
        policy = kit.policy if policy == "tiny" else policy
        wm = kit.world_model if wm == "tiny" else wm
    return policy, wm


def launch_servers(recipe: Recipe, policy_path: str, wm_path: str, out_dir: str, display: Display):
    """With `servers.launch`, the recipe's vLLM servers, started and serving (logs in
    OUT_DIR/servers); else None. The caller stops them (`.stop()`)."""
    from obsspec.engines.server import Servers, server_specs

    specs = server_specs(recipe, policy_path, wm_path) if recipe.servers.launch else []
    if not specs:
        return None
    servers = Servers(specs, os.path.join(out_dir, "servers"), display)
    servers.start()
    return servers


def make_engine(cfg, path: str, max_batch_size: int = 32, **hf_options):
    """(engine, tokenizer) for a policy or world-model section: the engine the recipe names
    (`hf_options`: the world model's `WorldModelConfig.hf_options`, for the hf engine)."""
    if cfg.engine == "vllm":
        from transformers import AutoTokenizer

        from obsspec.engines.vllm import VLLMEngine, VLLMServerError

        # (a world model's drafts are all committed work of their own server: no priorities)
        priority = isinstance(cfg, PolicyConfig) and cfg.priority_scheduling
        engine = VLLMEngine(cfg.server_url, path, priority_scheduling=priority)
        try:
            engine.check_model()  # the served name must be the model's string exactly
        except VLLMServerError as e:
            section = "policy" if isinstance(cfg, PolicyConfig) else "world_model"
            raise RolloutError(f"{section}.server_url {cfg.server_url}: {e}") from None
        return engine, AutoTokenizer.from_pretrained(path)
    from obsspec.engines.hf import HFEngine
    from obsspec.models.tiny import load_pretrained

    model, tokenizer = load_pretrained(path, device=cfg.device)
    return HFEngine(model, tokenizer, batch_invariant=cfg.batch_invariant,
                    max_batch_size=max_batch_size, device=cfg.device, **hf_options), tokenizer


def world_model_engine(recipe: Recipe, wm_path: str, policy_tokenizer):
    """The world model's engine as the recipe says, checked against the policy's tokenizer."""
    wm = recipe.world_model
    engine, tokenizer = make_engine(wm, wm_path, **wm.hf_options)
    check_same_tokenizer(policy_tokenizer, tokenizer, wm_path)
    return engine


def check_same_tokenizer(policy_tokenizer, wm_tokenizer, wm_path: str) -> None:
    """Exact match compares token ids: the world model must share the policy's tokenizer."""
    if policy_tokenizer.get_vocab() != wm_tokenizer.get_vocab():
        raise RolloutError(f"the world model ({wm_path}) does not use the policy's tokenizer: "
                           "drafts are compared token for token, so both must share one vocabulary")


# ---------------------------------------------------------------------------------------------
# Predictors


def predictor_for(recipe: Recipe, fmt, wm_engine, episodes: list[Task],
                  recorded: list[Trajectory] | None = None, adapter: str | None = None) -> Predictor:
    """The predictor `rollout.predictor` names. `recorded`: trajectories of the same `episodes`
    (a sequential run, or a replayed one), which the oracle answers from; `adapter`: the world
    model's loaded adapter, or None."""
    kind = recipe.rollout.predictor
    if kind == "none":
        return NoPredictor()
    if kind == "history":
        return HistoryCache()
    if kind == "oracle":
        if not recorded:
            raise RolloutError("rollout.predictor=oracle needs recorded observations: use "
                               "--mode both (it records the sequential run) or --replay RUN_DIR")
        return Oracle([(task.content_hash(), [t.command for t in tr.turns if t.kind == "bash"],
                        [t.observation for t in tr.turns if t.kind == "bash"])
                       for task, tr in zip(episodes, recorded)])
    predictor = world_model_predictor(recipe, fmt, wm_engine, adapter, recipe.rollout.seed)
    return WithHistory(predictor) if kind == "tiered" else predictor


def world_model_predictor(recipe: Recipe, fmt, wm_engine, adapter: str | None, seed: int):
    """The recipe's world model as a predictor (`adapter`: the loaded adapter's name, or None);
    with `world_model.workspace_snapshot` or `hint_tokens`, it reads each task's `WorldView`
    (`predictor.snapshots.prefixes(trajectories)` gives co-training the same views)."""
    wm = recipe.world_model
    return WorldModelPredictor(wm_engine, fmt, cap=recipe.sandbox.output_cap, max_tokens=wm.max_tokens,
                               breadth=recipe.rollout.breadth,
                               adapter=adapter, seed=seed, snapshots=workspace_snapshots(fmt, recipe))


def workspace_snapshots(fmt, recipe: Recipe):
    """A builder of each task's `WorldView` (`WorkspaceSnapshots`: each task's built once) when
    the recipe's world model reads the task's workspace (`world_model.workspace_snapshot`,
    `world_model.hint_tokens`), else None."""
    wm = recipe.world_model
    if not wm.reads_workspace:
        return None
    from obsspec.worldmodel.views import WorkspaceSnapshots

    return WorkspaceSnapshots(fmt, wm.snapshot_budget, recipe.sandbox, wm.hint_tokens)


# ---------------------------------------------------------------------------------------------
# Tools


def tool_factory(recipe: Recipe, recorded, latency: bool = True):
    """(task, episode) -> Tool: a replay of `recorded` episodes (rows of a run's trajectories
    file), else a real sandbox with the recipe's emulated latency (`latency=False`: without it)."""
    if recorded is not None:
        return lambda task, episode: ReplayTool(recorded[episode]["turns"], recorded[episode]["reward"])
    extra = recipe.rollout.latency if latency else EmulatedLatency()
    return lambda task, episode: SandboxTool(task, episode, recipe.sandbox, extra)
