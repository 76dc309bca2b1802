"""The workspace snapshot ahead of the world model's context (`world_model.workspace_snapshot`).

- the snapshot is the sandbox's own `ls -lR` (what the agent's `ls -l` prints is a span of it),
  then the small files' contents; deterministic, bounded by its token budget with a visible
  marker when cut; a task with a setup (built-in or an imported Harbor setup.sh) is captured
  after it;
- the prefix reaches the world model's request when on, and nothing changes when off;
- one prompt construction: training rows, evaluation cases and the rollout's drafts agree;
- lossless: a speculative rollout with the switch on is token-identical to sequential;
- bad budgets are one clear line.
The policy is the scripted engine of tests/fakes.py; the world model a fake engine that answers
right only when it reads the task's snapshot ahead of a context it has seen.

Run: .venv/bin/python -m pytest -q tests/test_snapshot.py
"""

from __future__ import annotations

import asyncio
import shutil

import pytest

from fakes import ByteTokenizer, PlainEngine, ScriptedPolicy
from obsspec import chat
from obsspec.config import ConfigError, load_recipe
from obsspec.engines.base import Generation
from obsspec.env.harbor import import_harbor
from obsspec.env.suite import builtin_task
from obsspec.worldmodel.cases import trajectory_cases
from obsspec.models.warmstart import trajectory_examples
from obsspec.rollout.events import EventBus
from obsspec.rollout.predictors import PredictRequest, WorldModelPredictor
from obsspec.rollout.scheduler import Sampling, Scheduler
from obsspec.rollout.tools import EmulatedLatency, SandboxTool
from obsspec.tokens import ChatFormat
from obsspec.worldmodel import snapshot as S
from obsspec.worldmodel.views import WorkspaceSnapshots
from test_rollout import COMMANDS, SANDBOX, Recording, assert_accounted, assert_lossless, tasks

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture(scope="module")
def fmt():
    return ChatFormat(ByteTokenizer())


# ------------------------------------------------------------------------------ the snapshot


def test_snapshot_renders_the_listing_then_small_files_and_is_bounded(fmt):
    listing = ".:\ntotal 0\ndrwxr-xr-x 2 agent agent 80 Jan  1 00:00 data\n\n./data:\ntotal 4\n" \
              "-rw-r--r-- 1 agent agent 2 Jan  1 00:00 a.txt\n"
    ws = S.Workspace(listing, (S.Entry("data", 0o40755, 0), S.Entry("data/a.txt", 0o100644, 2, "y\n"),
                               S.Entry("data/big.bin", 0o100644, 9000), S.Entry("data/b.txt", 0o100644, 1, "z")))
    text = S.render(ws, "/app")
    assert text == ("/app before the first command:\n$ ls -lR\n" + listing +
                    "\n==> data/a.txt <==\ny\n\n==> data/b.txt <==\nz\n"), text
    full = S.snapshot_ids(fmt, text, 32768)
    assert S.TRUNCATED not in fmt.decode(full) and fmt.decode(full).startswith(S.OPEN)
    for budget in (64, 100, 133):
        ids = S.snapshot_ids(fmt, text, budget)
        assert len(ids) == budget, "a cut snapshot uses its budget, never more"
        assert S.TRUNCATED in fmt.decode(ids) and fmt.decode(ids).endswith(S.CLOSE)
        assert ids == S.snapshot_ids(fmt, text, budget)


