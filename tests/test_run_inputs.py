"""What `obsspec rollout` builds from a recipe: the engine it names, and a world model that must
share the policy's tokenizer."""

import pytest

from obsspec.config import load_recipe
from obsspec.engines.vllm import VLLMEngine
from obsspec.models.tokenizer import train_tokenizer
from obsspec.build import RolloutError, check_same_tokenizer, make_engine

TEXTS = ["ls -la /app\nfile.txt\n(exit_code=0)", "cat notes.md | sort > out.txt"] * 3


def test_a_world_model_with_another_tokenizer_is_refused():
    policy = train_tokenizer(TEXTS, vocab_size=300)
    check_same_tokenizer(policy, train_tokenizer(TEXTS, vocab_size=300), "same")
    other = train_tokenizer(["completely different words here"] * 3, vocab_size=300)
    with pytest.raises(RolloutError, match="does not use the policy's tokenizer"):
        check_same_tokenizer(policy, other, "wm/")


def test_the_engine_the_recipe_names_is_the_engine_used(tmp_path):
    from fakes import VLLMProtocolServer

    train_tokenizer(TEXTS, vocab_size=300).save_pretrained(tmp_path)
    with VLLMProtocolServer(None, str(tmp_path)) as server:  # (its /v1/models only)
        recipe = load_recipe(None, ["policy.engine=vllm", f"policy.server_url={server.url}"])
        engine, tokenizer = make_engine(recipe.policy, str(tmp_path))
        assert isinstance(engine, VLLMEngine) and engine.base_url == server.url
        assert engine.model == str(tmp_path) and tokenizer.encode("ls") == train_tokenizer(TEXTS, 300).encode("ls")
        # the served name must be the model's string exactly: both names in one line
        with pytest.raises(RolloutError, match=f"does not serve '{tmp_path}/'; it serves \\['{tmp_path}'\\]"):
            make_engine(recipe.policy, f"{tmp_path}/")
    with pytest.raises(RolloutError, match="policy.server_url .*: .*cannot reach the vLLM server"):
        make_engine(recipe.policy, str(tmp_path))


def test_the_recipes_own_suite_must_match_its_tasks_settings(tmp_path):
    """RUN_DIR/tasks prepared from other tasks.* settings was used silently."""
    import asyncio
    import json

    from obsspec.env.suite import suite_settings
    from obsspec.build import ensure_tasks
    from obsspec.progress import NullDisplay

    recipe = load_recipe("recipes/tiny-cpu.yaml", [f"run_dir={tmp_path}"])
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "trajectories.jsonl").write_text("")
    manifest = tmp_path / "tasks" / "manifest.json"
    manifest.write_text(json.dumps({"tasks": suite_settings(recipe.tasks)}))
    assert asyncio.run(ensure_tasks(recipe, NullDisplay())) == str(tmp_path / "tasks")
    manifest.write_text(json.dumps({"tasks": {**suite_settings(recipe.tasks), "num_instances": 7}}))
    with pytest.raises(RolloutError, match="other settings of tasks.num_instances"):
        asyncio.run(ensure_tasks(recipe, NullDisplay()))
    named = load_recipe("recipes/tiny-cpu.yaml", [f"rollout.tasks_dir={tmp_path / 'tasks'}"])
    assert asyncio.run(ensure_tasks(named, NullDisplay())) == str(tmp_path / "tasks"), "a suite named is the user's choice"


def test_a_model_folder_that_is_not_there_fails_before_the_kit_is_built(tmp_path):
    """`policy.model=/nonexistent` failed only after the tiny kit's minutes-long build (the world
    model was still tiny)."""
    from obsspec.build import model_paths
    from obsspec.progress import NullDisplay

    recipe = load_recipe("recipes/tiny-cpu.yaml", [f"policy.model={tmp_path / 'nope'}", f"run_dir={tmp_path}"])
    with pytest.raises(RolloutError, match="policy.model: no model folder at"):
        model_paths(recipe, NullDisplay())
