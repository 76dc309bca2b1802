"""Workspace hints (obsspec/worldmodel/hints.py) and the world model's view of a context
(obsspec/tokens.py `WorldView`):

- a hint holds the spans the command names, and only those: folders, files, globs, a bare `ls`,
  recursive commands; nothing for paths outside the workspace, files the episode made, or a
  command the shell cannot parse; what it shows of a file is what `cat` prints in a real sandbox;
- hints go right after each bash call, never after a malformed one, are never a training target,
  and a history's layout is the start of its continuation's (rows and drafts agree);
- environment text that looks like a turn boundary cannot place a hint;
- the recipe key is checked, and bases built without hints do not serve a recipe with them.

Losslessness with hints on: tests/test_snapshot.py `test_switch_on_is_lossless_...[hints]`.

Run: .venv/bin/python -m pytest -q tests/test_hints.py
"""

from __future__ import annotations

import asyncio
import shutil

import pytest

from fakes import ByteTokenizer
from obsspec import chat
from obsspec.config import ConfigError, load_recipe
from obsspec.env.episode import run_scripted
from obsspec.env.sandbox import SandboxConfig
from obsspec.env.suite import builtin_task
from obsspec.models.bases import bases_mismatch, suite_hashes
from obsspec.tokens import ChatFormat, WorldView, transcript, wm_context, wm_row
from obsspec.worldmodel import snapshot as S
from obsspec.worldmodel.copies import spans
from obsspec.worldmodel.hints import command_hints, hint_text

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
SANDBOX = SandboxConfig(timeout_s=10, output_cap=4096)

LISTING = (".:\ntotal 12\n-rw-r--r-- 1 agent agent 4 Jan  1 00:00 a.txt\n"
           "-rw-r--r-- 1 agent agent 6 Jan  1 00:00 b.txt\n"
           "drwxr-xr-x 3 agent agent 60 Jan  1 00:00 logs\n\n"
           "./logs:\ntotal 4\n-rw-r--r-- 1 agent agent 3 Jan  1 00:00 x.log\n"
           "drwxr-xr-x 2 agent agent 40 Jan  1 00:00 old\n\n"
           "./logs/old:\ntotal 0\n")
FILES = {"a.txt": "one\n", "b.txt": "two\nz\n", "logs/x.log": "ok\n"}


@pytest.fixture(scope="module")
def text():
    entries = tuple(S.Entry(p, 0o100644, len(c.encode()), c) for p, c in sorted(FILES.items()))
    return S.render(S.Workspace(LISTING, entries), "/app")


@pytest.fixture(scope="module")
def fmt():
    return ChatFormat(ByteTokenizer())


def test_a_hint_holds_the_spans_the_command_names(text):
    folders, files = spans(text)
    top, logs, old = folders[""], folders["logs"], folders["logs/old"]
    a, b, x = files["a.txt"], files["b.txt"], files["logs/x.log"]
    assert a == "==> a.txt <==\none\n" and top.startswith(".:\ntotal 12\n") and logs.startswith("./logs:\n")
    for command, expected in [
        ("cat a.txt", a), ("cat ./a.txt b.txt", a + b), ("cat a.txt a.txt", a), ("head -n 1 b.txt", b),
        ("ls", top), ("ls -la", top), ("ls -l logs/", logs), ("ls logs && cat logs/x.log", logs + x),
        ("wc -l *.txt", a + b), ("cat logs/*.log | sort", x), ("find . -type f", top + logs + old),
        ("grep -rn ok logs", logs + old), ("ls -R logs", logs + old), ("find logs -name '*.log'", logs + old),
        ("cat 'a.txt'", a),
        # nothing to show: a path outside the workspace, a file the episode made, no path at all,
        # a line the shell cannot parse
        ("cat /etc/passwd", ""), ("cat ../a.txt", ""), ("cat answer.txt", ""), ("pwd", ""),
        ("echo hi > a.txt", a), ("cat 'a.txt", ""), ("", ""), ("# cat a.txt", ""),
    ]:
        assert hint_text(command, folders, files) == expected, command


def test_hint_ids_are_framed_bounded_and_empty_when_nothing_is_named(fmt, text):
    hint = command_hints(fmt, text, 64)
    assert hint("pwd") == []
    ids = hint("cat a.txt")
    assert fmt.decode(ids) == f"{S.OPEN}==> a.txt <==\none\n{S.CLOSE}"
    assert hint("cat a.txt") == ids, "a hint is a pure function of the command"
    cut = command_hints(fmt, text, 80)("find .")  # ~150 bytes of listing in an 80-token budget
    assert len(cut) == 80 and fmt.decode(cut).endswith(S.TRUNCATED + S.CLOSE)
    # a file holding a turn boundary is text in the hint, not the special tokens
    tricky = S.render(S.Workspace(".:\ntotal 4\n-rw-r--r-- 1 agent agent 12 Jan  1 00:00 t.txt\n",
                                  (S.Entry("t.txt", 0o100644, 12, "<|im_end|>\n\n"),)), "/app")
    ids = command_hints(fmt, tricky, 256)("cat t.txt")
    assert ids.count(fmt.im_end_id) == 1, "file text became a special token"


def history(fmt, steps):
    t = transcript(fmt, "Count the lines.", steps, done=False)
    return t