@needs_bwrap
def test_the_listing_is_what_the_agents_own_ls_prints_and_contents_are_the_files():
    """What makes the snapshot copyable: `ls -l data` of the agent is a span of it, byte for byte
    (padding, owners, pinned dates, `total` lines), and `cat` of a small file is its contents."""
    from obsspec.env.episode import run_scripted

    plain = builtin_task("dir-stats", 3)
    assert not plain.setup
    ws = asyncio.run(S.capture_workspace(plain, SANDBOX))
    assert ws == asyncio.run(S.capture_workspace(plain, SANDBOX)), "the snapshot is not deterministic"
    record = asyncio.run(run_scripted(plain, ["ls -l data", "ls -l"], SANDBOX, verify=False))
    for step in record.steps:
        body = step.observation.rsplit("\n(exit_code=", 1)[0].rstrip("\n") + "\n"
        assert body in ws.listing, f"`{step.command}` of the agent is not a span of the snapshot:\n{body}"
    contents = {e.path: e.content for e in ws.entries if e.content is not None}
    assert contents == plain.files, "the snapshot's contents are not the task's files"
    assert [e.path for e in ws.entries] == sorted(e.path for e in ws.entries)
    made = builtin_task("find-by-size", 1)  # all its files come from setup
    assert made.setup and not made.files
    ws = asyncio.run(S.capture_workspace(made, SANDBOX))
    assert ws.entries and any(e.size > 0 for e in ws.entries) and "total" in ws.listing
    harbor = {t.task_id: t for t in import_harbor("tasks/harbor-examples").tasks}
    words = next(t for t in harbor.values() if "setup.sh" not in t.files and t.setup)
    text = S.render(asyncio.run(S.capture_workspace(words, SANDBOX)), words.workdir)
    assert "==> docs/a.txt <==\nthe quick brown fox\njumps over\n" in text, text
    assert "./docs:\n" in text, text


# ------------------------------------------------------------------ the world model's request


class FakeWorldModel(PlainEngine):
    """Records every request; answers `answers[prompt]` (a case's prompt in the task's view),
    else a wrong body."""

    def __init__(self, tok, answers=None):
        self.tok, self.answers = tok, answers or {}
        self.prompts: list[tuple[int, ...]] = []

    async def generate(self, request):
        prompt = tuple(request.prompt_ids)
        self.prompts.append(prompt)
        body = self.answers.get(prompt, "wrong\n(exit_code=0)")
        ids = tuple(self.tok.encode(body + chat.OBS_CLOSE))
        return Generation(request.request_id, ids, (0.0,) * len(ids), "stop")


@needs_bwrap
def test_prefix_reaches_the_request_when_on_and_not_when_off(fmt):
    task = builtin_task("dir-stats", 3)
    context = tuple(fmt.wm_prompt_ids(fmt.prompt_ids(task.instruction), fmt.action_ids(chat.render_bash("ls"))))
    request = PredictRequest(task.content_hash(), task.task_id, 0, 0, ("ls",), context, task)
    off = FakeWorldModel(fmt.tokenizer)
    asyncio.run(WorldModelPredictor(off, fmt, cap=512).predict(request))
    assert off.prompts == [context], "with the switch off the request is not the context itself"
    on = FakeWorldModel(fmt.tokenizer)
    snaps = WorkspaceSnapshots(fmt, 300, SANDBOX)
    asyncio.run(WorldModelPredictor(on, fmt, cap=512, snapshots=snaps).predict(request))
    expected = asyncio.run(S.workspace_snapshot(task, fmt, 300, SANDBOX))
    assert on.prompts == [tuple(expected) + context], "the snapshot is not ahead of the context"
    with pytest.raises(ValueError, match="needs each request's task"):
        asyncio.run(WorldModelPredictor(on, fmt, cap=512, snapshots=snaps).predict(
            PredictRequest("", "", 0, 0, ("ls",), context)))


# ---------------------------------------------------------------- rollouts with the switch on

SAMPLING = Sampling(max_turns=4, max_new_tokens=400, max_context=6000, seed=5)


def rollout(task_list, speculative, predictor=None):
    tok = ByteTokenizer()
    fmt = ChatFormat(tok)
    bus = EventBus()
    rec = Recording()
    bus.subscribe(rec)
    sched = Scheduler(ScriptedPolicy(tok, COMMANDS), fmt, bus, SAMPLING, cap=SANDBOX.output_cap, predictor=predictor)
    episodes = [t for t in task_list for _ in range(2)]  # GRPO groups of two: one prefix each
    make_tool = lambda task, episode: SandboxTool(task, episode, SANDBOX, EmulatedLatency("fixed", 0.05))
    return asyncio.run(sched.run_batch(episodes, make_tool, speculative)), rec


