"""World-model training at a GPU recipe's scale: long episodes train in windows that keep each
observation whole, the SFT loss scores the labelled tokens in chunks, micro-batches accumulate,
and the tiny recipes' co-training rows are what they were.

Run: .venv/bin/python -m pytest -q tests/test_wm_rows.py
"""

import hashlib
import json
import os

import pytest
import torch

from obsspec import windows
from obsspec.config import load_recipe
from obsspec.rollout.trajectory import Trajectory
from obsspec.tokens import ChatFormat, WorldView

BASES = os.path.join(os.path.dirname(__file__), "..", "obsspec", "bases", "tiny-cpu")


def row_of(spans: list[tuple[int, int]], length: int, head: int = 0) -> dict:
    """A row of `length` tokens (ids = positions) with targets at `spans` after a head of `head`."""
    mask = [0] * length
    for a, b in spans:
        mask[head + a:head + b] = [1] * (b - a)
    return {"input_ids": list(range(length)), "completion_mask": mask}


# ---------------------------------------------------------------------------------------------
# Windows


def test_a_row_within_the_budget_is_left_as_it_is():
    row = row_of([(3, 5)], 10)
    assert windows.fit(row, 10) == ([row], 0)
    assert windows.fit(row_of([], 10), 10) == ([], 0), "no target, no row"


@pytest.mark.parametrize("head", [0, 7])
def test_a_long_row_trains_every_target_once_whole_with_half_the_budget_of_context(head):
    # 32 turns: a 40-token action, then a target of 10..90 tokens and 6 tokens around it
    spans, at = [], 50
    for turn in range(32):
        at += 40
        size = 10 + (turn * 37) % 80
        spans.append((at, at + size))
        at += size + 6
    spans.append((at, at + 300))            # one observation longer than the budget: dropped
    length = head + at + 300 + 5
    row = row_of(spans, length, head)
    budget = 256
    got, dropped = windows.fit(row, budget, head)
    assert dropped == 1
    room, trained = budget - head, []
    for w in got:
        ids, mask = w["input_ids"], w["completion_mask"]
        assert len(ids) <= budget and ids[:head] == list(range(head)) and not any(mask[:head])
        body = ids[head:]
        start = body[0] - head
        assert body == list(range(head + start, head + start + len(body))), "a contiguous stretch of the episode"
        assert mask[-1] == 1, "a window ends where a target ends"
        for a, b in windows.targets(mask[head:]):
            s, e = start + a, start + b
            assert (s, e) in spans, "a target is trained whole"
            assert start == 0 or s - start >= room // 2 or e == start + len(body), "half the budget as context"
            trained.append((s, e))
    assert sorted(trained) == spans[:-1], "every target that fits, exactly once"
    tokens = sum(len(w["input_ids"]) for w in got)
    assert tokens < 2.5 * length, f"windows overlap by about half, not one per target ({tokens} tokens)"


def test_a_head_that_leaves_no_room_is_an_error():
    with pytest.raises(ValueError, match="no room"):
        windows.fit(row_of([(1, 2)], 100), 64, head=64)


# ---------------------------------------------------------------------------------------------
# Co-training rows


@pytest.fixture(scope="module")
def fmt():
    from transformers import AutoTokenizer

    recipe = load_recipe("recipes/tiny-cpu.yaml")
    return ChatFormat(AutoTokenizer.from_pretrained(os.path.join(BASES, "tokenizer")), **recipe.policy.chat_layout)


def tiny_episode(fmt, i: int, turns: int = 3, body_lines: int = 6) -> Trajectory:
    """An episode in the tiny recipe's shape: its instruction, `turns` bash calls and outputs."""
    tr = Trajectory.start(i, f"count-lines-{i:05d}", fmt.prompt_ids(f"How many lines has /app/data/f{i}.txt?"))
    for turn in range(turns):
        action = fmt.action_ids(fmt.render_bash(f"wc -l data/f{i}.txt | head -{turn + 1}"))
        tr.append_action(action, [-0.25] * len(action))
        body = "".join(f"{n * (i + 1)} data/f{i}-{turn}.txt\n" for n in range(body_lines)) + "\n(exit_code=0)"
        ids, span = fmt.observation_ids(body)
        tr.append_observation(ids, span, len(fmt.obs_close_ids))
    done = fmt.action_ids(fmt.render_done())
    tr.append_action(done, [-0.1] * len(done))
    return tr


class _Snapshots:
    """Each task's world view: a snapshot ahead, a hint after each call (as tiny-cpu's hints)."""

    def __init__(self, fmt):
        self.fmt = fmt

    def prefixes(self, trajectories):
        return [WorldView(tuple(range(5, 5 + (tr.episode % 3) * 4)), self.fmt,
                          lambda command: self.fmt.encode_text(f"[{command[:12]}]"))
                for tr in trajectories]


def cotrain_rows(fmt, tmp_path, trajectories, *overrides) -> list[dict]:
    from obsspec.training.cotrain import CoTrainer
    from obsspec.training.rollouts import StepRollouts

    recipe = load_recipe("recipes/tiny-cpu.yaml", ["train.cotrain_every=1", *overrides])
    predictor = type("P", (), {"adapter": None, "snapshots": _Snapshots(fmt)})()
    co = CoTrainer(recipe.wm_train, recipe.train, "unused", None, predictor, str(tmp_path), None)
    got = []
    co.start = lambda step, path: got.extend(json.loads(line) for line in open(path))
    co.after_rollouts(StepRollouts(1, trajectories, {}))
    return got


