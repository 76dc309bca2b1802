"""`obsspec report`: what it derives from a run, the files it writes, and the page in a real browser.

The run directories are real: tests/rundirs.py runs the scheduler (scripted policy, fake tool)
and writes what `obsspec rollout` writes. The page is opened in headless Chromium with name
resolution disabled (offline): it must render its plots, screenshot as something other than a
blank page, and log nothing to the console.
"""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from obsspec.report.load import ReportError, load_run
from obsspec.report.report import write_report
from rundirs import rollout_dir, training_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (make test installs it)")
PLOTS = ["hit_rate.png", "latency_breakdown.png", "timeline.png", "wasted_tokens.png", "spec_vs_seq.png",
         "calibration.png"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return rollout_dir(str(tmp_path_factory.mktemp("rollout") / "run"), episodes=4)


@pytest.fixture(scope="module")
def report(run):
    return write_report(run)


def summary_of(run):
    with open(os.path.join(run, "summary.json")) as f:
        return json.load(f)


# -- what the report derives ------------------------------------------------------------------

def test_latency_parts_add_up_to_each_episodes_latency(run):
    data = load_run(run)
    parts = data.breakdown("speculative")
    trajs = {t["episode"]: t for t in data.trajectories["speculative"]}
    assert len(parts) == 4
    for p in parts:
        assert p.generation + p.tool + p.blocked + p.other == pytest.approx(p.latency, abs=1e-6)
        assert p.tool == pytest.approx(sum(t["tool_sec"] for t in trajs[p.episode]["turns"]))
        assert p.latency == pytest.approx(trajs[p.episode]["latency_sec"], abs=1e-5)
        assert p.other < 0.25 * p.latency  # generation, tool and blocking explain the latency
    spec = summary_of(run)["modes"]["speculative"]
    assert sum(p.blocked for p in parts) == pytest.approx(spec["spec/block_sec"], abs=1e-4)
    assert sum(p.overlap for p in parts) == pytest.approx(spec["spec/overlap_sec"], abs=1e-4)
    seq = load_run(run).breakdown("sequential")
    assert all(p.blocked == 0 and p.overlap == 0 for p in seq)


def test_wasted_tokens_and_hits_agree_with_the_rollout_summary(run):
    data, spec = load_run(run), summary_of(run)["modes"]["speculative"]
    wasted = data.wasted_tokens("speculative")
    assert sum(sum(d.values()) for d in wasted.values()) == spec["spec/policy_tokens_discarded"] > 0
    assert {r for d in wasted.values() for r in d} == {"rollback"}  # the oracle spoils every other draft
    wm = data.wm_tokens_unmatched("speculative")
    assert sum(wm.values()) == spec["spec/wm_tokens_total"] - spec["spec/wm_tokens_matched"]  # 0 for an oracle
    hits = data.hits_over_time("speculative")
    assert sum(m for _, _, m in hits) / len(hits) == pytest.approx(spec["spec/exact_frac"])


def test_timeline_has_kept_and_cancelled_speculation(run):
    spans = load_run(run).timeline("speculative", [0, 1])
    outcomes = {o.split(" ")[0] for e in spans.values() for lane, _, _, o in e if lane == "speculative"}
    events = {o for e in spans.values() for lane, _, _, o in e if lane == "event"}
    assert outcomes == {"committed", "cancelled"} and {"match", "rollback"} <= events
    assert all(t1 >= t0 for e in spans.values() for _, t0, t1, _ in e)


# -- what it writes ---------------------------------------------------------------------------

def test_report_writes_plots_trace_and_a_self_contained_page(run, report):
    out = report["out_dir"]
    assert report["plots"] == PLOTS
    for name in PLOTS:
        assert os.path.getsize(os.path.join(out, name)) > 5000
    page = open(report["html"]).read()
    assert page.count('src="data:image/png;base64,') == len(PLOTS)
    assert not re.search(r'(src|href)\s*=\s*"(?!data:)', page), "the page must not load anything"
    assert "http://" not in page and "https://" not in page
    trace = json.load(open(report["trace"]))
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"policy", "tool", "world model", "speculative policy"} <= names
    assert "mean latency reduction" in page and "EMULATED" in page


def test_training_run_reads_metrics_jsonl_and_its_last_rollout(tmp_path):
    path = training_dir(str(tmp_path / "train"), steps=5)
    data = load_run(path)
    assert data.kind == "training" and [s["step"] for s in data.steps] == [0, 1, 2, 3, 4]
    assert data.rollout is not None and data.rollout.run_dir.endswith("step-000004")
    summary = write_report(path)
    assert summary["kind"] == "training" and summary["plots"] == [PLOTS[0], "reward.png", *PLOTS[1:]]
    page = open(summary["html"]).read()
    assert "Training steps (metrics.jsonl)" in page and "spec/exact_frac" in page
    assert "success per question kind (`family/kind`) over the same window: 2 kinds." in page
    assert "val success before" not in page  # (the run has no summary.json: no val measured)


