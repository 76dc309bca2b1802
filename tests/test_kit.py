"""Tests of the tiny local model kit (obsspec/models): tokenizer, SFT examples, training, cache.

Everything is tiny (vocab 512, hidden 32, a handful of trajectories written here), so the file
runs in seconds on a CPU without downloads.

Run: .venv/bin/python -m pytest -q tests/test_kit.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import filecmp
import json
import os
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fakes import PlainEngine
from obsspec import chat
from obsspec.engines.base import Generation
from obsspec.env.sandbox import SandboxConfig
from obsspec.env.suite import TaskNotFound, builtin_task
from obsspec.models import kit, tiny, warmstart
from obsspec.models.config import KitConfig, TinyModelConfig
from obsspec.models.evaluate import success_metrics
from obsspec.models.kit_episodes import mistake_episodes, run_apart
from obsspec.rollout.batch import rollout_tasks
from obsspec.worldmodel.cases import reference_cases, trajectory_cases
from obsspec.worldmodel.evaluate import evaluate_world_model
from obsspec.rollout.scheduler import Sampling
from obsspec.models.tokenizer import CALL_TAGS, SPECIAL, TOOL_TAGS, corpus_texts, listing_atoms, train_tokenizer
from obsspec.tokens import ChatFormat
from obsspec.progress import NullDisplay

TINY_MODEL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                             intermediate_size=64, epochs=1.0, learning_rate=1e-2, batch_size=2)
TINY = KitConfig(vocab_size=512, max_length=1024, policy=TINY_MODEL,
                 world_model=dataclasses.replace(TINY_MODEL, num_layers=1))
SANDBOX = SandboxConfig(timeout_s=10)
SAMPLING = Sampling(max_turns=3, max_new_tokens=24, max_context=1024)


def trajectory(i: int, split: str = "train") -> dict:
    name = ["alpha", "beta", "gamma", "delta", "eps", "zeta"][i % 6]
    return {
        "task_id": f"count-lines-{i:05d}", "family": "count-lines", "split": split, "reward": 1.0,
        "instruction": f"Count the lines of data/{name}.txt and write the number to count.txt.",
        "steps": [
            {"command": f"wc -l data/{name}.txt", "observation": f"{i + 3} data/{name}.txt\n\n(exit_code=0)",
             "exit_code": 0},
            {"command": f"wc -l < data/{name}.txt > count.txt", "observation": "(no output)\n(exit_code=0)",
             "exit_code": 0},
        ],
    }


ROWS = [trajectory(i) for i in range(6)] + [trajectory(6, "val"), trajectory(7, "val")]


def write_suite(path, rows=ROWS) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "trajectories.jsonl"), "w") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(corpus_texts(ROWS), vocab_size=512)


@pytest.fixture(scope="module")
def fmt(tokenizer):
    return ChatFormat(tokenizer)


def runs(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


# ---------------------------------------------------------------------------- tokenizer


def test_tokenizer_trains_saves_and_loads_with_autotokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == len(tokenizer) <= 512
    assert loaded.eos_token == "<|im_end|>" and loaded.pad_token == "<|endoftext|>"
    assert loaded.convert_tokens_to_ids([*SPECIAL, *TOOL_TAGS, *CALL_TAGS]) == list(range(13))
    for text in corpus_texts(ROWS)[:2] + ["héllo € 😀 \r\x1b[0m\ttabs  spaces\n\n"]:
        ids = loaded.encode(text, add_special_tokens=False)
        assert ids == tokenizer.encode(text, add_special_tokens=False)
        assert loaded.decode(ids, skip_special_tokens=False) == text, "byte-level BPE must round-trip"
    assert loaded.chat_template and "<|im_start|>" in loaded.chat_template


def test_special_and_tool_tokens_are_atomic(tokenizer):
    for i, tag in enumerate([*SPECIAL, *TOOL_TAGS, *CALL_TAGS]):
        ids = tokenizer.encode(f"ab{tag}cd", add_special_tokens=False)
        assert i in ids, f"{tag} must be one token"
    text = "<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>"
    # Tool tags are not special (as in Qwen3): skipping special tokens keeps them.
    kept = tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True)
    assert kept == "assistant\n<tool_call>x</tool_call>"


@pytest.mark.parametrize("name", ["alpha.txt", "onyx.zip", "report_2024-final.csv", "beta", "Zeta9"])
def test_a_name_keeps_its_token_ids_wherever_it_appears(tokenizer, name):
    """Copying a name from the instruction into a command must be copying tokens."""
    ids = tokenizer.encode(name, add_special_tokens=False)
    contexts = [f"/app/{name}", f" {name}", f"data/{name}", f"`{name}`", f"'{name}'", f"\n{name}\n",
                f"cat {name} > out", f"--file={name}", f"({name})", f"x{'/'}{name},"]
    for text in contexts:
        got = tokenizer.encode(text, add_special_tokens=False)
        assert any(got[i:i + len(ids)] == ids for i in range(len(got) - len(ids) + 1)), \
            f"{name!r} inside {text!r} encodes as {tokenizer.convert_ids_to_tokens(got)}, " \
            f"not as {tokenizer.convert_ids_to_tokens(ids)}"


def test_digit_runs_become_pieces_of_up_to_n_digits_and_names_keep_their_ids(tokenizer):
    """kit.digits_per_token=3: a listing's `389` can be one token (copying a size is one step),
    cut the same way in every context, and the text still round-trips byte for byte."""
    texts = corpus_texts(ROWS) + ["-rw-r--r-- 1 agent agent 389 Jan  1 00:00 a.log\n"] * 4
    three = train_tokenizer(texts, vocab_size=512, digits=3)
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("389", add_special_tokens=False)) == ["3", "8", "9"]
    assert three.convert_ids_to_tokens(three.encode("389", add_special_tokens=False)) == ["389"]
    for text in ("389", " 389 ", "size=389\n", "x389y"):
        ids = three.encode(text, add_special_tokens=False)
        assert three.encode("389", add_special_tokens=False)[0] in ids, text
    pieces = three.convert_ids_to_tokens(three.encode("1234567", add_special_tokens=False))
    assert "".join(pieces) == "1234567" and all(len(p) <= 3 for p in pieces)
    for text in ("report_2024-final.csv 4096 bytes", "héllo 12345 € 😀"):
        assert three.decode(three.encode(text, add_special_tokens=False)) == text
    ids = three.encode("onyx.zip", add_special_tokens=False)
    assert ids == three.encode("/app/onyx.zip", add_special_tokens=False)[-len(ids):]


def test_tokenizer_is_deterministic(tmp_path):
    texts = corpus_texts(ROWS)
    for name in ("a", "b"):
        train_tokenizer(texts, vocab_size=512).save_pretrained(tmp_path / name)
    files = sorted(os.listdir(tmp_path / "a"))
    assert "tokenizer.json" in files and files == sorted(os.listdir(tmp_path / "b"))
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    train_tokenizer(texts[:3], vocab_size=512).save_pretrained(tmp_path / "c")
    other = (tmp_path / "c" / "tokenizer.json").read_bytes()
    assert other != (tmp_path / "a" / "tokenizer.json").read_bytes()


def listing_rows(n: int) -> list[dict]:
    """Reference rows whose first observation is an `ls -l data` listing (with a padded size column)."""
    rows = []
    for i in range(n):
        sizes = [5 + i, 120 + 7 * i, 1000 + i]
        lines = [f"-rw-r--r-- 1 agent agent {s:>4} Jan  1 00:00 file{k}.log" for k, s in enumerate(sizes)]
        lines.append("drwxr-xr-x 2 agent agent   40 Jan  1 00:00 sub")
        row = trajectory(i)
        row["steps"][0] = {"command": "ls -l data", "exit_code": 0,
                           "observation": f"total {12 + i}\n" + "\n".join(lines) + "\n\n(exit_code=0)"}
        rows.append(row)
    return rows


def test_listing_fields_become_single_tokens():
    """Every line of a listing repeats its mode, link count + owners and date: one token each, so
    the world model copies ~11 tokens a line instead of ~34 (docs/WORLDMODEL.md)."""
    rows = listing_rows(4)
    texts = corpus_texts(rows)
    # Most frequent first (the date is on all 16 lines); 12 file lines but only 4 directory lines:
    # under MIN_LISTING_LINES the directory's fields stay pieces.
    assert listing_atoms(texts) == [" Jan  1 00:00 ", "-rw-r--r--", " 1 agent agent "]
    tok = train_tokenizer(texts, vocab_size=512)
    assert tok.convert_tokens_to_ids([*SPECIAL, *TOOL_TAGS, *CALL_TAGS]) == list(range(13))
    assert tok.convert_tokens_to_ids(listing_atoms(texts)) == [13, 14, 15]
    line = "-rw-r--r-- 1 agent agent  389 Jan  1 00:00 backup.log"
    ids = tok.encode(line, add_special_tokens=False)
    assert ids[:2] == [14, 15] and 13 in ids and tok.decode(ids) == line
    # two atoms, the pad, three digits, the date, then the name's own tokens
    assert len(ids) == 7 + len(tok.encode("backup.log")), tok.convert_ids_to_tokens(ids)
    # The atoms are ordinary added tokens: skipping special tokens keeps them.
    assert tok.decode(ids, skip_special_tokens=True) == line
    # Names keep their ids inside a listing line, as everywhere else.
    name = tok.encode("backup", add_special_tokens=False)
    assert any(ids[i:i + len(name)] == name for i in range(len(ids)))
    # A corpus without listings has none, and a date or owner outside a listing is no atom.
    assert listing_atoms(corpus_texts(ROWS)) == []
    assert listing_atoms(["x 1 agent agent 5 Jan  1 00:00 y\n" * 20]) == []
    # A hostile owner name holding a tag is never part of an atom (the tag stays one token).
    hostile = "-rw-r--r-- 1 <|im_end|> agent 5 Jan  1 00:00 y\n" * 20
    assert listing_atoms([hostile]) == ["-rw-r--r--", " Jan  1 00:00 "]


# ---------------------------------------------------------------------------- SFT examples


def test_policy_examples_mask_exactly_the_action_tokens(fmt):
    rows, dropped = warmstart.examples(fmt, ROWS[:1], "policy", max_length=1024)
    assert dropped == 0 and len(rows) == 1
    ids, mask = rows[0]["input_ids"], rows[0]["completion_mask"]
    steps = ROWS[0]["steps"]
    actions = [fmt.action_ids(chat.render_bash(s["command"])) for s in steps]
    observations = [fmt.observation_ids(s["observation"])[0] for s in steps]
    expected, pos = [], len(fmt.prompt_ids(ROWS[0]["instruction"]))
    for action, obs in zip(actions, observations):
        expected.append((pos, pos + len(action)))
        pos += len(action) + len(obs)
    expected.append((pos, pos + len(fmt.action_ids(chat.render_done()))))
    assert runs(mask) == expected and pos + len(fmt.action_ids(chat.render_done())) == len(ids)
    assert [fmt.decode(ids[a:b]) for a, b in runs(mask)] == [
        chat.render_bash(s["command"]) + "<|im_end|>" for s in steps] + [chat.render_done() + "<|im_end|>"]


def test_world_model_examples_target_body_plus_closing_tag(fmt):
    rows, _ = warmstart.examples(fmt, ROWS[:1], "world_model", max_length=1024)
    ids, mask = rows[0]["input_ids"], rows[0]["completion_mask"]
    history = fmt.prompt_ids(ROWS[0]["instruction"])
    spans = runs(mask)
    assert len(spans) == len(ROWS[0]["steps"])
    for (a, b), step in zip(spans, ROWS[0]["steps"]):
        action = fmt.action_ids(chat.render_bash(step["command"]))
        assert ids[:a] == fmt.wm_prompt_ids(history, action), "context must be wm_prompt_ids(history, action)"
        assert ids[a:b] == fmt.wm_target_ids(step["observation"])
        assert fmt.decode(ids[a:b]) == step["observation"] + "\n</tool_response>"
        history = history + action + fmt.observation_ids(step["observation"])[0]
    assert fmt.decode(ids).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")  # no done()


def test_too_long_trajectories_are_dropped_and_counted(fmt):
    longest = max(len(r["input_ids"]) for r in warmstart.examples(fmt, ROWS, "policy", 4096)[0])
    rows, dropped = warmstart.examples(fmt, ROWS, "policy", max_length=longest - 1)
    assert dropped >= 1 and len(rows) + dropped == len(ROWS)
    assert all(len(r["input_ids"]) <= longest - 1 for r in rows)


def test_trl_turns_the_completion_mask_into_labels(fmt, tokenizer, tmp_path):
    rows, _ = warmstart.examples(fmt, ROWS[:2], "policy", max_length=1024)
    model = tiny.build_model(TINY_MODEL, tokenizer, 1024)
    from datasets import Dataset
    from trl import SFTTrainer

    trainer = SFTTrainer(model=model, args=warmstart.sft_config(TINY_MODEL, str(tmp_path), 0),
                         processing_class=tokenizer, train_dataset=Dataset.from_list(rows))
    prepared = {tuple(r["input_ids"]): r["labels"] for r in trainer.train_dataset}
    for row in rows:
        expected = [t if m else -100 for t, m in zip(row["input_ids"], row["completion_mask"])]
        assert prepared[tuple(row["input_ids"])] == expected, "loss must be on action tokens only"


# ---------------------------------------------------------------------------- models


def test_a_training_step_changes_every_parameter(fmt, tokenizer, tmp_path):
    rows, _ = warmstart.examples(fmt, ROWS, "policy", max_length=1024)
    model = tiny.build_model(TINY_MODEL, tokenizer, 1024)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    report = warmstart.train(model, tokenizer, rows[:4], rows[4:], TINY_MODEL, str(tmp_path / "t"))
    assert report["steps"] == 2 and report["eval_loss"] > 0
    for name, p in model.named_parameters():
        assert not torch.equal(p, before[name]), f"{name} did not change"


def test_a_micro_policy_learns_to_copy_names_it_never_saw(tmp_path):
    """Learning happened, and it is the kind the kit needs: copying a file name from the
    instruction into the command. Held-out names are new combinations of known words (as val
    tasks' names are); a model that only memorised its training names writes one of those."""
    import random

    adjectives, animals = ["red", "blue", "green", "gold", "grey", "pink"], ["fox", "owl", "elk", "cod", "bee", "ant"]
    names = [f"{a}_{b}" for a in adjectives for b in animals]
    random.Random(0).shuffle(names)
    held_out, seen = names[:8], names[8:]
    pair = lambda name: (f"Show /app/{name}.txt please.", f" cat {name}.txt\n")  # noqa: E731
    tok = train_tokenizer(["".join(pair(n)) for n in names], vocab_size=300)

    def row(name):
        prompt, target = (tok.encode(t, add_special_tokens=False) for t in pair(name))
        return {"input_ids": prompt + target, "completion_mask": [0] * len(prompt) + [1] * len(target)}

    cfg = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                          intermediate_size=64, epochs=1000, max_steps=200, learning_rate=1e-2, batch_size=14)
    model = tiny.build_model(cfg, tok, 64, seed=0)

    def copied() -> int:
        hits = 0
        for name in held_out:
            prompt, target = pair(name)
            ids = tok.encode(prompt, add_special_tokens=False)
            out = model.generate(torch.tensor([ids]), max_new_tokens=len(tok.encode(target)), do_sample=False)
            hits += tok.decode(out[0, len(ids):].tolist()) == target
        return hits

    assert copied() == 0
    warmstart.train(model, tok, [row(n) for n in seen], [], cfg, str(tmp_path / "t"), measure_train=False)
    assert copied() >= 7, "the micro policy did not learn to copy unseen names from its instruction"


