"""A starting vLLM server is waited for while it makes progress, and its phases are told."""

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from obsspec.engines.server import ServerError, Servers, server_phase

VLLM_START = """INFO Starting to load model Qwen/Qwen3-8B...
INFO Loading weights took 41.20 seconds
INFO Model loading took 15.26 GiB memory and 44.1 seconds
Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 67/67
INFO Graph capturing finished in 21 secs, took 0.84 GiB
"""


def test_the_phase_is_the_last_one_its_log_reached():
    assert server_phase("") == "starting"
    lines = VLLM_START.splitlines(keepends=True)
    assert [server_phase("".join(lines[:n])) for n in range(1, 6)] == [
        "loading the model", "weights loaded", "weights loaded", "capturing CUDA graphs", "CUDA graphs captured"]


def _fake(tmp_path, script: str, timeout: float):
    """A 'server' that only writes its log (never serves), waited for as a real one is."""
    log = tmp_path / "policy.log"
    log.write_text("$ start\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(log)])
    spec = SimpleNamespace(role="policy", model="m", port=1, url="http://127.0.0.1:1",
                           config=SimpleNamespace(start_timeout_s=timeout))
    told = []
    servers = Servers([], str(tmp_path), display=SimpleNamespace(log=told.append))
    return servers, spec, proc, told


def test_a_start_that_keeps_writing_is_waited_for_and_a_silent_one_fails_naming_its_phase(tmp_path):
    """Writes its log for ~4 s, each line 0.3 s apart, then hangs: with a 2.5 s limit the wait
    outlasts the limit while the log grows, and then fails on the silence, naming the last phase."""
    script = ("import sys, time\nlog = sys.argv[1]\n"
              "for line in ['Starting to load model x...'] * 7 + ['Loading weights took 3 s'] * 7:\n"
              "    open(log, 'a').write(line + '\\n'); time.sleep(0.3)\n"
              "time.sleep(600)\n")
    servers, spec, proc, told = _fake(tmp_path, script, 2.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(ServerError, match=r"wrote nothing to its log for \d+ s.*last phase: weights loaded"):
            servers._wait(spec, proc, t0)
    finally:
        proc.kill()
        proc.wait()
    assert time.monotonic() - t0 > 4, "a start that made progress was cut at the silence limit"
    phases = [t.split(":")[1].split("(")[0].strip() for t in told]
    assert phases[-2:] == ["loading the model", "weights loaded"] and len(phases) == len(set(phases)), \
        f"each phase is told once, in order: {phases}"


def test_a_server_that_exits_while_starting_is_one_line(tmp_path):
    script = "import sys\nopen(sys.argv[1], 'a').write('ERROR boom\\n')\nsys.exit(3)\n"
    servers, spec, proc, _ = _fake(tmp_path, script, 60)
    with pytest.raises(ServerError, match=r"exited \(3\)"):
        servers._wait(spec, proc, time.monotonic())
    assert not os.path.exists(tmp_path / "nothing")