def test_the_learning_curve_shows_val_success_before_and_after_with_its_interval(tmp_path):
    path = training_dir(str(tmp_path / "train"), steps=5)
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"command": "train", "eval": {"before": {"success_frac": 0.25}, "after": {"success_frac": 0.5}},
                   "val_gain": {"mean": 0.25, "ci95": 0.1, "tasks": 10}}, f)
    page = open(write_report(path)["html"]).read()
    assert "val success before (step 0) and after training: +25.0 points ± 10.0 (95 % interval over 10 tasks" in page


def test_bad_run_directories_are_one_clear_error(tmp_path):
    with pytest.raises(ReportError, match="no such run directory"):
        load_run(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="not a run directory"):
        load_run(str(tmp_path / "empty"))
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(ReportError, match="'step' and 'spec/exact_frac'"):
        load_run(str(tmp_path / "t"))
    (tmp_path / "t" / "metrics.jsonl").write_text('{"step": 0,\n')
    with pytest.raises(ReportError, match="metrics.jsonl:1: not a JSON line"):
        load_run(str(tmp_path / "t"))


def test_report_cli(run, tmp_path):
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    call = lambda *a: subprocess.run([sys.executable, "-m", "obsspec.cli", "report", *a], cwd=ROOT,
                                     capture_output=True, text=True, env=env, timeout=300)
    r = call(run, "--out", str(tmp_path / "rep"), "--episodes", "2")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["html"] == str(tmp_path / "rep" / "report.html")
    r = call(str(tmp_path / "nope"))
    assert r.returncode == 2 and "no such run directory" in r.stderr and len(r.stderr.strip().splitlines()) == 1


# -- in a browser -------------------------------------------------------------------------------

def chromium(url: str, tmp, *flags) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", f"--user-data-dir={tmp}/profile", "--host-resolver-rules=MAP * ~NOTFOUND",
                           "--enable-logging=stderr", "--v=0", *flags, url],
                          capture_output=True, text=True, timeout=120)


def console(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if ":CONSOLE" in line]


def render(url: str, tmp):
    shot = os.path.join(tmp, "shot.png")
    r = chromium(url, tmp, f"--screenshot={shot}", "--window-size=1200,2400")
    dom = chromium(url, tmp, "--dump-dom")
    return r, dom, shot


@needs_chromium
def test_page_renders_offline_in_chromium_without_console_errors(report, tmp_path):
    import matplotlib.image

    r, dom, shot = render("file://" + report["html"], str(tmp_path))
    assert r.returncode == 0 and os.path.exists(shot), r.stderr[-2000:]
    assert f"plots: {len(PLOTS)}/{len(PLOTS)} rendered" in dom.stdout
    assert console(r) == [] and console(dom) == [], console(r) + console(dom)
    pixels = matplotlib.image.imread(shot)[..., :3]
    not_white = (pixels.min(axis=-1) < 0.9).mean()
    assert not_white > 0.05 and pixels.std() > 0.05, f"screenshot looks blank ({not_white:.3f} non-white)"


@needs_chromium
def test_the_browser_check_catches_a_broken_page(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text('<!doctype html><html><body><p id="status">x</p><img src="missing.png">'
                   '<script>console.error("broken")</script></body></html>')
    r, dom, shot = render(f"file://{bad}", str(tmp_path))
    assert any("broken" in line for line in console(r) + console(dom))
    import matplotlib.image

    assert (matplotlib.image.imread(shot)[..., :3].min(axis=-1) < 0.9).mean() < 0.05  # nearly blank


def test_a_line_cut_short_by_a_crash_is_dropped_and_other_bad_lines_are_one_line(tmp_path):
    """A run killed while appending to metrics.jsonl could never be resumed or reported; a line
    that is valid JSON but not an object was a traceback."""
    from obsspec.jsonl import read_jsonl

    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
    assert read_jsonl(str(p)) == [{"step": 1}, {"step": 2}]
    for text, message in (('{"step": 1}\n{"st\n{"step": 3}\n', ":2: not a JSON line"), ("[1]\n", ":1: not a JSON object"),
                          (b'{"a": "caf\xe9"}\n{}\n', ":1: not a JSON line")):
        p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
        with pytest.raises(ReportError, match=message):
            read_jsonl(str(p), ReportError)
