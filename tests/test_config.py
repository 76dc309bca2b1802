"""Recipes: typed loading, overrides, and one clear line for every mistake a user can make."""

import glob
import os

import pytest

from obsspec.config import ConfigError, Recipe, explain, load_recipe, to_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "recipes", "*.yaml"))))
def test_every_shipped_recipe_validates(path):
    recipe = load_recipe(path)
    assert isinstance(recipe, Recipe) and recipe.name


def test_shipped_recipes_exist():
    assert os.path.exists(os.path.join(ROOT, "recipes", "tiny-cpu.yaml"))


def test_overrides_apply_with_types():
    r = load_recipe(None, ["sandbox.timeout_s=5", "tasks.families=[csv-filter, awk-sum]",
                           "tasks.determinism_check=false", "name=x"])
    assert r.sandbox.timeout_s == 5.0 and isinstance(r.sandbox.timeout_s, float)
    assert r.tasks.families == ("csv-filter", "awk-sum")
    assert r.tasks.determinism_check is False and r.name == "x"


def test_reset_override_restores_default(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("sandbox:\n  timeout_s: 3\n")
    assert load_recipe(p).sandbox.timeout_s == 3
    assert load_recipe(p, ["~sandbox.timeout_s"]).sandbox.timeout_s == Recipe().sandbox.timeout_s


@pytest.mark.parametrize("text, overrides, message", [
    ("sandbox:\n  timout_s: 3\n", [], "unknown key 'sandbox.timout_s'"),
    ("sandbox:\n  timeout_s: soon\n", [], "'sandbox.timeout_s' must be float, got 'soon'"),
    ("tasks:\n  builtin: 3\n", [], "'tasks.builtin' must be bool"),
    ("tasks: [1, 2]\n", [], "tasks must be a mapping"),
    ("sandbox:\n  timeout_s: 3\n bad: [\n", [], "YAML syntax error (line"),
    ("- a\n- b\n", [], "a recipe must be a mapping"),
    ("", ["tasks.val_fraction=1.5"], "tasks.val_fraction must be in [0, 1)"),
    ("", ["tasks.cheat_audit=maybe"], "tasks.cheat_audit must be one of drop, flag, off"),
    ("", ["sandbox.isolation=docker"], "sandbox.isolation must be 'bwrap' or 'none'"),
    ("", ["sandbox.timeout_s=-1"], "sandbox.timeout_s must be a positive number"),
    ("", ["nonsense"], "expected key=value"),
    ("", ["tasks.num_instances=many"], "'tasks.num_instances' must be int"),
    # nan passed every range check; a repeated key was silent
    ("", ["policy.temperature=nan"], "'policy.temperature' must be a finite number"),
    ("", ["sandbox.timeout_s=inf"], "'sandbox.timeout_s' must be a finite number"),
    ("sandbox:\n  timeout_s: 5\n  timeout_s: 30\n", [], "key 'timeout_s' appears twice"),
    ("", ["name=x/../../../tmp/escaped"], "name must be one word of a directory name"),
    ("", ["policy.max_turns=0"], "policy.max_turns must be >= 1"),
    ("", ["policy.top_p=-3"], "policy.top_p in (0, 1]"),
    ("", ["rollout.concurrency=-4"], "rollout.concurrency must be >= 0"),
    ("", ["rollout.busy_limit=-1"], "rollout.busy_limit must be >= 0"),
    ("", ["rollout.gate_cost_share=-0.5"], "rollout.gate_cost_share must be between 0 and 10"),
    ("", ["rollout.gate=maybe"], "rollout.gate"),
    ("", ["rollout.pairs=0"], "rollout.pairs must be >= 1"),
    ("", ["policy.priority_scheduling=true"], "policy.priority_scheduling is for engine vllm"),
    ("", ["rollout.predictor=siblings"], "rollout.predictor must be tiered, world_model"),
    ("", ["sandbox.hostname="], "sandbox.hostname must be a host name"),
    ("", ["sandbox.harbor_services=sometimes"], "sandbox.harbor_services must be auto, live or stopped"),
    ("", ["sandbox.turn_seconds=-100"], "sandbox.turn_seconds must be in 0.."),
    # vLLM's processed logprobs are renormalised over the nucleus: the importance ratio would be off
    ("", ["policy.engine=vllm", "policy.server_url=http://127.0.0.1:8000", "policy.top_p=0.9"],
     "policy.top_p = 0.9 with engine vllm"),
    ("", ["servers.launch=true"], "servers.launch is on but no section uses engine vllm"),
    ("", ["servers.world_model_gpus=gpu2"], "servers.world_model_gpus must be GPU indices"),
    ("", ["policy.model=Qwen/Qwen3-8B", "policy.tool_format=JSON"], "policy.tool_format must be xml or json (got 'JSON')"),
    ("policy:\n  thinking: maybe\n", [], "'policy.thinking' must be bool, got 'maybe'"),
    ("", ["policy.thinking=2"], "'policy.thinking' must be bool"),
    # the tiny kit's policy was trained on one layout only
    ("", ["policy.tool_format=json"], "the tiny kit's policy was trained with policy.tool_format xml"),
    ("", ["policy.thinking=off"], "and policy.thinking on"),
])
def test_mistakes_are_one_clear_line_naming_file_and_key(tmp_path, text, overrides, message):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_recipe(p, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)
    if not overrides or "=" in overrides[0]:
        assert str(p) in str(e.value) or overrides


def test_missing_recipe_file():
    with pytest.raises(ConfigError, match="recipe file not found"):
        load_recipe("/nonexistent/recipe.yaml")


def test_every_field_is_documented():
    rows = explain()
    assert len(rows) > 10
    undocumented = [key for key, _, text in rows if not text]
    assert undocumented == []


def test_explain_lists_what_users_set_and_the_kit_apart():
    from typer.testing import CliRunner

    from obsspec.cli import app

    listed = CliRunner().invoke(app, ["validate", "--explain"]).stdout
    keys = [line.split()[0] for line in listed.splitlines() if line[:1].isalpha()]
    assert "policy.temperature" in keys and "kit.bases" in keys, "a key users set is missing"
    assert not [k for k in keys if k.startswith("kit.") and k != "kit.bases"], "kit.* builds the tiny models"
    kit = CliRunner().invoke(app, ["validate", "--explain", "--kit"]).stdout
    assert "kit.policy.hidden_size" in kit and "policy.temperature" not in kit
    assert len(keys) + len(kit.splitlines()) == len(explain()), "every key is listed once, here or there"


def test_to_dict_round_trips():
    r = load_recipe(None, ["tasks.families=[a]"])
    import yaml
    assert to_dict(r)["tasks"]["families"] == ["a"]
    assert yaml.safe_dump(to_dict(r))


@pytest.mark.parametrize("override, words", [
    ("policy.max_context=4096", ["policy.max_context (4096)", "kit.max_length = 2048"]),
    ("world_model.max_tokens=256", ["world_model.max_tokens (256)", "at least 2112"]),
    ("policy.engine=vllm", ["policy.engine=vllm needs policy.server_url"]),
    ("world_model.engine=tgi", ["world_model.engine must be hf or vllm"]),
    ("world_model.prompt_lookup=-1", ["world_model.prompt_lookup must be between 0 and 256"]),
    ("world_model.prefix_cache_tokens=-1", ["world_model.prefix_cache_tokens must be >= 0"]),
    ("world_model.prefix_cache_tokens=10", ["at least one 64-token block"]),
    ("kit.world_model_tasks=-5", ["kit.world_model_tasks", "must be >= 0"]),
    ("kit.mistakes=-1", ["kit.mistakes must be >= 0"]),
    ("kit.copy_steps=-1", ["kit.copy_steps must be >= 0"]),
    ("kit.copy_steps=100 world_model.hint_tokens=0", ["kit.copy_steps (100)", "world_model.workspace_snapshot"]),
    ("kit.digits_per_token=4", ["kit.digits_per_token must be 1, 2 or 3"]),
])
def test_cross_section_mistakes_are_one_line_naming_the_keys(override, words):
    with pytest.raises(ConfigError) as e:
        load_recipe(os.path.join(ROOT, "recipes", "tiny-cpu.yaml"), override.split())
    message = str(e.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_prompt_lookup_is_refused_for_a_vllm_world_model():
    with pytest.raises(ConfigError, match="prompt_lookup is the hf engine's"):
        load_recipe(os.path.join(ROOT, "recipes", "terminal-8b.yaml"), ["world_model.prompt_lookup=8"])


def test_a_hub_policy_is_not_held_to_the_tiny_models_positions():
    r = load_recipe(None, ["policy.model=Qwen/Qwen3-8B", "policy.max_context=32768"])
    assert r.policy.max_context == 32768


def test_hostile_recipe_files_are_one_short_line(tmp_path):
    """An alias bomb of 576 bytes made a 580 MB error message; non-UTF-8 bytes and deep nesting
    were tracebacks."""
    levels = ["  - &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("name:\n" + "\n".join(levels) + "\n")  # a list of 10 million x's, as a name
    for path, text, message in ((bomb, None, "'name' must be str"), (tmp_path / "latin1.yaml", b"name: caf\xe9\n", "not UTF-8"),
                                (tmp_path / "deep.yaml", "[" * 20000, "")):
        if text is not None:
            path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_recipe(path, [])
        assert message in str(e.value) and len(str(e.value)) < 400, str(e.value)[:200]


def test_a_recipe_can_start_from_a_base(tmp_path):
    (tmp_path / "base.yaml").write_text("name: big\nsandbox:\n  timeout_s: 7\n  output_cap: 1000\n"
                                        "world_model:\n  max_tokens: 1064\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\nname: small\nsandbox:\n  timeout_s: 3\n")
    rec = load_recipe(tmp_path / "child.yaml", ["sandbox.memory_mb=512"])
    assert (rec.name, rec.sandbox.timeout_s, rec.sandbox.output_cap, rec.sandbox.memory_mb) == ("small", 3.0, 1000, 512)
    (tmp_path / "base.yaml").write_text("base: child.yaml\n")
    with pytest.raises(ConfigError, match="makes a loop"):
        load_recipe(tmp_path / "child.yaml")
    (tmp_path / "child.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml: recipe file not found"):
        load_recipe(tmp_path / "child.yaml")


def test_the_32b_recipe_is_the_8b_recipe_with_a_larger_policy():
    small, large = (to_dict(load_recipe(f"recipes/terminal-{n}.yaml")) for n in ("8b", "32b"))
    differ = {(section, key) for section, values in small.items() if isinstance(values, dict)
              for key in values if values[key] != large[section][key]}
    assert differ == {("policy", "model"), ("train", "micro_batch_size")}, differ


def test_train_families_must_be_in_the_suite_the_recipe_prepares():
    with pytest.raises(ConfigError, match=r"train.families \['csv-filter'\] are not in the suite"):
        load_recipe("recipes/tiny-cpu.yaml", ["train.families=[csv-filter]"])
    # another suite (rollout.tasks_dir) is not the recipe's own: its families are its own
    load_recipe("recipes/tiny-cpu.yaml", ["train.families=[csv-filter]", "rollout.tasks_dir=elsewhere"])


def test_one_group_size_for_training_and_the_rollout_command():
    """rollout.group_size and train.group_size said the same thing twice (and could disagree)."""
    with pytest.raises(ConfigError, match="unknown key 'rollout.group_size'"):
        load_recipe("recipes/tiny-cpu.yaml", ["rollout.group_size=3"])
    assert load_recipe("recipes/tiny-cpu.yaml", ["train.group_size=3", "train.tasks_per_step=2",
                                                 "train.micro_batch_size=6"]).train.group_size == 3


def test_the_chat_layout_keys():
    default = load_recipe(None)
    assert (default.policy.thinking, default.policy.tool_format) == (True, "xml"), "the tiny kit's layout"
    r = load_recipe(None, ["policy.model=Qwen/Qwen3-8B", "policy.tool_format=json", "policy.thinking=off"])
    assert r.policy.chat_layout == {"thinking": False, "tool_format": "json"}
    for name in ("8b", "32b"):  # set on purpose, not by default
        gpu = load_recipe(os.path.join(ROOT, "recipes", f"terminal-{name}.yaml"))
        assert gpu.policy.chat_layout == {"thinking": False, "tool_format": "json"}