def test_planned_steps_follow_epochs_and_the_cap():
    cfg = dataclasses.replace(TINY_MODEL, epochs=2.0, batch_size=4)
    assert warmstart.planned_steps(cfg, 10) == 6  # 3 batches per epoch
    assert warmstart.planned_steps(dataclasses.replace(cfg, max_steps=5), 10) == 5
    assert warmstart.planned_steps(dataclasses.replace(cfg, epochs=0.5), 10) == 2


def test_build_model_follows_the_config_and_the_tokenizer(tokenizer):
    model = tiny.build_model(TINY_MODEL, tokenizer, 1024, seed=3)
    c = model.config
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.head_dim) == (len(tokenizer), 32, 1, 16)
    assert c.tie_word_embeddings and c.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    again = tiny.build_model(TINY_MODEL, tokenizer, 1024, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


class Recorder:
    def __init__(self):
        self.calls = []

    def start(self, total, label): self.calls.append(("start", label))
    def advance(self, n=1): self.calls.append(("advance", n))
    def log(self, message): self.calls.append(("log", message))
    def finish(self): self.calls.append(("finish",))


def test_ensure_kit_builds_loadable_models_once_then_uses_the_cache(tmp_path, monkeypatch):
    suite = write_suite(tmp_path / "suite")
    display = Recorder()
    paths = kit.ensure_kit(suite, str(tmp_path / "cache"), TINY, SANDBOX, SAMPLING, display)
    assert ("start", "policy") in display.calls and ("start", "world_model") in display.calls
    assert any(c[0] == "advance" for c in display.calls)
    report = paths.read_report()
    assert report["trajectories"] == {"train": 6, "val": 2}
    assert report["policy"]["steps"] == 3 and report["world_model"]["eval_loss"] > 0
    assert os.listdir(tmp_path / "cache") == [os.path.basename(paths.root)], "no temporary folder left"

    for path in (paths.policy, paths.world_model):
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        assert model.config.vocab_size == len(tok) and model.config.num_hidden_layers == 1
        with open(os.path.join(path, "tokenizer.json"), "rb") as f, \
                open(os.path.join(paths.tokenizer, "tokenizer.json"), "rb") as g:
            assert f.read() == g.read(), "policy and world model must share one tokenizer"
    model, tok = tiny.load_pretrained(paths.policy)
    prompt = ChatFormat(tok).prompt_ids("Count the lines of data/alpha.txt")
    out = model.generate(torch.tensor([prompt]), max_new_tokens=3, do_sample=False)
    assert out.shape[1] == len(prompt) + 3 or out[0, -1] == tok.eos_token_id

    mtime = os.path.getmtime(paths.report)

    def no_rebuild(*args, **kwargs):
        raise AssertionError("a second ensure_kit call with the same inputs must not train again")

    monkeypatch.setattr(kit, "build_kit", no_rebuild)
    assert kit.ensure_kit(suite, str(tmp_path / "cache"), TINY, SANDBOX, SAMPLING) == paths
    assert os.path.getmtime(paths.report) == mtime


def record_training(monkeypatch) -> list[str]:
    """The names of the models warmstart.train trains from now on (it still trains them)."""
    trained, real = [], warmstart.train

    def train(*args, **kwargs):
        trained.append(args[7])  # (model, tok, train_rows, eval_rows, cfg, out_dir, seed, name, ...)
        return real(*args, **kwargs)

    monkeypatch.setattr(warmstart, "train", train)
    return trained


def test_a_kit_that_differs_in_its_world_model_only_trains_the_world_model_alone(tmp_path, monkeypatch):
    """A kit whose config differs from a cached one only in kit.world_model copies that kit's
    tokenizer, policy and figures, trains its world model alone and names the kit it came from;
    one that differs in anything an earlier stage reads trains everything."""
    from transformers import AutoConfig

    suite, cache = write_suite(tmp_path / "suite"), str(tmp_path / "cache")
    first = kit.ensure_kit(suite, cache, TINY, SANDBOX, SAMPLING)
    trained = record_training(monkeypatch)
    wider = dataclasses.replace(TINY, world_model=dataclasses.replace(TINY.world_model, hidden_size=64))
    second = kit.ensure_kit(suite, cache, wider, SANDBOX, SAMPLING)
    assert second.root != first.root and trained == ["world_model"]
    for name in ("tokenizer/tokenizer.json", "policy/model.safetensors"):
        assert filecmp.cmp(os.path.join(first.root, name), os.path.join(second.root, name), shallow=False)
    report, before = second.read_report(), first.read_report()
    assert report["stages_from"] == {"kit": first.root, "stages": list(kit.SHARED_STAGES),
                                     "build_sec": before["build_sec"]}
    assert report["policy"] == before["policy"] and report["tokenizer"] == before["tokenizer"]
    assert AutoConfig.from_pretrained(second.world_model).hidden_size == 64

    trained.clear()  # the policy's learning rate: a stage before the world model reads it
    other = dataclasses.replace(wider, policy=dataclasses.replace(TINY.policy, learning_rate=5e-3))
    third = kit.ensure_kit(suite, cache, other, SANDBOX, SAMPLING)
    assert trained == ["policy", "world_model"] and "stages_from" not in third.read_report()


def test_the_cache_key_follows_config_and_corpus(tmp_path):
    suite = write_suite(tmp_path / "a")
    key = kit.kit_key(suite, TINY, SANDBOX, SAMPLING)
    assert kit.kit_key(suite, TINY, SANDBOX, SAMPLING) == key
    assert kit.kit_key(suite, dataclasses.replace(TINY, seed=1), SANDBOX, SAMPLING) != key
    assert kit.kit_key(suite, dataclasses.replace(TINY, digits_per_token=3), SANDBOX, SAMPLING) != key
    assert kit.kit_key(write_suite(tmp_path / "b", ROWS[:-1]), TINY, SANDBOX, SAMPLING) != key
    # Without rollouts the policy's sampling does not shape the kit; with them it does.
    hotter = dataclasses.replace(SAMPLING, temperature=0.5)
    assert kit.kit_key(suite, TINY, SANDBOX, hotter) == key
    with open(os.path.join(suite, "train.jsonl"), "w") as f:
        f.write("{}\n")
    with_rollouts = dataclasses.replace(TINY, rollouts=2)
    assert kit.kit_key(suite, with_rollouts, SANDBOX, hotter) != kit.kit_key(suite, with_rollouts, SANDBOX, SAMPLING)
    # The stages before the world model's: all of the above but kit.world_model and the snapshot;
    # before the rollouts, also without the sampling and kit.rollouts.
    stages = kit.stages_keys(suite, with_rollouts, SANDBOX, SAMPLING)
    hot = kit.stages_keys(suite, with_rollouts, SANDBOX, hotter)
    assert hot["all"] != stages["all"] and hot["before_rollouts"] == stages["before_rollouts"]
    more = kit.stages_keys(suite, dataclasses.replace(with_rollouts, rollouts=3), SANDBOX, SAMPLING)
    assert more["all"] != stages["all"] and more["before_rollouts"] == stages["before_rollouts"]
    for changed in (dataclasses.replace(with_rollouts, seed=1),
                    dataclasses.replace(with_rollouts, policy=TINY_MODEL.__class__()),
                    dataclasses.replace(with_rollouts, vocab_size=1024)):
        assert not set(kit.stages_keys(suite, changed, SANDBOX, SAMPLING).values()) & set(stages.values())
    assert kit.stages_keys(suite, dataclasses.replace(with_rollouts, world_model=TINY_MODEL.__class__()), SANDBOX,
                           SAMPLING) == stages
    shutil.rmtree(tmp_path / "a")
    with pytest.raises(TaskNotFound, match="prepare-tasks"):
        kit.ensure_kit(str(tmp_path / "a"), str(tmp_path / "cache"), TINY, SANDBOX, SAMPLING)


def test_with_the_workspace_snapshot_the_world_model_base_learns_with_it_ahead_of_every_row(tmp_path, monkeypatch):
    """world_model.workspace_snapshot with the kit's world model: the base is pre-trained on rows
    that start with each task's snapshot (never a target), as the rollout's drafts will; its
    cache key differs from the kit without it, which keeps the key it always had."""
    from transformers import AutoConfig

    from obsspec.env.task import Task
    from obsspec.worldmodel import snapshot

    suite = write_suite(tmp_path / "suite")
    tasks = {r["task_id"]: Task(r["task_id"], "count-lines", r["instruction"], [], "true",
                                files={f"data/f{i}.txt": "x\n" * (i + 1)}) for i, r in enumerate(ROWS)}
    for split in ("train", "val"):
        with open(os.path.join(suite, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps(t.to_dict()) + "\n" for r, t in zip(ROWS, tasks.values())
                         if r["split"] == split)
    assert kit.kit_key(suite, TINY, SANDBOX, SAMPLING, 0) == kit.kit_key(suite, TINY, SANDBOX, SAMPLING)
    assert kit.kit_key(suite, TINY, SANDBOX, SAMPLING, 128) != kit.kit_key(suite, TINY, SANDBOX, SAMPLING)
    seen = {}

    def train(model, tok, train_rows, eval_rows, cfg, out_dir, seed, name, display, **kwargs):
        seen[name] = (tok, train_rows, eval_rows)
        return {"steps": 0}

    monkeypatch.setattr(warmstart, "train", train)
    pieces = {}
    for budget in (0, 256):
        report = kit.build_kit(suite, str(tmp_path / f"kit{budget}"), TINY, SANDBOX, SAMPLING, NullDisplay(),
                               snapshot_tokens=budget)
        tok, train_rows, eval_rows = seen["world_model"]
        fmt = ChatFormat(tok)
        rows = train_rows + eval_rows
        by_task = [r["task_id"] for r in ROWS if r["split"] == "train"] + \
                  [r["task_id"] for r in ROWS if r["split"] == "val"]
        assert len(rows) == len(by_task) == 8
        for row, task_id in zip(rows, by_task):
            t = tasks[task_id]
            prefix = asyncio.run(snapshot.workspace_snapshot(t, fmt, budget, SANDBOX)) if budget else []
            assert row["input_ids"][:len(prefix)] == prefix and not any(row["completion_mask"][:len(prefix)])
            assert ("<workspace>" in fmt.decode(row["input_ids"])) == bool(budget)
        assert ("workspace_snapshot" in report) == bool(budget)
        # the world model reads the snapshot ahead of the policy's whole context
        paths = kit.KitPaths.under(str(tmp_path / f"kit{budget}"))
        assert AutoConfig.from_pretrained(paths.world_model).max_position_embeddings == TINY.max_length + budget
        assert AutoConfig.from_pretrained(paths.policy).max_position_embeddings == TINY.max_length
        if budget:  # each row has its own task's workspace (val row 0 is ROWS[6]'s task)
            assert " f6.txt\n" in fmt.decode(eval_rows[0]["input_ids"][:256])
        # the snapshots' text is not in the tokenizer's corpus: the tokenizer (and the policy)
        # do not depend on the world model's snapshot
        pieces[budget] = fmt.encode_text("/app before the first command:\n$ ls -lR\n./data:")
    assert pieces[256] == pieces[0]


def write_dir_stats_suite(path, val_extra=()) -> str:
    """A suite of 4 built-in dir-stats tasks (3 train, 1 val) and their reference trajectories."""
    tasks = [builtin_task("dir-stats", i) for i in range(4)]
    rows = [{"task_id": t.task_id, "family": t.family, "split": "train" if i < 3 else "val", "reward": 1.0,
             "instruction": t.instruction, "steps": [{"command": c, "observation": "(no output)\n(exit_code=0)",
                                                      "exit_code": 0} for c in t.solution]}
            for i, t in enumerate(tasks)]
    write_suite(path, rows)
    for split, chosen in (("train", tasks[:3]), ("val", [*tasks[3:], *val_extra])):
        with open(os.path.join(path, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps(t.to_dict()) + "\n" for t in chosen)
    return str(path)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install)")
def test_world_model_tasks_add_real_reference_rows_for_the_world_model_only(tmp_path, monkeypatch):
    """kit.world_model_tasks: more instances of the suite's families, run in real sandboxes, whose
    observations the world-model base (and not the policy) learns from; one equal to a suite task
    (here: a val task, which must never be trained on) is dropped and counted."""
    from obsspec.env.suite import instance_seed

    cfg = dataclasses.replace(TINY, world_model_tasks=4)
    first = builtin_task("dir-stats", 0, instance_seed(cfg.seed, "kit.world_model_tasks", 0))
    suite = write_dir_stats_suite(tmp_path / "suite", val_extra=[dataclasses.replace(first, task_id="dir-stats-00099")])
    assert kit.kit_key(suite, cfg, SANDBOX, SAMPLING) != kit.kit_key(suite, TINY, SANDBOX, SAMPLING)
    seen = {}

    def train(model, tok, train_rows, eval_rows, cfg, out_dir, seed, name, display, **kwargs):
        seen[name] = (tok, train_rows)
        return {"steps": 0}

    monkeypatch.setattr(warmstart, "train", train)
    report = kit.build_kit(suite, str(tmp_path / "kit"), cfg, SANDBOX, SAMPLING, NullDisplay())
    extra = report["world_model_tasks"]
    assert (extra["generated"], extra["duplicates"], extra["failed"], extra["kept"]) == (4, 1, 0, 3)
    tok, wm_rows = seen["world_model"]
    assert len(seen["policy"][1]) == 3 and len(wm_rows) == 3 + 3 == 3 + extra["examples"]
    fmt = ChatFormat(tok)
    texts = [fmt.decode(r["input_ids"]) for r in wm_rows[3:]]
    # real observations of the sandbox (the suite's rows above say "(no output)" for every step)
    assert all("-rw-r--r-- 1 agent agent" in t and "total " in t for t in texts)

    with open(os.path.join(suite, "train.jsonl"), "w") as f:  # no built-in family to generate
        f.write(json.dumps(dataclasses.replace(builtin_task("dir-stats", 0), family="imported").to_dict()) + "\n")
    with pytest.raises(ValueError, match="world_model_tasks.*built-in family"):
        kit.build_kit(suite, str(tmp_path / "kit2"), cfg, SANDBOX, SAMPLING, NullDisplay())


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install)")
def test_policy_tasks_teach_the_policy_and_are_not_run_again_once_the_policy_is_built(tmp_path, monkeypatch):
    """kit.policy_tasks: generated instances' reference solutions, run in real sandboxes, are
    policy rows; a build (or a resumed one) whose tokenizer and policy are there skips them."""
    cfg = dataclasses.replace(TINY, policy_tasks=2)
    suite = write_dir_stats_suite(tmp_path / "suite")
    seen = {}

    def train(model, tok, train_rows, eval_rows, mcfg, out_dir, seed, name, display, **kwargs):
        seen[name] = train_rows
        return {"steps": 0}

    monkeypatch.setattr(warmstart, "train", train)
    first = str(tmp_path / "kit")
    report = kit.build_kit(suite, first, cfg, SANDBOX, SAMPLING, NullDisplay())
    assert report["policy_tasks"]["kept"] == 2 and len(seen["policy"]) == 3 + 2
    assert os.path.exists(os.path.join(first, "policy_tasks.jsonl"))
    seen.clear()
    again = str(tmp_path / "again")
    for stage in ("tokenizer", "policy"):
        shutil.copytree(os.path.join(first, stage), os.path.join(again, stage))
    kit.build_kit(suite, again, cfg, SANDBOX, SAMPLING, NullDisplay())
    assert list(seen) == ["world_model"] and not os.path.exists(os.path.join(again, "policy_tasks.jsonl"))


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install)")
def test_the_copy_curriculum_trains_the_world_model_on_copies_first_then_goes_on_from_there(tmp_path, monkeypatch):
    """kit.copy_steps: the world model first trains that many steps on copy rows (commands whose
    output is a span of the task's snapshot) of the train tasks and generated instances, never
    of a val task's workspace, then trains its real rows from where that left off."""
    from obsspec.config import ConfigError, load_recipe
    from obsspec.worldmodel import snapshot

    cfg = dataclasses.replace(TINY, world_model_tasks=2, copy_steps=3)
    suite = write_dir_stats_suite(tmp_path / "suite")
    seen = {}

    def train(model, tok, train_rows, eval_rows, mcfg, out_dir, seed, name, display, **kwargs):
        seen[name] = (model, tok, train_rows, eval_rows, mcfg)
        return {"steps": 0}

    monkeypatch.setattr(warmstart, "train", train)
    kit.build_kit(suite, str(tmp_path / "kit"), cfg, SANDBOX, SAMPLING, NullDisplay(), snapshot_tokens=384)
    assert list(seen) == ["policy", "world_model_copies", "world_model"]
    model, tok, rows, val_rows, mcfg = seen["world_model_copies"]
    assert seen["world_model"][0] is model, "the real rows do not start from the copies' model"
    assert mcfg.max_steps == 3 and seen["world_model"][4] == cfg.world_model
    fmt = ChatFormat(tok)
    val_task = builtin_task("dir-stats", 3)
    val_prefix = asyncio.run(snapshot.workspace_snapshot(val_task, fmt, 384, SANDBOX))
    # (a budget that cuts a snapshot keeps fewer rows: only copies of what it shows)
    assert 0 < len(rows) <= (3 + 2) * cfg.copies_per_task and 0 < len(val_rows) <= cfg.copies_per_task
    im_end = tok.convert_tokens_to_ids("<|im_end|>")  # (the snapshot is the first turn)
    snapshots = {tuple(r["input_ids"][:r["input_ids"].index(im_end)]) for r in rows}
    assert len(snapshots) == 3 + 2, "copies of the 3 train tasks and the 2 generated instances"
    assert all(r["input_ids"][:len(val_prefix)] == val_prefix for r in val_rows)
    for row in rows:
        assert row["input_ids"][:len(val_prefix)] != val_prefix, "a val task's workspace was trained on"
        ids, mask = row["input_ids"], row["completion_mask"]
        start = mask.index(1)
        body = fmt.decode(ids[start:start + sum(mask)]).split("\n(exit_code=0)")[0].rstrip("\n")
        shown = fmt.decode(ids[:start])
        shown = shown[:shown.index("</workspace>")]
        # a span of the snapshot (`ls DIR`: the names of its listing's lines)
        assert body in shown or all(f" {name}\n" in shown for name in body.split("\n")), \
            f"a copy target not in its snapshot: {body!r}"
    assert kit.stages_keys(suite, cfg, SANDBOX, SAMPLING) == kit.stages_keys(
        suite, dataclasses.replace(cfg, copy_steps=0), SANDBOX, SAMPLING)
    assert kit.kit_key(suite, cfg, SANDBOX, SAMPLING, 384) != kit.kit_key(
        suite, dataclasses.replace(cfg, copy_steps=0), SANDBOX, SAMPLING, 384)
    seen.clear()  # without generated instances: the train tasks' copies alone
    kit.build_kit(suite, str(tmp_path / "kit1"), dataclasses.replace(cfg, world_model_tasks=0), SANDBOX, SAMPLING,
                  NullDisplay(), snapshot_tokens=384)
    rows = seen["world_model_copies"][2]
    assert len({tuple(r["input_ids"][:r["input_ids"].index(im_end)]) for r in rows}) == 3
    with pytest.raises(ValueError, match="copy_steps"):
        kit.build_kit(suite, str(tmp_path / "kit2"), cfg, SANDBOX, SAMPLING, NullDisplay())
    with pytest.raises(ConfigError, match="kit.copy_steps.*workspace_snapshot"):
        load_recipe("recipes/tiny-cpu.yaml", ["kit.copy_steps=5", "world_model.workspace_snapshot=false",
                                              "world_model.hint_tokens=0"])
    # with hints instead of a snapshot, and every copy step of each task: the span the target
    # copies is the hint right after the call
    seen.clear()
    every = dataclasses.replace(cfg, world_model_tasks=0, copies_per_task=0)
    kit.build_kit(suite, str(tmp_path / "kit3"), every, SANDBOX, SAMPLING, NullDisplay(), hint_tokens=256)
    rows = seen["world_model_copies"][2]
    assert len(rows) > 3 * cfg.copies_per_task, "copies_per_task 0 did not take every copy step"
    for row in rows:
        ids, mask = row["input_ids"], row["completion_mask"]
        start = mask.index(1)
        body = fmt.decode(ids[start:start + sum(mask)]).split("\n(exit_code=0)")[0].rstrip("\n")
        before = fmt.decode(ids[:start])
        hint = before[before.rindex("</tool_call><|im_end|>"):]
        assert hint.startswith("</tool_call><|im_end|><|im_start|>system\n<workspace>\n"), hint[:80]
        assert body in hint or all(f" {name}\n" in hint for name in body.split("\n")), body
        assert before.count("<workspace>") == 1, "a snapshot ahead, or more than the call's hint"
    assert kit.kit_key(suite, every, SANDBOX, SAMPLING, 0, 256) != kit.kit_key(
        suite, dataclasses.replace(every, copies_per_task=4), SANDBOX, SAMPLING, 0, 256) != kit.kit_key(
        suite, every, SANDBOX, SAMPLING, 0, 0)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install)")