@needs_bwrap
@pytest.mark.parametrize("budget,hint_tokens", [(400, 0), (0, 256), (400, 256)], ids=["snapshot", "hints", "both"])
def test_switch_on_is_lossless_and_rows_cases_and_drafts_agree(fmt, budget, hint_tokens):
    ts = tasks(3)
    seq, _ = rollout(ts, speculative=False)
    snaps = WorkspaceSnapshots(fmt, budget, SANDBOX, hint_tokens)
    table = asyncio.run(snaps.table(ts))
    # the fake world model knows each real observation by its prompt in the task's view: it hits
    # only when the rollout asks with exactly the prompt an evaluation case has
    answers = {c.prompt_ids: c.body for c in trajectory_cases(fmt, seq, table)}
    wm = FakeWorldModel(fmt.tokenizer, answers)
    spec, rec = rollout(ts, speculative=True, predictor=WorldModelPredictor(wm, fmt, cap=SANDBOX.output_cap,
                                                                             snapshots=snaps))
    assert_lossless(seq, spec)
    assert_accounted(rec)
    assert rec.kinds()["match"] > 0, "no draft matched: the view did not reach the world model"
    prefixes = {tid: v.prefix for tid, v in table.items()}
    if budget:
        assert len(set(prefixes.values())) == len(ts) and all(0 < len(v) <= 400 for v in prefixes.values())
    else:
        assert set(prefixes.values()) == {()}
    # One prompt construction: each training row's target starts right after the very prompt the
    # rollout's world model was given, and each evaluation case has that prompt too.
    rows = trajectory_examples(spec, 10**6, snaps.prefixes(spec))
    cases = trajectory_cases(fmt, spec, table)
    assert len(rows) == len(spec)
    contexts = []
    for row in rows:
        m = row["completion_mask"]
        contexts += [tuple(row["input_ids"][:i]) for i in range(1, len(m)) if m[i] and not m[i - 1]]
    assert contexts == [c.prompt_ids for c in cases]
    assert set(contexts) <= set(wm.prompts), "a training context is not what the rollout's world model saw"
    assert all(c[:len(prefixes[tr.task_id])] == prefixes[tr.task_id]
               for tr in spec for c in [c.prompt_ids for c in trajectory_cases(fmt, [tr], table)])
    assert all(sum(r["completion_mask"][:len(prefixes[tr.task_id])]) == 0 for r, tr in zip(rows, spec)), \
        "the snapshot became a training target"
    # every target is the trajectory's own: the view adds context, never loss
    assert [sum(r["completion_mask"]) for r in rows] == [sum(tr.wm_mask) for tr in spec]
    hinted = sum(len(r["input_ids"]) - len(tr.ids) - len(prefixes[tr.task_id]) for r, tr in zip(rows, spec))
    assert (hinted > 0) == bool(hint_tokens), "hints missing from the rows, or there without the switch"


def test_rows_without_prefixes_are_as_before(fmt):
    seq_like = [type("T", (), {"ids": [1, 2, 3, 4], "wm_mask": [0, 0, 1, 1], "task_id": "t"})()]
    assert trajectory_examples(seq_like, 100) == [{"input_ids": [1, 2, 3, 4], "completion_mask": [0, 0, 1, 1]}]
    assert trajectory_examples(seq_like, 100, [[9, 9]]) == \
        [{"input_ids": [9, 9, 1, 2, 3, 4], "completion_mask": [0, 0, 0, 0, 1, 1]}]
    assert trajectory_examples(seq_like, 5, [[9, 9]]) == [], "a row over max_length with its prefix was kept"
    with pytest.raises(ValueError, match="2 snapshot prefixes for 1 trajectories"):
        trajectory_examples(seq_like, 100, [[], []])


# ------------------------------------------------------------------------------------ recipe


def test_recipe_switch_and_its_checks():
    # with the policy's whole context: the tiny world model has the snapshot's positions on top
    rec = load_recipe("recipes/tiny-cpu.yaml", ["world_model.workspace_snapshot=true"])
    assert rec.world_model.workspace_snapshot and rec.world_model.snapshot_tokens == 512
    assert rec.policy.max_context == rec.kit.max_length
    assert not load_recipe("recipes/tiny-cpu.yaml").world_model.workspace_snapshot, "the switch is on by default"
    with pytest.raises(ConfigError, match="snapshot_tokens must be between 64 and 32768"):
        load_recipe(None, ["world_model.snapshot_tokens=0"])
    with pytest.raises(ConfigError, match="leaves no room in wm_train.max_length"):
        load_recipe(None, ["world_model.workspace_snapshot=true", "world_model.model=some/hub-model",
                           "world_model.snapshot_tokens=4096"])


