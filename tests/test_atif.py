"""Harbor jobs in (obsspec/atif.py): reading ATIF trials of both tool-call styles, counting what
cannot be read, predicting what speculation would save on them (`obsspec simulate --from JOB`,
obsspec/sim/job.py), and training the world model on them (`obsspec train-worldmodel --data JOB`).
The fixture is 8 real trials of a public Harbor job (tests/fixtures/harbor_job/README.md)."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from obsspec.atif import read_trial, read_trials
from obsspec.cli import app
from obsspec.sim.config import SimConfig
from obsspec.sim.job import RecordedJob, simulate_job

JOB = Path(__file__).parent / "fixtures" / "harbor_job" / "2026-04-15__16-35-22"


def test_a_terminus_job_reads_as_episodes_of_keystrokes_and_screens():
    trials, skipped = read_trials([str(JOB)])
    assert len(trials) == 8 and skipped == []
    assert {t.task for t in trials} == {"task_000000_659a19e1", "task_000000_c3309e5a"}
    assert all(t.reward == 1.0 and t.steps and "Task Description" in t.instruction for t in trials)
    first = trials[0].steps[0]
    assert first.style == "keystrokes" and first.commands[0].startswith("mkdir -p /home/user/scripts")
    # its five calls asked for 0.1 + 0.2 + 0.1 + 0.2 + 0.1 s of waiting; the rest of the 9.2 s gap was generation
    assert first.tool_s == pytest.approx(0.7) and first.gen_s == pytest.approx(9.212234, abs=1e-3)
    assert first.completion_tokens == 570 and "disk_monitor" in first.observation
    assert any("waits the agent asked for" in a for a in trials[0].assumed)
    # a trial folder alone, and a folder of jobs, read the same
    assert read_trial(trials[0].path).steps[0].commands == first.commands
    assert len(read_trials([str(JOB.parent)])[0]) == 8


def bash_trial(root: Path, name: str, steps: list, version: str = "ATIF-v1.6") -> Path:
    folder = root / name
    (folder / "agent").mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"task_name": "t1", "verifier_result": {"rewards": {"reward": 0.0}}}))
    (folder / "agent" / "trajectory.json").write_text(json.dumps({"schema_version": version, "session_id": "s",
                                                                  "agent": {"name": "a", "version": "1"},
                                                                  "steps": steps}))
    return folder


def test_a_bash_tool_trial_reads_its_commands_outputs_and_recorded_times(tmp_path):
    steps = [{"step_id": 1, "source": "user", "message": "Do it.", "timestamp": "2026-01-01T00:00:00Z"},
             {"step_id": 2, "source": "agent", "message": "", "timestamp": "2026-01-01T00:00:02Z",
              "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {"command": "ls"}}],
              "observation": {"results": [{"source_call_id": "c1", "content": "a.txt\n"}]},
              "metrics": {"completion_tokens": 12, "prompt_tokens": 40}, "extra": {"tool_sec": 1.5}},
             {"step_id": 3, "source": "agent", "message": "done", "timestamp": "2026-01-01T00:00:04.5Z"}]
    trial = read_trial(str(bash_trial(tmp_path, "t1__a", steps)))
    assert [(s.commands, s.observation, s.tool_s, s.gen_s, s.style) for s in trial.steps] == \
        [(["ls"], "a.txt\n", 1.5, 2.0, "bash")]
    assert trial.reward == 0.0 and trial.instruction == "Do it."


@pytest.mark.parametrize("change, why", [
    (lambda d: d.update(schema_version="ATIF-v9.0"), "unknown ATIF schema version"),
    (lambda d: d["steps"][1].update(source="robot"), "step 2: malformed"),
    (lambda d: d["steps"][1].update(timestamp="yesterday"), "not ISO 8601"),
    (lambda d: d["steps"][1].update(tool_calls="ls"), "malformed tool_calls"),
])
def test_an_unreadable_trial_is_one_counted_line(tmp_path, change, why):
    job = tmp_path / "job"
    shutil.copytree(JOB, job)
    bad = sorted(job.glob("task_*"))[0]
    data = json.loads((bad / "agent" / "trajectory.json").read_text())
    change(data)
    (bad / "agent" / "trajectory.json").write_text(json.dumps(data))
    (sorted(job.glob("task_*"))[1] / "agent" / "trajectory.json").write_text("{not json")
    trials, skipped = read_trials([str(job)])
    assert len(trials) == 6 and len(skipped) == 2
    assert why in skipped[0][1] and "JSONDecodeError" in skipped[1][1]


def test_the_model_free_tiers_are_counted_per_step():
    job = RecordedJob.load([str(JOB)])
    m = job.measured()
    assert m["trials"] == 8 and m["tasks"] == 2 and m["steps"] == sum(len(t.steps) for t in job.trials)
    # the trials of one task typed the same first commands and saw the same screen only if the
    # terminal showed nothing that differs (prompts carry the container's hostname): counted, not assumed
    assert set(m["model_free_hits"]) == {"empty", "repeat", "sibling"}
    assert 0.0 <= m["model_free_share"] <= 1.0 and m["tokens_per_s"] > 10


def test_simulate_from_a_job_predicts_with_intervals_per_task_and_says_what_it_assumed(tmp_path):
    result = simulate_job(SimConfig(), [str(JOB)], {"workload.concurrency": [1, 8]}, str(tmp_path / "sim"), seeds=4)
    assert len(result["rows"]) == 2
    for row in result["rows"]:
        for key in ("episode_latency_reduction", "step_makespan_reduction"):
            assert row[key]["ci95"] is not None and len(row[key]["runs"]) == 4
        assert set(row["by_task"]) == {"task_000000_659a19e1", "task_000000_c3309e5a"}
    assert any("world model" in a for a in result["assumed"])
    # tools of a fraction of a second beside generations of seconds: little to hide, whatever the hit rate
    assert all(abs(r["episode_latency_reduction"]["mean"]) < 0.1 for r in result["rows"])
    out = CliRunner().invoke(app, ["simulate", "--from", str(JOB), "--seeds", "2", "--out", str(tmp_path / "cli"),
                                   "--grid", "workload.concurrency=4"])
    assert out.exit_code == 0, out.output
    assert "8 trials of 2 tasks" in out.output and "assumed:" in out.output and "step makespan" in out.output
    assert json.loads((tmp_path / "cli" / "simulate.json").read_text())["from_job"] == [str(JOB)]


def test_simulate_from_a_folder_without_trials_is_one_line(tmp_path):
    out = CliRunner().invoke(app, ["simulate", "--from", str(tmp_path)])
    assert out.exit_code == 2 and "Traceback" not in out.output


def test_train_worldmodel_takes_a_harbor_job_as_data_from_a_folder_without_runs(tmp_path, monkeypatch):
    """--data alone is enough: no runs/ in the working directory, no rollout.tasks_dir; tasks are
    held out whole (every trial of a held-out task on the held-out side)."""
    from obsspec.worldmodel import data

    monkeypatch.chdir(tmp_path)
    episodes = data.load_episodes([str(JOB)])
    assert len(episodes) == 8 and all(e.reference["steps"] for e in episodes)
    train, held = data.split_by_task(episodes, 0.5, 0)
    assert train and held and not {e.task_id for e in train} & {e.task_id for e in held}


def test_the_world_models_base_comes_from_the_data_s_suite_not_runs_tasks(tmp_path, monkeypatch):
    """`--data SUITE` with no rollout.tasks_dir: the kit is checked against SUITE (it said 'runs/tasks: no
    trajectories.jsonl'); Harbor jobs alone: the bases as shipped, no suite needed."""
    import obsspec.build as build
    from obsspec.config import load_recipe
    from obsspec.progress import NullDisplay
    from obsspec.worldmodel.run import base_model_path

    recipe = load_recipe(str(Path(__file__).parent.parent / "recipes" / "tiny-cpu.yaml"))
    monkeypatch.chdir(tmp_path)
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "trajectories.jsonl").write_text("")
    (suite / "manifest.json").write_text("{}")
    seen = []
    monkeypatch.setattr(build, "kit_for", lambda recipe, tasks_dir, display: seen.append(tasks_dir) or
                        type("K", (), {"world_model": "wm"})())
    assert base_model_path(recipe, NullDisplay(), [str(suite)]) == "wm" and seen == [str(suite)]
    path = base_model_path(recipe, NullDisplay(), [str(JOB)])
    assert seen == [str(suite)] and path.endswith("world_model")