def test_the_listing_stage_comes_first_and_the_copies_and_real_rows_go_on_from_its_model(tmp_path, monkeypatch):
    """kit.listing_steps: that many steps on listing rows alone (each top-level folder's `ls -l`,
    with a snapshot of that folder alone) of the train tasks and generated instances, never of a
    val task's workspace; then the copy curriculum from that model, then the real rows."""
    from obsspec.config import ConfigError, load_recipe
    from obsspec.worldmodel import snapshot
    from obsspec.worldmodel.copies import listing_rows

    cfg = dataclasses.replace(TINY, world_model_tasks=2, listing_steps=3, copy_steps=2)
    suite = write_dir_stats_suite(tmp_path / "suite")
    seen = {}

    def train(model, tok, train_rows, eval_rows, mcfg, out_dir, seed, name, display, **kwargs):
        seen[name] = (model, tok, train_rows, eval_rows, mcfg,
                      (kwargs.get("schedule", "cosine"), kwargs.get("sampling", "group_by_length")))
        return {"steps": 0}

    monkeypatch.setattr(warmstart, "train", train)
    kit.build_kit(suite, str(tmp_path / "kit"), cfg, SANDBOX, SAMPLING, NullDisplay(), hint_tokens=256)
    assert list(seen) == ["policy", "world_model_listings", "world_model_copies", "world_model"]
    model, tok, rows, val_rows, mcfg, schedule = seen["world_model_listings"]
    assert seen["world_model_copies"][0] is model and seen["world_model"][0] is model, \
        "the copies and the real rows do not start from the listing stage's model"
    assert mcfg.max_steps == 3 and seen["world_model_copies"][4].max_steps == 2
    # a constant rate in random batches for the listings (copying comes late, and not from
    # batches of one length), the world model's own schedule after
    assert (mcfg.learning_rate, schedule) == (kit.LISTING_LR, ("constant_with_warmup", "random"))
    default = ("cosine", "group_by_length")
    assert seen["world_model"][4:] == (cfg.world_model, default) and seen["world_model_copies"][5] == default
    fmt = ChatFormat(tok)
    val_text = asyncio.run(snapshot.workspace_text(builtin_task("dir-stats", 3), SANDBOX))
    val_listing = listing_rows(fmt, val_text, SANDBOX.output_cap)
    assert val_listing and val_rows[:len(val_listing)] == val_listing
    assert len(rows) >= 3 + 2, "a listing per train task and generated instance"
    for row in rows:
        assert row not in val_listing, "a val task's workspace was trained on"
        ids, mask = row["input_ids"], row["completion_mask"]
        start = mask.index(1)
        body = fmt.decode(ids[start:]).split("\n\n(exit_code=0)")[0]
        assert body.startswith("total ") and f":\n{body}\n</workspace>" in fmt.decode(ids[:start])
    assert kit.stages_keys(suite, cfg, SANDBOX, SAMPLING) == kit.stages_keys(
        suite, dataclasses.replace(cfg, listing_steps=0), SANDBOX, SAMPLING)
    assert kit.kit_key(suite, cfg, SANDBOX, SAMPLING, 0, 256) != kit.kit_key(
        suite, dataclasses.replace(cfg, listing_steps=0), SANDBOX, SAMPLING, 0, 256)
    seen.clear()  # alone, without the copy curriculum: the real rows go on from it
    alone = dataclasses.replace(cfg, copy_steps=0, world_model_tasks=0)
    kit.build_kit(suite, str(tmp_path / "kit1"), alone, SANDBOX, SAMPLING, NullDisplay(), hint_tokens=256)
    assert list(seen) == ["policy", "world_model_listings", "world_model"]
    assert seen["world_model"][0] is seen["world_model_listings"][0]
    with pytest.raises(ValueError, match="listing_steps"):
        kit.build_kit(suite, str(tmp_path / "kit2"), alone, SANDBOX, SAMPLING, NullDisplay())
    with pytest.raises(ConfigError, match="kit.listing_steps.*workspace_snapshot"):
        load_recipe("recipes/tiny-cpu.yaml", ["kit.listing_steps=5", "world_model.workspace_snapshot=false",
                                              "world_model.hint_tokens=0"])
    with pytest.raises(ConfigError, match="kit.listing_steps must be >= 0, got -1"):
        load_recipe(None, ["kit.listing_steps=-1"])


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install)")
def test_a_kit_that_differs_in_its_sampling_runs_the_rollouts_again_on_the_same_policy(tmp_path, monkeypatch):
    """The policy's rollouts read the sampling settings; the tokenizer and the policy do not."""
    suite, cache = write_dir_stats_suite(tmp_path / "suite"), str(tmp_path / "cache")
    cfg = dataclasses.replace(TINY, rollouts=2)
    first = kit.ensure_kit(suite, cache, cfg, SANDBOX, SAMPLING)
    trained = record_training(monkeypatch)
    hotter = kit.ensure_kit(suite, cache, cfg, SANDBOX, dataclasses.replace(SAMPLING, temperature=1.3))
    report = hotter.read_report()
    assert trained == ["world_model"] and report["stages_from"]["stages"] == list(kit.SHARED_STAGES[:-1])
    assert report["rollouts"]["episodes"] == 2 and os.path.exists(hotter.rollouts)
    assert filecmp.cmp(os.path.join(first.policy, "model.safetensors"),
                       os.path.join(hotter.policy, "model.safetensors"), shallow=False)


