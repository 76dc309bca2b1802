"""A recipe's working parts: the one place where a recipe becomes engines, predictors and tools.

    policy_path, wm_path = model_paths(recipe, display)          # builds the tiny kit if named
    servers = launch_servers(recipe, policy_path, wm_path, out_dir, display)  # servers.launch
    policy, tokenizer = make_engine(recipe.policy, policy_path, recipe.policy.max_batch_size)
    wm_engine = world_model_engine(recipe.world_model, wm_path, tokenizer)
    predictor = world_model_predictor(recipe, ChatFormat(tokenizer), wm_engine, adapter=None, seed=0)
    make_tool = tool_factory(recipe.sandbox, recipe.rollout.latency)

The rollout command (obsspec/rollout_run.py), training (obsspec/training/setup.py),
`train-worldmodel` (obsspec/worldmodel/run.py) and the benchmarks all build through here, so a
recipe means the same engines and predictors everywhere. Engines for evaluations and training
data, built from models already in memory, come from `obsspec.engines.hf.fast_engine`.
"""

from __future__ import annotations

import json
import os

from obsspec.config import Recipe
from obsspec.env.sandbox import SandboxConfig
from obsspec.env.suite import prepare_tasks, suite_settings
from obsspec.env.task import Task
from obsspec.progress import Display, NullDisplay
from obsspec.rollout.config import PolicyConfig, WorldModelConfig
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
        kit = kit_for(recipe, recipe.rollout.tasks_dir or os.path.join(recipe.run_dir, "tasks"), display)
        policy = kit.policy if policy == "tiny" else policy
        wm = kit.world_model if wm == "tiny" else wm
    return policy, wm


def kit_for(recipe: Recipe, tasks_dir: str, display: Display | None = None, cache_dir: str | None = None):
    """The tiny models' `KitPaths` a recipe uses: its `kit.bases` when they were built for this
    suite (obsspec/models/bases.py), else `ensure_kit` with its sections: its policy's sampling for
    the kit's rollouts, and its world model's snapshot budget when that model is the kit's."""
    from obsspec.models.kit import KitPaths, ensure_kit, workspace_tokens
    from obsspec.rollout.config import sampling

    snapshot_tokens, hint_tokens = workspace_tokens(recipe.world_model)
    display = display or NullDisplay()
    if recipe.kit.bases:
        from obsspec.models.bases import bases_dir, bases_mismatch, read_manifest

        root = bases_dir(recipe.kit.bases)
        why = bases_mismatch(read_manifest(root), tasks_dir, snapshot_tokens, recipe.policy.max_context,
                             hint_tokens)
        if why is None:
            display.log(f"tiny models: the pretrained bases at {root}")
            return KitPaths.under(root)
        display.log(f"tiny models: the pretrained bases at {root} do not fit this recipe ({why}): "
                    "building the kit")
    return ensure_kit(tasks_dir, recipe.rollout.kit_cache if cache_dir is None else cache_dir, recipe.kit,
                      recipe.sandbox, sampling(recipe.policy, recipe.rollout.seed), display,
                      snapshot_tokens=snapshot_tokens, hint_tokens=hint_tokens)


def launch_servers(recipe: Recipe, policy_path: str, wm_path: str, out_dir: str, display: Display):
    """With `servers.launch`, the recipe's vLLM servers, started and serving (logs in
    OUT_DIR/servers); else None. The caller stops them (`.stop()`)."""
    from obsspec.engines.server import Servers

    specs = server_specs_for(recipe, policy_path, wm_path) if recipe.servers.launch else []
    if not specs:
        return None
    servers = Servers(specs, os.path.join(out_dir, "servers"), display)
    servers.start()
    return servers


def server_specs_for(recipe: Recipe, policy_path: str, wm_path: str) -> list:
    """The recipe's vLLM servers (`ServerSpec`s of the sections on engine vllm), models resolved."""
    from obsspec.engines.server import server_specs

    return server_specs(recipe.policy, recipe.world_model, recipe.servers, policy_path, wm_path,
                        policy_lora_rank=recipe.train.policy_lora_rank, wm_lora_rank=recipe.wm_train.rank)


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


def world_model_engine(wm: WorldModelConfig, wm_path: str, policy_tokenizer):
    """The world model's engine as its section says, checked against the policy's tokenizer."""
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
                               adapter=adapter, seed=seed, snapshots=workspace_snapshots(fmt, wm, recipe.sandbox))


def workspace_snapshots(fmt, wm: WorldModelConfig, sandbox: SandboxConfig):
    """A builder of each task's `WorldView` (`WorkspaceSnapshots`: each task's built once, in
    `sandbox`) when the world model `wm` reads the task's workspace (`world_model.workspace_snapshot`,
    `world_model.hint_tokens`), else None."""
    if not wm.reads_workspace:
        return None
    from obsspec.worldmodel.views import WorkspaceSnapshots

    return WorkspaceSnapshots(fmt, wm.snapshot_budget, sandbox, wm.hint_tokens)


# ---------------------------------------------------------------------------------------------
# Tools


def tool_factory(sandbox: SandboxConfig, latency: EmulatedLatency | None, recorded=None):
    """(task, episode) -> Tool: a replay of `recorded` episodes (rows of a run's trajectories
    file), else a real sandbox of the `sandbox` section with `latency` added (`rollout.latency`;
    None: none)."""
    if recorded is not None:
        return lambda task, episode: ReplayTool(recorded[episode]["turns"], recorded[episode]["reward"])
    extra = latency if latency is not None else EmulatedLatency()
    return lambda task, episode: SandboxTool(task, episode, sandbox, extra)