# The rows co-training wrote for these episodes before long episodes were cut into windows
# (sha256 of their JSON): the tiny recipes' rows all fit wm_train.max_length, and stay as they were.
TINY_ROWS = "0e967b59b53b01afe18c3763532d95cf66f4af0c6613948fa264f529361cb15e"


def test_the_tiny_recipes_cotraining_rows_are_what_they_were(fmt, tmp_path):
    episodes = [tiny_episode(fmt, i, turns=1 + i % 3, body_lines=2 + 3 * i) for i in range(12)]
    rows = cotrain_rows(fmt, tmp_path, episodes)
    assert len(rows) == 12 and max(len(r["input_ids"]) for r in rows) <= 2048
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == TINY_ROWS


def test_an_episode_past_wm_train_max_length_trains_in_windows(fmt, tmp_path):
    """Before: dropped whole (no row at all). Now: windows, every observation in one of them."""
    long = tiny_episode(fmt, 1, turns=3, body_lines=90)
    whole = cotrain_rows(fmt, tmp_path / "whole", [long], "wm_train.max_length=100000")[0]
    budget = len(whole["input_ids"]) * 2 // 3
    rows = cotrain_rows(fmt, tmp_path / "cut", [long], f"wm_train.max_length={budget}")
    assert len(rows) >= 2 and all(len(r["input_ids"]) <= budget for r in rows)
    targets = [tuple(r["input_ids"][a:b]) for r in rows for a, b in windows.targets(r["completion_mask"])]
    expected = [tuple(whole["input_ids"][a:b]) for a, b in windows.targets(whole["completion_mask"])]
    assert sorted(targets) == sorted(expected), "each observation trained once, whole"
    head = len(_Snapshots(fmt).prefixes([long])[0].prefix)
    assert all(r["input_ids"][:head] == whole["input_ids"][:head] for r in rows), "the snapshot heads every window"


def test_train_worldmodel_data_cuts_long_episodes_and_counts_them(fmt):
    from obsspec.worldmodel.data import Episode, examples

    episodes = [Episode(f"t{i}", "x", trajectory=tiny_episode(fmt, i, turns=3, body_lines=n))
                for i, n in enumerate((3, 90))]
    whole, counts = examples(fmt, episodes, max_length=100000)
    assert counts["cut"] == 0 and len(whole) == 2
    longest = max(b - a for a, b in windows.targets(whole[1]["completion_mask"]))
    budget = max(len(whole[0]["input_ids"]) + 10, 2 * longest)
    assert len(whole[1]["input_ids"]) > budget
    rows, counts = examples(fmt, episodes, max_length=budget)
    assert counts["cut"] == 1 and counts["too_long"] == 0 and counts["examples"] == len(rows) >= 3
    rows, counts = examples(fmt, episodes, max_length=longest - 1)
    assert counts["too_long"] >= 1, "an observation longer than the budget alone is dropped and counted"


# ---------------------------------------------------------------------------------------------
# The loss in chunks, micro-batches


def _tiny_lm(vocab=512):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, head_dim=16, intermediate_size=64,
                                        tie_word_embeddings=True, dtype="float32"))


def test_the_loss_in_chunks_is_the_loss_and_keeps_no_full_logits(monkeypatch):
    from obsspec.models import warmstart

    model = _tiny_lm()
    ids = torch.randint(0, 512, (2, 300))
    labels = ids.clone()
    labels[:, :40] = -100
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    def run():
        model.zero_grad()
        saved = []
        keep = lambda t: saved.append(t.numel() if t.shape[-1:] == (512,) else 0) or t  # noqa: E731
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            nll, hits, count = warmstart.masked_nll(model, batch)
        nll.backward()
        return nll.item(), hits, count, [p.grad.clone() for p in model.parameters()], max(saved)

    whole = run()
    monkeypatch.setattr(warmstart, "LOGITS_CHUNK_BYTES", 4 * 512 * 64)   # 64 positions a chunk
    chunked = run()
    assert chunked[1:3] == whole[1:3] and abs(chunked[0] - whole[0]) < 1e-3 * abs(whole[0])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(whole[3], chunked[3]))
    assert whole[4] >= 2 * 259 * 512 and chunked[4] <= 64 * 512, "no full-vocabulary tensor over every label"


def test_micro_batches_accumulate_to_the_batchs_update(tmp_path):
    from transformers import AutoTokenizer

    from obsspec.worldmodel.config import WorldModelTrainConfig
    from obsspec.worldmodel.train import train_adapter

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(BASES, "tokenizer"))
    rows = [{"input_ids": [(7 * i + j) % 300 + 5 for j in range(20 + 6 * i)],
             "completion_mask": [0] * 12 + [1] * (8 + 6 * i)} for i in range(4)]
    adapters = {}
    for micro, checkpointing in ((0, False), (1, True)):
        base = _tiny_lm(len(tokenizer))
        cfg = WorldModelTrainConfig(rank=4, alpha=8, batch_size=4, micro_batch_size=micro, max_steps=1, epochs=1,
                                    learning_rate=1e-2, activation_checkpointing=checkpointing)
        out = str(tmp_path / f"m{micro}")
        train_adapter(base, tokenizer, rows, cfg, out)
        from safetensors.torch import load_file

        adapters[micro] = load_file(os.path.join(out, "adapter_model.safetensors"))
        embed = base.get_input_embeddings()
        assert not embed._forward_hooks and not base.model.gradient_checkpointing, "the base is left as it was"
    assert all(torch.allclose(adapters[0][k], adapters[1][k], atol=1e-6) for k in adapters[0])