ERROR_WORDS = ("No such file or directory", "command not found", "syntax error near unexpected token")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install)")
def test_mistakes_give_the_world_model_and_the_tokenizer_real_error_messages(tmp_path, monkeypatch):
    """kit.mistakes: reference solutions with one edit, run in real sandboxes; their error
    messages are world-model rows (not policy rows) and in the tokenizer's corpus."""
    suite = write_dir_stats_suite(tmp_path / "suite")
    cfg = dataclasses.replace(TINY, mistakes=4, vocab_size=2048)
    assert kit.kit_key(suite, cfg, SANDBOX, SAMPLING) != kit.kit_key(suite, TINY, SANDBOX, SAMPLING)
    seen = {}

    def train(model, tok, train_rows, eval_rows, cfg, out_dir, seed, name, display, **kwargs):
        seen[name] = (tok, train_rows)
        return {"steps": 0}

    monkeypatch.setattr(warmstart, "train", train)
    pieces = {}
    for m in (0, 4):
        report = kit.build_kit(suite, str(tmp_path / f"kit{m}"), dataclasses.replace(cfg, mistakes=m),
                               SANDBOX, SAMPLING, NullDisplay())
        tok, wm_rows = seen["world_model"]
        pieces[m] = sum(len(ChatFormat(tok).encode_text(w)) for w in ERROR_WORDS)
        assert ("mistakes" in report) == bool(m)
    got = report["mistakes"]
    assert got["episodes"] == 3 * 4 and got["steps"] == 3 * 4 * 3 and got["failed_steps"] >= 1
    assert len(seen["policy"][1]) == 3 and len(wm_rows) == 3 + got["examples"]  # the policy learns none
    texts = [ChatFormat(tok).decode(r["input_ids"]) for r in wm_rows[3:]]
    assert any(w in t for t in texts for w in ERROR_WORDS)
    assert pieces[4] < pieces[0]  # the error words are in the corpus: fewer pieces
    # the same seeds, the same edits: a kit rebuilt from the same inputs learns the same rows
    tasks = [builtin_task("dir-stats", i) for i in range(3)]
    twice = [run_apart(mistake_episodes(tasks, cfg, SANDBOX, NullDisplay())) for _ in range(2)]
    assert [r["steps"] for r in twice[0]] == [r["steps"] for r in twice[1]]