# ---------------------------------------------------------------------------------------------
# obsspec's episodes out, as Harbor trial folders


def test_rollout_episodes_are_written_as_atif_that_harbor_validates_and_we_read_back(tmp_path):
    from harbor.models.trajectories import Trajectory as HarborTrajectory
    from harbor.models.trial.result import TrialResult

    from rundirs import rollout_dir

    run = rollout_dir(str(tmp_path / "run"))
    for mode in ("sequential", "speculative"):
        folders = sorted((tmp_path / "run" / "atif" / mode).iterdir())
        assert len(folders) == 4
        for folder in folders:
            doc = json.loads((folder / "agent" / "trajectory.json").read_text())
            HarborTrajectory.model_validate(doc)  # harbor's own ATIF model: raises on any defect
            TrialResult.model_validate_json((folder / "result.json").read_text())
        trials, skipped = read_trials([str(tmp_path / "run" / "atif" / mode)])
        assert skipped == [] and len(trials) == 4
        ours = [json.loads(line) for line in (tmp_path / "run" / f"trajectories-{mode}.jsonl").read_text().splitlines()]
        for trial, traj in zip(trials, sorted(ours, key=lambda t: f"{t['task_id']}__e{t['episode']}")):
            bash = [t for t in traj["turns"] if t["kind"] == "bash"]
            assert [s.commands[0] for s in trial.steps] == [t["command"] for t in bash]
            assert [s.observation for s in trial.steps] == [t["observation"] for t in bash]
            assert [s.tool_s for s in trial.steps] == pytest.approx([t["tool_sec"] for t in bash], abs=1e-3)
    spec = json.loads(next((tmp_path / "run" / "atif" / "speculative").iterdir()).joinpath(
        "agent", "trajectory.json").read_text())
    extras = [s["extra"]["obsspec"] for s in spec["steps"] if s["source"] == "agent"]
    assert {"speculation", "draft_source", "tool_sec"} <= set(extras[0])
    assert any(e["speculation"] == "match" and e.get("hidden_sec") is not None for s in
               (tmp_path / "run" / "atif" / "speculative").iterdir()
               for e in [st["extra"]["obsspec"] for st in json.loads((s / "agent" / "trajectory.json").read_text())["steps"]
                         if st["source"] == "agent"]), "no match recorded what it hid"
    assert all(e["speculation"] == "match" for e in extras if "hidden_sec" in e)
    assert run


