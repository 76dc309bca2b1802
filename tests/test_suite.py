"""prepare-tasks internals: splits, resuming after a crash, failing fast without a sandbox."""

import asyncio
import json
import re

import pytest

from obsspec.config import TasksConfig, load_recipe
from obsspec.env import suite
from obsspec.env.episode import EpisodeRecord, Step
from obsspec.env.sandbox import SandboxConfig, SandboxUnavailable
from obsspec.progress import NullDisplay


def test_split_is_per_family_seeded_and_disjoint():
    tasks, _ = suite.generate_builtin(TasksConfig(num_instances=88))
    train, val = suite.split(tasks, 0.25, seed=1)
    assert {t.task_id for t in train}.isdisjoint({t.task_id for t in val})
    assert len(train) + len(val) == len(tasks)
    assert {t.family for t in val} == {t.family for t in tasks}
    assert suite.split(tasks, 0.25, seed=1) == (train, val)
    assert suite.split(tasks, 0.25, seed=2) != (train, val)


def test_interleave_spreads_every_kind_over_the_run():
    # dir-stats asks one of five numbers; a training run takes its tasks in this order, so every
    # stretch of it must hold each kind in proportion (a plain shuffle can give one third of a short
    # run most of the hard kind, and the reward curve then shows the draw, not the policy).
    tasks = [suite.builtin_task("dir-stats", i) for i in range(200)] + \
            [suite.builtin_task("sed-replace", i) for i in range(50)]
    order = suite.interleave(tasks, seed=0)
    assert sorted(t.task_id for t in order) == sorted(t.task_id for t in tasks)
    assert order == suite.interleave(tasks, seed=0) and order != suite.interleave(tasks, seed=1)
    share = {k: sum((t.family, t.kind) == k for t in tasks) / len(tasks) for k in {(t.family, t.kind) for t in tasks}}
    assert len(share) == 6 and ("dir-stats", "lines") in share and ("sed-replace", "") in share
    for start in range(0, 250, 25):
        window = order[start:start + 25]
        for k, p in share.items():
            assert abs(sum((t.family, t.kind) == k for t in window) - 25 * p) <= 1.5, (start, k)


def test_interrupted_validation_resumes_without_rerunning(tmp_path, monkeypatch):
    tasks, _ = suite.generate_builtin(TasksConfig(num_instances=3, families=("count-lines",)))
    checkpoint = str(tmp_path / "validation.partial.jsonl")
    calls = []

    async def fake_validate(task, config, determinism, cheat_audit="off"):
        calls.append(task.task_id)
        rec = EpisodeRecord(task.task_id, [Step("ls", "a\n\n(exit_code=0)", 0, 0.01)], 1.0)
        return suite.Validation(task, reference=rec, idle=EpisodeRecord(task.task_id, [], 0.0))

    monkeypatch.setattr(suite, "validate_task", fake_validate)
    cfg = SandboxConfig()
    first = asyncio.run(suite.validate_all(tasks[:2], cfg, 2, False, NullDisplay(), checkpoint))
    assert len(calls) == 2
    with open(checkpoint, "a") as f:
        f.write('{"key": "cut short by a cra')  # a torn last line must not break the resume
    again = asyncio.run(suite.validate_all(tasks, cfg, 2, False, NullDisplay(), checkpoint))
    assert calls == [tasks[0].task_id, tasks[1].task_id, tasks[2].task_id]
    assert again[0].reference == first[0].reference and again[0].reference.steps[0].seconds == 0.01


def test_a_task_the_sandbox_refuses_is_dropped_and_the_others_finish():
    """A task with a workdir the sandbox refuses (an imported WORKDIR /tmp) raised out of the
    gather and left its siblings hanging mid-start: prepare-tasks never ended."""
    import dataclasses

    tasks, _ = suite.generate_builtin(TasksConfig(num_instances=2, families=("count-lines",)))
    bad = dataclasses.replace(tasks[0], task_id="bad")
    object.__setattr__(bad, "workdir", "/tmp")  # (a Task refuses it when made: past that check)
    cfg = SandboxConfig(timeout_s=5, memory_mb=512, max_procs=32)
    got = asyncio.run(asyncio.wait_for(suite.validate_all([bad, *tasks], cfg, 3, False, NullDisplay()), 120))
    assert got[0].problem.startswith("could not be run: ValueError: task workdir must be")
    assert [v.problem for v in got[1:]] == ["", ""]


def test_infrastructure_failures_are_not_cached(tmp_path, monkeypatch):
    tasks, _ = suite.generate_builtin(TasksConfig(num_instances=1, families=("count-lines",)))
    checkpoint = tmp_path / "cp.jsonl"

    async def broken(task, config, determinism, cheat_audit="off"):
        rec = EpisodeRecord(task.task_id, [], None, "sandbox died")
        return suite.Validation(task, reference=rec, problem="reference episode failed")

    monkeypatch.setattr(suite, "validate_task", broken)
    asyncio.run(suite.validate_all(tasks, SandboxConfig(), 1, False, NullDisplay(), str(checkpoint)))
    assert checkpoint.read_text() == ""