def test_kit_config_rejects_impossible_shapes():
    with pytest.raises(ValueError, match="must divide"):
        TinyModelConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="vocab_size"):
        KitConfig(vocab_size=100)
    for f in dataclasses.fields(KitConfig) + dataclasses.fields(TinyModelConfig):
        assert f.metadata.get("help"), f"{f.name} needs a help text"


# ---------------------------------------------------------------------------- evaluation


class ScriptedEngine(PlainEngine):
    """Answers each turn with the next scripted action text (+ <|im_end|>)."""

    def __init__(self, fmt: ChatFormat, actions: list[str]):
        self.fmt, self.actions, self.turns = fmt, actions, {}

    async def generate(self, request):
        key = request.prompt_ids[:300]
        turn = self.turns.get(key, 0)
        self.turns[key] = turn + 1
        ids = self.fmt.action_ids(self.actions[min(turn, len(self.actions) - 1)])
        return Generation(request.request_id, tuple(ids), (0.0,) * len(ids), "stop")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make install)")
def test_evaluation_is_a_sequential_rollout_in_real_sandboxes(fmt):
    task = builtin_task("count-lines", 0)
    solve = [chat.render_bash(c) for c in task.solution] + [chat.render_done()]
    junk = ["not a tool call", chat.render_done()]
    sampling = Sampling(max_turns=6, max_new_tokens=192, max_context=1024)

    def run(actions):
        return asyncio.run(rollout_tasks(ScriptedEngine(fmt, actions), fmt, [task], SANDBOX, sampling))

    good, bad = run(solve), run(junk)
    m = success_metrics([task, task], good + bad, group_size=2)
    assert good[0].reward == 1.0 and bad[0].reward == 0.0, "the verifier decides the reward"
    assert m["success_frac"] == 0.5 and m["per_family"] == {"count-lines": 0.5}
    assert m["mixed_group_frac"] == 1.0, "one success and one failure in a group of two is mixed"
    assert m["parse_valid_frac"] == pytest.approx((len(solve) + 1) / (len(solve) + 2), abs=1e-3)
    assert m["first_command_reference_frac"] == 0.5 and m["done_called_frac"] == 1.0
    assert [t.kind for t in bad[0].turns] == ["error", "done"]
    # The malformed call's error observation is never a world-model target.
    assert trajectory_cases(fmt, bad) == []
    cases = trajectory_cases(fmt, good)
    assert [c.command for c in cases] == task.solution
    assert all(good[0].ids[len(c.prompt_ids) - len(fmt.obs_prefix_ids):len(c.prompt_ids)] == fmt.obs_prefix_ids
               for c in cases), "a case's context ends with the observation opening"