def _trial(folder: Path, task: str, steps: list[tuple[str, str]]) -> None:
    """A trial of bash steps (command, output) as an ATIF trajectory."""
    doc = {"schema_version": "ATIF-v1.6", "session_id": folder.name, "agent": {"name": "a", "version": "1"},
           "steps": [{"step_id": 1, "timestamp": "2026-01-01T00:00:00+00:00", "source": "user", "message": "do"}]}
    for i, (command, output) in enumerate(steps):
        doc["steps"].append({
            "step_id": i + 2, "timestamp": f"2026-01-01T00:00:{2 * i + 2:02d}+00:00", "source": "agent", "message": "",
            "tool_calls": [{"tool_call_id": f"c{i}", "function_name": "bash", "arguments": {"command": command}}],
            "observation": {"results": [{"source_call_id": f"c{i}", "content": output}]},
            "metrics": {"completion_tokens": 10}, "extra": {"tool_sec": 1.0}})
    (folder / "agent").mkdir(parents=True)
    (folder / "agent" / "trajectory.json").write_text(json.dumps(doc))
    (folder / "result.json").write_text(json.dumps({"task_name": task, "trial_name": folder.name}))


def test_a_sibling_hit_needs_an_earlier_sibling_and_empty_and_repeated_outputs_count(tmp_path):
    """Three trials of one task run `ls` and see the same listing: the first has nobody's result to
    take, the other two take it (2 sibling hits, not 3). An empty output and an output seen before
    in the same trial are hits of their own tiers."""
    for i in range(3):
        _trial(tmp_path / f"t{i}", "task-a", [("ls", "a.txt\n"), ("touch b", ""), (f"cat a.txt # {i}", "a.txt\n")])
    job = RecordedJob.load([str(tmp_path)])
    assert job.measured()["model_free_hits"] == {"empty": 3, "repeat": 3, "sibling": 2}