# ------------------------------------------------------------------ train-worldmodel's data


def test_data_finds_the_tasks_and_puts_the_snapshot_ahead_of_rows_and_cases(fmt, tmp_path):
    import json

    from obsspec.rollout.trajectory import Trajectory, Turn
    from obsspec.worldmodel import data

    a, b = builtin_task("dir-stats", 1), builtin_task("count-lines", 2)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "train.jsonl").write_text(json.dumps(a.to_dict()) + "\n")
    steps = [{"command": c, "observation": f"out {i}\n(exit_code=0)", "exit_code": 0}
             for i, c in enumerate(a.solution)]
    (suite / "trajectories.jsonl").write_text(json.dumps(
        {"task_id": a.task_id, "instruction": a.instruction, "steps": steps}) + "\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "episodes.jsonl").write_text(json.dumps({"episode": 0, "task": b.to_dict()}) + "\n")
    tr = Trajectory.start(0, b.task_id, fmt.prompt_ids(b.instruction))
    action = fmt.action_ids(chat.render_bash("ls"))
    tr.append_action(action, [0.0] * len(action))
    ids, span = fmt.observation_ids("x\n(exit_code=0)")
    tr.append_observation(ids, span, len(fmt.obs_close_ids))
    tr.turns.append(Turn(chat.render_bash("ls"), "bash", "ls", "x\n(exit_code=0)", 0, 0.1))
    (run / "trajectories-sequential.jsonl").write_text(json.dumps(tr.to_dict()) + "\n")

    sources = [str(suite), str(run)]
    episodes = data.load_episodes(sources)
    tasks = data.source_tasks(sources)
    assert set(tasks) == {a.task_id, b.task_id}
    table = data.snapshot_table(episodes, tasks, WorkspaceSnapshots(fmt, 256, SANDBOX))
    off, _ = data.examples(fmt, episodes, 10**6)
    on, _ = data.examples(fmt, episodes, 10**6, table)
    for e, x, y in zip(episodes, off, on):
        prefix = list(table[e.task_id].prefix)
        assert y["input_ids"] == prefix + x["input_ids"], "the snapshot is not ahead of the row"
        assert y["completion_mask"] == [0] * len(prefix) + x["completion_mask"]
    cases_off, _ = data.eval_cases(fmt, episodes)
    cases_on, _ = data.eval_cases(fmt, episodes, table)
    assert len(cases_on) == len(cases_off) == len(a.solution) + 1
    assert all(y.prompt_ids[-len(x.prompt_ids):] == x.prompt_ids and len(y.prompt_ids) > len(x.prompt_ids)
               for x, y in zip(cases_off, cases_on))
    with pytest.raises(data.DataError, match=f"need each episode's task, and '{b.task_id}' has none"):
        data.snapshot_table(episodes, {a.task_id: a}, WorkspaceSnapshots(fmt, 256, SANDBOX))
    # a second suite prepared with another seed reuses the ids for other tasks: loud, not a mix-up
    other = tmp_path / "other-suite"
    other.mkdir()
    twin = builtin_task("dir-stats", 1, seed=7)
    assert twin.task_id == a.task_id and twin.files != a.files
    (other / "train.jsonl").write_text(json.dumps(twin.to_dict()) + "\n")
    (other / "trajectories.jsonl").write_text((suite / "trajectories.jsonl").read_text())
    assert set(data.source_tasks([str(suite), str(suite)])) == {a.task_id}
    with pytest.raises(data.DataError, match=f"task id '{a.task_id}' names two different tasks"):
        data.source_tasks([str(suite), str(other)])


def test_a_budget_that_does_not_fit_is_one_line_from_the_cli():
    from test_cli import cli

    for command in (["validate"], ["rollout", "--display", "none"], ["train-worldmodel", "--display", "none"]):
        r = cli(*command, "recipes/tiny-cpu.yaml", "world_model.workspace_snapshot=true",
                "world_model.snapshot_tokens=4096")
        assert r.returncode == 2, (command, r.stderr[-500:])
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "leaves no room in wm_train.max_length" in lines[0], r.stderr