def test_sampling_has_one_source_the_recipes_policy_section():
    """Rollouts, evaluation, the kit and training sample as the recipe's policy section says:
    `sampling()` is the only place in obsspec/ a Sampling is made, and what defaults Sampling
    keeps are the policy section's (it had 12 turns, 256 tokens and 4096 positions against the
    section's 8, 192 and 2048)."""
    import ast
    import dataclasses
    import pathlib

    from obsspec.config import load_recipe
    from obsspec.rollout.config import PolicyConfig, sampling

    recipe = load_recipe("recipes/tiny-cpu.yaml", ["policy.temperature=0.3", "policy.max_turns=2"])
    s = sampling(recipe.policy, seed=5)
    assert (s.temperature, s.max_turns, s.max_new_tokens, s.seed) == (0.3, 2, recipe.policy.max_new_tokens, 5)
    policy = PolicyConfig()
    assert all(getattr(policy, f.name) == f.default for f in dataclasses.fields(Sampling)
               if f.default is not dataclasses.MISSING and f.name != "seed")
    root = pathlib.Path(__file__).parent.parent / "obsspec"
    makers = sorted(str(path.relative_to(root)) for path in root.rglob("*.py")
                    for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "Sampling")
    assert makers == ["rollout/config.py"], f"a Sampling made outside sampling(): {makers}"