def test_hints_go_after_each_call_and_are_never_a_target(fmt, text):
    view = WorldView((7, 7), fmt, command_hints(fmt, text, 256))
    steps = [("cat a.txt", "one\n\n(exit_code=0)"), ("pwd", "/app\n\n(exit_code=0)"),
             ("ls logs", "x.log\nold\n\n(exit_code=0)")]
    t = history(fmt, steps)
    row = wm_row(view, t.ids, t.wm_mask)
    hint_a, hint_logs = view.hint("cat a.txt"), view.hint("ls logs")
    assert len(row["input_ids"]) == 2 + len(t.ids) + len(hint_a) + len(hint_logs)
    assert sum(row["completion_mask"]) == sum(t.wm_mask), "a hint became a target (or a target was lost)"
    decoded = fmt.decode(row["input_ids"])
    call = chat.render_bash("cat a.txt") + "<|im_end|>"
    assert call + fmt.decode(hint_a) + "\n<|im_start|>user\n<tool_response>\n" in decoded, \
        "the hint is not between the call and its observation"
    assert decoded.count(S.OPEN) == 2, "pwd names no span and got a hint anyway"
    # the prompt of each step is the start of the row: drafts and training rows agree
    targets = [i for i in range(1, len(row["completion_mask"]))
               if row["completion_mask"][i] and not row["completion_mask"][i - 1]]
    for k, start in enumerate(targets):
        cut = history(fmt, steps[:k])
        action = fmt.action_ids(chat.render_bash(steps[k][0]))
        assert fmt.wm_prompt_ids(cut.ids, action, view) == row["input_ids"][:start], k


def test_a_malformed_call_or_look_alike_text_gets_no_hint(fmt, text):
    view = WorldView((), fmt, command_hints(fmt, text, 256))
    ids = fmt.prompt_ids("Count the lines.")
    ids += fmt.action_ids("<tool_call>\n<function=bash>\nno parameter</function>\n</tool_call>")
    obs, _ = fmt.error_observation_ids("malformed")
    ids += obs
    # an observation whose text spells a call and a turn boundary
    ids += fmt.action_ids(chat.render_bash("echo hi"))
    fake = chat.render_bash("cat a.txt") + "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
    obs, _ = fmt.observation_ids(fake + "\n(exit_code=0)")
    ids += obs
    assert wm_context(view, ids) == ids, "a hint was placed after a malformed call or inside text"
    assert wm_context(view, ids + fmt.action_ids(chat.render_bash("cat b.txt")) + fmt.obs_prefix_ids) == \
        ids + fmt.action_ids(chat.render_bash("cat b.txt")) + view.hint("cat b.txt") + fmt.obs_prefix_ids


def test_a_plain_sequence_is_a_snapshot_alone(fmt):
    assert wm_context([5, 6], [1, 2]) == [5, 6, 1, 2]
    assert wm_row((), [1, 2], [0, 1]) == {"input_ids": [1, 2], "completion_mask": [0, 1]}


@needs_bwrap
def test_what_a_hint_shows_is_what_the_sandbox_prints():
    task = builtin_task("count-lines", 0)
    text = asyncio.run(S.workspace_text(task, SANDBOX))
    folders, files = spans(text)
    assert files, "the task shows no file"
    path = sorted(files)[0]
    record = asyncio.run(run_scripted(task, [f"cat {path}", "ls -l"], SANDBOX, verify=False))
    cat, ls = (s.observation for s in record.steps)
    shown = hint_text(f"cat {path}", folders, files)
    assert cat.split("\n\n(exit_code=")[0] in shown
    assert ls.split("\n(exit_code=")[0] in hint_text("ls -l", folders, files)


def test_recipe_key_and_bases_fit(tmp_path):
    rec = load_recipe("recipes/tiny-cpu.yaml", ["world_model.hint_tokens=256"])
    assert rec.world_model.reads_workspace and rec.world_model.extra_tokens(3) == 768
    assert load_recipe("recipes/tiny-cpu.yaml").world_model.hint_tokens == 384  # the shipped bases' hints
    assert not load_recipe("recipes/tiny-cpu.yaml", ["world_model.hint_tokens=0"]).world_model.reads_workspace
    with pytest.raises(ConfigError, match="hint_tokens must be 0 .off. or between 64 and 32768"):
        load_recipe(None, ["world_model.hint_tokens=8"])
    load_recipe(None, ["kit.copy_steps=10", "world_model.hint_tokens=128"])  # copies need a snapshot or hints
    with pytest.raises(ConfigError, match="copy_steps"):
        load_recipe(None, ["kit.copy_steps=10"])
    with pytest.raises(ConfigError, match="kit.copies_per_task must be >= 0, got -1"):
        load_recipe(None, ["kit.copies_per_task=-1"])
    # bases built without hints do not serve a recipe with them, nor the other way round
    (tmp_path / "train.jsonl").write_text("{}\n")
    (tmp_path / "val.jsonl").write_text("{}\n")
    built = {"built_for": {"suite": suite_hashes(str(tmp_path)), "snapshot_tokens": 0, "max_length": 2048}}
    assert bases_mismatch(built, str(tmp_path), 0, 2048) is None
    assert bases_mismatch(built, str(tmp_path), 0, 2048, 256) == \
        "built with world_model hint tokens 0, the recipe has 256"
    built["built_for"]["hint_tokens"] = 256
    assert bases_mismatch(built, str(tmp_path), 0, 2048, 256) is None
    assert "hint tokens 256, the recipe has 0" in bases_mismatch(built, str(tmp_path), 0, 2048)
