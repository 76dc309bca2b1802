"""`obsspec rollout` end to end on a micro model kit: both modes, traces, replay, bad input."""

import json
import os
import shutil

import pytest

from test_cli import ROOT, cli

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")]

MICRO = ["kit.vocab_size=600", "kit.max_length=1024"] + [
    f"kit.{m}.{k}={v}" for m in ("policy", "world_model") for k, v in
    (("hidden_size", 32), ("num_layers", 1), ("num_heads", 2), ("num_kv_heads", 1), ("head_dim", 16),
     ("intermediate_size", 64), ("epochs", 0.3), ("batch_size", 4))] + [
    # enough for the micro policy to write bash calls (greedily), so there is something to speculate on
    "kit.policy.hidden_size=64", "kit.policy.head_dim=32", "kit.policy.epochs=40",
    "kit.policy.learning_rate=0.01", "policy.temperature=0",
    # per-request passes: what these tests compare token for token never depends on the batch
    "policy.batch_invariant=true"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollout")
    tasks = root / "tasks"
    r = cli("prepare-tasks", "recipes/tiny-cpu.yaml", "tasks.num_instances=12", "tasks.families=[count-lines]",
            "tasks.val_fraction=0",
            "tasks.determinism_check=false", "--out", str(tasks), "--display", "none")
    assert r.returncode == 0, r.stderr[-2000:]
    common = ["recipes/tiny-cpu.yaml", f"rollout.tasks_dir={tasks}", f"rollout.kit_cache={root / 'kit'}",
              "rollout.split=train", "rollout.num_tasks=2", "train.group_size=2", "policy.max_turns=3",
              "policy.max_new_tokens=48", "policy.max_context=1024", "sandbox.output_cap=200",
              "world_model.max_tokens=264",
              # four episodes share one engine, so the recipe's load gate would skip every draft
              "rollout.busy_limit=0", "rollout.pairs=1", *MICRO]
    # The history cache, one episode at a time: a group member repeats what the one before it
    # ran (greedy), so drafts arrive before the tool and speculation really runs (the micro world
    # model's drafts rarely do).
    r = cli("rollout", *common, "rollout.predictor=history", "rollout.concurrency=1", "rollout.pairs=2",
            "--mode", "both", "--out", str(root / "run"), "--display", "plain")
    assert r.returncode == 0, r.stderr[-3000:]
    return root, common, r


def test_both_modes_side_by_side_and_token_identical(run_dir):
    root, _, r = run_dir
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert set(summary["modes"]) == {"sequential", "speculative"}
    assert summary["comparison"]["token_identical"] is True
    assert summary["episodes"] == 4 and summary["modes"]["speculative"]["predictor"] == "history"
    assert "token-identical: yes" in r.stdout and "latency p95" in r.stdout
    # two pairs in alternating order: a reduction each, an interval, a verdict
    comp = summary["comparison"]
    assert comp["pairs"] == 2 and len(comp["reduction_per_pair"]) == 2 and comp["reduction_ci95"] is not None
    assert comp["verdict"] in ("gain", "loss", "not resolvable here")
    assert "95 % interval over 2 alternating pairs" in r.stdout and comp["verdict"] in r.stdout
    assert summary["modes"]["sequential"]["committed_delay_frac"] is not None
    # Identity says nothing if speculation never ran: drafts arrived ahead of the tool, the
    # policy generated on them, and some were kept, in this very run.
    events = [json.loads(x) for x in (root / "run" / "trace-speculative.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds.count("spec_start") > 0 and kinds.count("match") > 0, \
        f"no speculation happened: {kinds.count('spec_start')} speculative starts, {kinds.count('match')} matches"
    for name in ("episodes.jsonl", "trajectories-sequential.jsonl", "trajectories-speculative.jsonl",
                 "trace-sequential.jsonl", "trace-speculative.jsonl"):
        assert (root / "run" / name).exists(), name
    chrome = json.loads((root / "run" / "trace.json").read_text())
    assert any(e.get("name") == "policy" for e in chrome["traceEvents"])
    traj = json.loads((root / "run" / "trajectories-speculative.jsonl").read_text().splitlines()[0])
    assert len(traj["ids"]) == len(traj["policy_mask"]) == len(traj["wm_mask"]) == len(traj["logprobs"])


def test_replay_reuses_the_recorded_episodes(run_dir):
    root, common, _ = run_dir
    r = cli("rollout", *common, "rollout.predictor=oracle", "--mode", "both",
            "--replay", str(root / "run"), "--out", str(root / "replay"), "--display", "none")
    assert r.returncode == 0, r.stderr[-3000:]
    replay = json.loads((root / "replay" / "summary.json").read_text())
    original = [json.loads(x) for x in (root / "run" / "trajectories-sequential.jsonl").read_text().splitlines()]
    again = [json.loads(x) for x in (root / "replay" / "trajectories-speculative.jsonl").read_text().splitlines()]
    assert replay["comparison"]["token_identical"] and replay["replay_of"] == str(root / "run")
    assert [t["ids"] for t in again] == [t["ids"] for t in original]
    # Speculation really happened: the oracle's drafts arrived first, matched, and the policy's
    # next actions were generated on them (token identity alone would also hold with it off).
    spec = replay["modes"]["speculative"]
    events = [json.loads(x) for x in (root / "replay" / "trace-speculative.jsonl").read_text().splitlines()]
    starts = sum(e["kind"] == "spec_start" for e in events)
    matches = sum(e["kind"] == "match" for e in events)
    assert starts > 0 and matches > 0, f"no speculation happened: {starts} speculative starts, {matches} matches"
    assert spec["spec/exact_frac"] == 1.0, "an oracle replay's drafts are the recorded observations"


def test_a_run_replays_from_its_own_directory(run_dir, tmp_path):
    """Replay needed the original rollout.tasks_dir again ("runs/tasks: no trajectories.jsonl"):
    the episodes' tasks are in the run, and its models.json names the kit it used."""
    root, common, _ = run_dir
    bare = [os.path.join(ROOT, c) if c.endswith(".yaml") else c for c in common
            if not c.startswith(("rollout.tasks_dir=", "rollout.kit_cache="))]
    r = cli("rollout", *bare, "rollout.predictor=oracle", "--mode", "speculative", "--replay", str(root / "run"),
            "--out", str(tmp_path / "replay"), "--display", "none", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (tmp_path / "runs").exists(), "the replay prepared a suite or built a kit of its own"
    original = [json.loads(x)["ids"] for x in (root / "run" / "trajectories-sequential.jsonl").read_text().splitlines()]
    again = [json.loads(x)["ids"] for x in (tmp_path / "replay" / "trajectories-speculative.jsonl").read_text().splitlines()]
    assert again == original


def test_rollout_bad_inputs_are_one_line(run_dir, tmp_path):
    root, common, _ = run_dir
    r = cli("rollout", *common, "--replay", str(tmp_path), "--out", str(tmp_path / "x"), "--display", "none")
    assert r.returncode == 2 and "not a rollout run directory" in r.stderr
    shutil.copytree(root / "run", tmp_path / "broken")
    (tmp_path / "broken" / "models.json").write_text("[]")
    r = cli("rollout", *common, "--replay", str(tmp_path / "broken"), "--out", str(tmp_path / "w"), "--display", "none")
    assert r.returncode == 2 and "not the models of a rollout run" in r.stderr and "Traceback" not in r.stderr
    r = cli("rollout", *common, "rollout.predictor=oracle", "--mode", "speculative", "--display", "none",
            "--out", str(tmp_path / "y"))
    assert r.returncode == 2 and "needs recorded observations" in r.stderr
    r = cli("rollout", *common, "rollout.depth=0", "--display", "none")
    assert r.returncode == 2 and "rollout.depth" in r.stderr and ">= 1" in r.stderr
    r = cli("rollout", *common, "rollout.split=val", "--display", "none", "--out", str(tmp_path / "z"))
    assert r.returncode == 2 and "the val split has no tasks" in r.stderr