class EchoWorldModel(PlainEngine):
    """Drafts the real body for the first step of every trajectory and a wrong one afterwards."""

    def __init__(self, fmt: ChatFormat, rows: list[dict]):
        self.fmt = fmt
        self.first = {}
        for r in rows:
            action = fmt.action_ids(chat.render_bash(r["steps"][0]["command"]))
            prompt = fmt.wm_prompt_ids(fmt.prompt_ids(r["instruction"]), action)
            self.first[tuple(prompt)] = r["steps"][0]["observation"]

    async def generate(self, request):
        body = self.first.get(tuple(request.prompt_ids))
        if body is None:
            return Generation(request.request_id, tuple(self.fmt.encode("</tool_response>")), (0.0,), "stop")
        ids = self.fmt.wm_target_ids(body)
        return Generation(request.request_id, tuple(ids), (0.0,) * len(ids), "stop")


def test_world_model_drafts_are_compared_exactly_per_class(fmt):
    rows = ROWS[:3]
    cases = reference_cases(fmt, rows)
    r = asyncio.run(evaluate_world_model(EchoWorldModel(fmt, rows), fmt, cases, cap=2048, max_tokens=64))
    assert r["steps"] == 6
    assert r["exact_frac"] == 0.5, "first steps are drafted exactly"
    assert r["unusable_frac"] == 0.5, "a bare closing tag never closes an observation: unusable, counted"
    assert r["per_class"] == {"no_output": {"steps": 3, "exact_frac": 0.0}, "wc": {"steps": 3, "exact_frac": 1.0}}
    assert r["classes_with_output_hit"] == ["wc"]


def test_evaluate_bad_inputs_are_one_line_and_exit_2(tmp_path, capsys):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "bench" / "evaluate_models.py"
    spec = importlib.util.spec_from_file_location("evaluate_models", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    main = script.main

    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "missing"), "--display", "none"])
    assert e.value.code == 2 and "prepare-tasks" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--policies", "", "--rollouts", str(tmp_path / "nope.jsonl"), "--display", "none"])
    assert e.value.code == 2 and "--rollouts" in capsys.readouterr().err
