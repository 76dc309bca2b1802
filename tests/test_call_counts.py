"""Tool calls counted by form: `calls/xml`, `calls/json`, `calls/malformed` (obsspec/rollout/metrics.py)
from the scheduler's `action` events, over committed turns only, into a step's metrics.

Run: .venv/bin/python -m pytest -q tests/test_call_counts.py
"""

from __future__ import annotations

import asyncio

from fakes import ByteTokenizer, PlainEngine
from obsspec import chat
from obsspec.engines.base import Generation
from obsspec.env.task import Task
from obsspec.rollout.batch import run_episodes
from obsspec.rollout.events import Event
from obsspec.rollout.metrics import SpecMetrics
from obsspec.rollout.predictors import Oracle
from obsspec.rollout.scheduler import Sampling
from obsspec.training.rollouts import StepRollouts, merge_steps, scalar_metrics
from rundirs import FakeTool

# Turn k's reply (k = tool results so far): both forms, a reply with no call, reasoning.
TURNS = [chat.render_bash("ls", form="json"),
         "Next: " + chat.render_bash("pwd"),
         "I believe the task is finished.",
         "<think>\nNot " + chat.render_bash("rm -rf /") + " of course.\n</think>\n\n"
         + chat.render_bash("echo hi", form="json"),
         chat.render_done()]
EXPECTED = {"calls/xml": 2, "calls/json": 2, "calls/malformed": 1, "calls/malformed_frac": 0.2}
SAMPLING = Sampling(max_turns=8, max_new_tokens=400, max_context=20000, seed=5)
TASKS = [Task(f"t-{i}", "fake", "do it", ["ls"], "true") for i in range(3)]


class TurnsPolicy(PlainEngine):
    """Replies TURNS[k] after k tool results: a function of the prompt, as losslessness needs."""

    def __init__(self, tok):
        self.tok = tok

    async def generate(self, request):
        k = self.tok.decode(request.prompt_ids).count("<tool_response>")
        ids = self.tok.encode(TURNS[min(k, len(TURNS) - 1)]) + [self.tok.special["<|im_end|>"]]
        await asyncio.sleep(0.001)
        return Generation(request.request_id, tuple(ids), (0.0,) * len(ids), "stop")


def rollout(speculative: bool, predictor=None):
    from obsspec.tokens import ChatFormat

    tok = ByteTokenizer()
    return asyncio.run(run_episodes(TurnsPolicy(tok), ChatFormat(tok, tool_format="json"), TASKS,
                                    lambda task, episode: FakeTool(0.05), SAMPLING, cap=512,
                                    speculative=speculative, predictor=predictor))


def test_committed_turns_are_counted_by_form_in_both_modes():
    sequential = rollout(speculative=False)
    s = sequential.metrics.summary()
    assert {k: s[k] for k in EXPECTED} == {k: v * len(TASKS) if k != "calls/malformed_frac" else v
                                           for k, v in EXPECTED.items()}
    assert [t.kind for t in sequential.trajectories[0].turns] == ["bash", "bash", "error", "bash", "done"]
    # Speculation generates the next turn ahead, often twice over: only committed turns count.
    oracle = Oracle([(task.content_hash(), [t.command for t in tr.turns if t.kind == "bash"],
                      [t.observation for t in tr.turns if t.kind == "bash"])
                     for task, tr in zip(TASKS, sequential.trajectories)])
    speculative = rollout(speculative=True, predictor=oracle)
    spec = speculative.metrics.summary()
    assert spec["spec/exact_frac"] == 1.0 and speculative.metrics.counts["spec_start"] > 0
    assert {k: spec[k] for k in EXPECTED} == {k: s[k] for k in EXPECTED}


def test_counts_merge_over_processes_and_reach_the_steps_metrics():
    def part(*forms):
        m = SpecMetrics()
        for turn, (kind, form) in enumerate(forms):
            m(Event("action", 0.0, 0, turn, {"parsed": kind, "form": form}))
        return StepRollouts(1, [], {}, spec=m)

    one = part(("bash", "json"), ("error", "json"), ("done", "xml"))
    other = part(("error", ""), ("bash", "xml"))
    merged = merge_steps([one, other])
    row = scalar_metrics(merged.metrics)  # what metrics.jsonl and TensorBoard get
    assert {k: row[k] for k in EXPECTED} == {"calls/xml": 2, "calls/json": 1, "calls/malformed": 2,
                                             "calls/malformed_frac": 0.4}
    empty = SpecMetrics().summary()
    assert empty["calls/json"] == 0 and empty["calls/malformed_frac"] is None
