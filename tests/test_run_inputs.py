"""What `obsspec rollout` builds from a recipe: the engine it names, and a world model that must
share the policy's tokenizer."""

import pytest

from obsspec.config import load_recipe
from obsspec.engines.vllm import VLLMEngine
from obsspec.models.tokenizer import train_tokenizer
from obsspec.rollout.run import RolloutError, check_same_tokenizer, make_engine

TEXTS = ["ls -la /app\nfile.txt\n(exit_code=0)", "cat notes.md | sort > out.txt"] * 3


def test_a_world_model_with_another_tokenizer_is_refused():
    policy = train_tokenizer(TEXTS, vocab_size=300)
    check_same_tokenizer(policy, train_tokenizer(TEXTS, vocab_size=300), "same")
    other = train_tokenizer(["completely different words here"] * 3, vocab_size=300)
    with pytest.raises(RolloutError, match="does not use the policy's tokenizer"):
        check_same_tokenizer(policy, other, "wm/")


def test_the_engine_the_recipe_names_is_the_engine_used(tmp_path):
    train_tokenizer(TEXTS, vocab_size=300).save_pretrained(tmp_path)
    recipe = load_recipe(None, ["policy.engine=vllm", "policy.server_url=http://127.0.0.1:9"])
    engine, tokenizer = make_engine(recipe.policy, str(tmp_path))
    assert isinstance(engine, VLLMEngine) and engine.base_url == "http://127.0.0.1:9"
    assert engine.model == str(tmp_path) and tokenizer.encode("ls") == train_tokenizer(TEXTS, 300).encode("ls")
