"""Typed recipes: YAML files loaded into frozen dataclasses, with `key=value` overrides.

    recipe = load_recipe("recipes/tiny-cpu.yaml", ["sandbox.timeout_s=5", "tasks.num_instances=50"])

- Every field is documented once, in its `help` metadata; `obsspec validate --explain` prints them.
- Unknown keys, wrong types, YAML syntax errors and missing files raise `ConfigError`, whose
  message is one line naming the file and the key; the CLI prints it and exits with code 2.
- Overrides are dot-paths; the value is parsed as a YAML scalar (`a.b=3`, `a.c=true`,
  `a.d=[x, y]`). `~a.b` resets a key to its default.
- `base: other.yaml` (a path relative to the recipe's folder) starts from that recipe: the file's
  own keys are merged over it, section by section, and a base may have a base of its own.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from obsspec.engines.server import START_CAP, ServersConfig
from obsspec.env.sandbox import SandboxConfig
from obsspec.env.suite import TasksConfig
from obsspec.fields import doc, to_dict  # to_dict: also this module's, for the recipe as plain data
from obsspec.models.config import KitConfig
from obsspec.rollout.config import PolicyConfig, RolloutConfig, WorldModelConfig
from obsspec.training.config import TrainConfig
from obsspec.worldmodel.config import WorldModelTrainConfig


class ConfigError(ValueError):
    """A problem the user can fix in a recipe or an override (one line, no traceback)."""


# ---------------------------------------------------------------------------------------------
# Recipe sections


@dataclass(frozen=True)
class Recipe:
    name: str = doc("recipe", "A name for runs of this recipe (used in run directory names).")
    run_dir: str = doc("runs", "Where commands write their run directories (unless --out is given).")
    sandbox: SandboxConfig = doc(SandboxConfig(), "Sandbox isolation and limits (see SandboxConfig).")
    tasks: TasksConfig = doc(TasksConfig(), "Task suite generation and import.")
    kit: KitConfig = doc(KitConfig(), "Research settings: how the tiny local models of the embedded "
                                      "default are built ('tiny' models only; GPU recipes never read them).")
    policy: PolicyConfig = doc(PolicyConfig(), "The policy model and how it samples.")
    world_model: WorldModelConfig = doc(WorldModelConfig(), "The world model that drafts observations.")
    rollout: RolloutConfig = doc(RolloutConfig(), "Rollouts: mode, predictor, tasks, latency.")
    train: TrainConfig = doc(TrainConfig(), "GRPO training (obsspec train): batch, optimizer, "
                                             "co-training, checkpoints.")
    wm_train: WorldModelTrainConfig = doc(WorldModelTrainConfig(), "World-model LoRA fine-tuning "
                                          "(`obsspec train-worldmodel`, and co-training).")
    servers: ServersConfig = doc(ServersConfig(), "vLLM servers (sections on engine vllm) and the "
                                                  "node's GPU layout.")

    def __post_init__(self) -> None:
        if self.name in ("", ".", "..") or "/" in self.name or "\0" in self.name:
            raise ValueError(f"name must be one word of a directory name (it names run directories), "
                             f"got {self.name!r}")
        # Cross-section checks: each names the keys to change.
        if self.policy.model == "tiny" and self.policy.max_context > self.kit.max_length:
            raise ValueError(f"policy.max_context ({self.policy.max_context}) exceeds the tiny "
                             f"models' positions (kit.max_length = {self.kit.max_length}): lower "
                             "policy.max_context or raise kit.max_length")
        wm = self.world_model  # (a tiny world model has kit.max_length + snapshot_tokens positions)
        if wm.workspace_snapshot and wm.snapshot_tokens >= self.wm_train.max_length:
            raise ValueError(f"world_model.snapshot_tokens ({wm.snapshot_tokens}) leaves no room in "
                             f"wm_train.max_length ({self.wm_train.max_length}): raise it or lower "
                             "world_model.snapshot_tokens")
        for name in ("copy_steps", "listing_steps"):
            if getattr(self.kit, name) and not wm.reads_workspace:
                raise ValueError(f"kit.{name} ({getattr(self.kit, name)}) teaches the world model to copy "
                                 "from the workspace snapshot or hints, which are off: set "
                                 "world_model.workspace_snapshot to true, world_model.hint_tokens above 0 "
                                 f"or kit.{name} to 0")
        t = self.train
        own_suite = not self.rollout.tasks_dir and not self.tasks.harbor_dir and self.tasks.families
        if own_suite and set(t.families) - set(self.tasks.families):
            raise ValueError(f"train.families {sorted(set(t.families) - set(self.tasks.families))} are not in the "
                             f"suite this recipe prepares (tasks.families {list(self.tasks.families)}): training "
                             "would find no task of them; add them to tasks.families or drop them")
        if self.servers.launch and "vllm" not in (self.policy.engine, self.world_model.engine):
            raise ValueError("servers.launch is on but no section uses engine vllm: set policy.engine "
                             "or world_model.engine to vllm, or servers.launch to false")
        start = START_CAP * self.servers.start_timeout_s  # (the servers start side by side)
        if self.servers.launch and t.collective_timeout_s < start:
            raise ValueError(f"train.collective_timeout_s ({t.collective_timeout_s:g}) is shorter than starting "
                             f"the servers may take ({START_CAP} x servers.start_timeout_s = {start:g}), which "
                             "the other processes wait for: raise train.collective_timeout_s")
        need = min_draft_tokens(self.sandbox.output_cap)
        if self.world_model.max_tokens < need:
            raise ValueError(f"world_model.max_tokens ({self.world_model.max_tokens}) cannot hold an "
                             f"observation at sandbox.output_cap = {self.sandbox.output_cap} characters: "
                             f"set it to at least {need}, or lower sandbox.output_cap")

    def check_training(self, num_processes: int = 1) -> None:
        """What `obsspec train` needs beyond a valid recipe (rollouts can do without): a
        ValueError naming the keys to change. `validate` runs it too."""
        t, pol = self.train, self.policy
        t.accumulation(num_processes)
        if pol.engine == "vllm" and not t.policy_lora_rank:
            raise ValueError("policy.engine=vllm needs train.policy_lora_rank > 0: obsspec pushes a "
                             "policy LoRA to the vLLM server before every round of rollouts, not full "
                             "weights, so full fine-tuning would roll out off-policy. Set "
                             "train.policy_lora_rank, or use policy.engine=hf (it serves the live weights)")
        if pol.temperature <= 0:
            raise ValueError("policy.temperature is 0 (greedy): every episode of a GRPO group would be "
                             "the same, so no group has signal; set policy.temperature > 0")


def min_draft_tokens(output_cap: int) -> int:
    """Draft budget for an observation at the cap: a byte-level tokenizer spends at most one token
    per ASCII character, plus room for the truncation marker, the exit code and the closing tag."""
    return output_cap + 64


# ---------------------------------------------------------------------------------------------
# Loading


def load_recipe(path: str | Path | None, overrides: list[str] = ()) -> Recipe:
    """Read a recipe file (None = all defaults) and apply `key=value` overrides."""
    data: dict = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        data = _read(Path(path), [])
    for item in overrides:
        _apply_override(data, item, where)
    return build(Recipe, data, where, "")


def _read(p: Path, chain: list[Path]) -> dict:
    """A recipe file's keys, merged over those of its `base:` (and its base's, ...)."""
    where = " <- ".join(map(str, [*chain, p]))
    if not p.is_file():
        raise ConfigError(f"{where}: recipe file not found")
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{where}: YAML syntax error{at}: {getattr(e, 'problem', e)}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a recipe") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a recipe must be a mapping of keys, not {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{where}: 'base' must be the path of another recipe, got {_short(base)}")
    parent = (p.parent / base).resolve()
    if parent in [q.resolve() for q in [*chain, p]]:
        raise ConfigError(f"{where}: 'base' makes a loop through {parent}")
    return _merge(_read(parent, [*chain, p]), data)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


_REPR = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 2, 4, 4, 4
_REPR.maxstring = _REPR.maxother = 60


def _short(value: Any) -> str:
    """A value for an error message (an aliased YAML value can expand to hundreds of MB)."""
    text = _REPR.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML keeps the last silently,
    so `sandbox.timeout_s: 5` written twice would quietly be the other value)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _check_key(path: str, where: str) -> None:
    """A dot-path must name a recipe key (a mistyped `~key` used to be ignored without a word)."""
    cls = Recipe
    for i, k in enumerate(path.split(".")):
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if k not in fields:
            prefix = ".".join(path.split(".")[:i])
            label = prefix or "recipe"
            raise ConfigError(f"{where}: unknown key '{path}' (known keys of {label}: {', '.join(sorted(fields))})"
                              if fields else f"{where}: unknown key '{path}' ({prefix} has no keys)")
        cls = typing.get_type_hints(cls)[k]


def _apply_override(data: dict, item: str, where: str) -> None:
    if item.startswith("~"):
        _check_key(item[1:], where)
        keys = item[1:].split(".")
        node = data
        for k in keys[:-1]:
            node = node.get(k, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(keys[-1], None)
        return
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value (or ~key to reset a key)")
    key, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    node = data
    keys = key.strip().split(".")
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[keys[-1]] = value


def build(cls: type, data: Any, where: str, prefix: str) -> Any:
    """Construct dataclass `cls` from a mapping, checking keys and types."""
    label = prefix.rstrip(".") or "recipe"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {label} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key '{prefix}{unknown[0]}' "
                          f"(known keys of {label}: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, where, f"{prefix}{name}")
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _coerce(tp: Any, value: Any, where: str, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where, key + ".")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, where, key)
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: '{key}' must be a list, got {_short(value)}")
        inner = typing.get_args(tp)[0]
        return tuple(_coerce(inner, v, where, key) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads `1e-3` (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):  # nan passes every `< 0` check after this
                raise ConfigError(f"{where}: '{key}' must be a finite number, got {value!r}")
            return number
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    else:
        return value
    raise ConfigError(f"{where}: '{key}' must be {tp.__name__}, got {_short(value)}")


# ---------------------------------------------------------------------------------------------
# Introspection (for `obsspec validate --explain` and logging the resolved recipe)


def user_keys() -> list[tuple[str, str, str]]:
    """The keys a user of a recipe sets: every key but those that build the tiny models (kit.*,
    read by `obsspec build-bases` and the kit; kit.bases, which names the models to use, stays)."""
    return [r for r in explain() if not r[0].startswith("kit.") or r[0] == "kit.bases"]


def explain(cls: type = Recipe, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dot-path, default, help) for every field of the recipe, nested sections included."""
    rows = []
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            rows += explain(hint, f"{prefix}{f.name}.")
            continue
        help_text = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append((prefix + f.name, repr(default), help_text))
    return rows