def test_prepare_fails_fast_when_sandboxes_cannot_start(tmp_path, monkeypatch):
    import obsspec.env.sandbox as sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    recipe = load_recipe(None, ["tasks.num_instances=2"])
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        asyncio.run(suite.prepare_tasks(recipe.tasks, recipe.sandbox, str(tmp_path / "out"), NullDisplay()))


def test_a_verifier_time_limit_is_kept_and_absent_when_unset():
    """Tasks without their own verifier limit write what they wrote before the field existed (their
    suites and content hashes unchanged); one with it keeps it through JSON."""
    import dataclasses

    from obsspec.env.suite import builtin_task
    from obsspec.env.task import Task

    task = builtin_task("dir-stats", 1)
    assert "verify_timeout_s" not in task.to_dict()
    timed = dataclasses.replace(task, verify_timeout_s=90.0)
    assert timed.to_dict()["verify_timeout_s"] == 90.0 and timed.content_hash() != task.content_hash()
    assert Task.from_dict(json.loads(json.dumps({**task.to_dict(), "verify_timeout_s": 90}))) == timed


def test_a_hand_written_suite_line_of_the_wrong_shape_is_one_line_naming_it(tmp_path):
    """Bad input in a suite file stops loading with the file, the line and the field, before
    anything runs (a string `max_turns` used to load, a number `kind` to fail later in a sort)."""
    from obsspec.env.suite import SuiteError, builtin_task
    from test_cli import cli

    good = builtin_task("dir-stats", 1).to_dict()
    cases = {
        '{"kind": 3}': "task field 'kind' must be a string",
        '{"max_turns": "zz"}': "task field 'max_turns' must be a positive integer",
        '{"solution": "ls"}': "task field 'solution' must be a list of strings",
        '{"files": {"a.txt": 1}}': "task field 'files' must be an object of texts or {sha256, size} blobs",
        '{"files": {"a.txt": {"sha256": "x", "size": 1}}}': "task field 'files' must be an object of texts",
        '{"surprise": 1}': "unknown task fields: ['surprise']",
        '{"verify_timeout_s": -1}': "task field 'verify_timeout_s' must be a number of seconds >= 0",
        '{"verify_timeout_s": NaN}': "task field 'verify_timeout_s' must be a number of seconds >= 0",
        '{"verify_timeout_s": true}': "task field 'verify_timeout_s' must be a number of seconds >= 0",
    }
    for patch, message in cases.items():
        path = tmp_path / "train.jsonl"
        path.write_text(json.dumps(good) + "\n" + json.dumps({**good, **json.loads(patch)}) + "\n")
        with pytest.raises(SuiteError, match=re.escape(f"train.jsonl:2: not a task: {message}")):
            suite.load_tasks(str(path))
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(SuiteError, match="train.jsonl:2: not a task: Expecting property name"):
        suite.load_tasks(str(tmp_path))
    missing = {k: v for k, v in good.items() if k != "verify"}
    path.write_text(json.dumps(missing) + "\n")
    with pytest.raises(SuiteError, match=r"task fields missing: \['verify'\]"):
        suite.load_tasks(str(path))
    path.write_text(json.dumps({**good, "max_turns": "zz"}) + "\n")
    r = cli("shell", good["task_id"], "--tasks", str(path), "-c", "ls")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "not a task: task field 'max_turns'" in lines[0], r.stderr


def test_garbled_lines_of_suite_files_are_one_line_errors_or_skipped(tmp_path):
    """Non-UTF-8 bytes and JSON lines that are not objects were tracebacks."""
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"task_id": "caf\xe9"}\n')
    with pytest.raises(suite.SuiteError, match="t.jsonl:1: not a task"):
        suite.load_tasks(str(p))
    cp = tmp_path / "validation.partial.jsonl"
    cp.write_bytes(b'[1, 2]\n"str"\n\xff\n{"key": "k"}\n')
    assert list(suite._load_checkpoint(str(cp))) == ["k"]


def test_spread_takes_evenly_from_the_whole_list():
    spread = suite.spread
    items = list(range(10))
    assert spread(items, 5) == [0, 2, 4, 6, 8]
    # more than half: still from the whole list, not its first n (a family-grouped suite's first
    # n items would leave its last families out)
    assert spread(items, 7) == [0, 1, 2, 4, 5, 7, 8]
    assert spread(items, 10) == items
    assert spread(items, 12) == items + [0, 1]  # wraps around
    assert spread([], 3) == []
