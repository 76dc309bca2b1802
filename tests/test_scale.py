"""What the scale benchmark (bench/scale.py) found, kept fixed: the open-file limit many systems
start processes with, which ~100 episodes at once exhausted; and the benchmark itself, at a size
that runs in seconds."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *sys.path[1:]])})


def test_a_batch_raises_the_open_file_limit_to_what_its_episodes_need():
    run = _python("import resource\n"
                  "resource.setrlimit(resource.RLIMIT_NOFILE, (300, 20000))\n"
                  "from obsspec.rollout.batch import allow_open_files\n"
                  "allow_open_files(256)\n"
                  "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout) >= 256 * 10, "the soft limit was left where 256 episodes run out of files"


def test_a_hard_limit_too_low_for_the_batch_is_one_line():
    run = _python("import resource\n"
                  "resource.setrlimit(resource.RLIMIT_NOFILE, (300, 400))\n"
                  "from obsspec.rollout.batch import allow_open_files\n"
                  "from obsspec.env.sandbox import SandboxUnavailable\n"
                  "try:\n    allow_open_files(1024)\n"
                  "except SandboxUnavailable as e:\n    print(e)\n")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "rollout.concurrency" in run.stdout and run.stdout.count("\n") == 1, run.stdout


def test_the_scale_benchmark_runs_and_reports_its_figures(tmp_path):
    out = tmp_path / "scale.json"
    run = subprocess.run([sys.executable, "bench/scale.py", "--episodes", "4", "--turns", "1", "--tool-s", "0.1",
                          "--gen-s", "0.01", "--modes", "speculative", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, *sys.path[1:]])})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["commit"] and result["command"].startswith(".venv/bin/python bench/scale.py")
    assert [r["mode"] for r in result["runs"]] == ["speculative"]
    for r in result["runs"]:
        assert r["turns"] == 8 and r["infra_failures"] == 0  # one command and done(), four episodes
        assert 0 < r["cpu_ms_per_turn"] and 0 < r["sandbox_cpu_ms_per_turn"] and r["starts_per_s"]
        assert r["loop_lag_ms"]["max"] >= r["loop_lag_ms"]["p50"] >= 0
