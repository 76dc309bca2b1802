"""Work on the main process alone must not outlast the collective timeout of the others.

Two real processes (gloo) run `run_training` up to its first piece of main-only work, which is
slowed past the process group's default timeout; that default is cut to 2 s in the children so
the test runs in seconds (NCCL's is 10 minutes, gloo's 30).

Run: .venv/bin/python -m pytest -q tests/test_collectives.py
"""

import os
import socket
import subprocess
import sys

from test_cli import ROOT

CHILD = r"""
import datetime, os, sys, time, types
import torch.distributed.distributed_c10d as c10d
c10d.default_pg_timeout = datetime.timedelta(seconds=2)   # the default the run must not rely on


class Reached(Exception):
    pass


def build_run(recipe, out_dir, state, live, display):
    # as the real one: the main process prepares (suite, kit, servers) while the others wait
    with state.main_process_first():
        if state.is_main_process:
            time.sleep(5)
    raise Reached


# run_training imports build_run when it runs: this one stands in (and spares the import of TRL)
sys.modules["obsspec.training.setup"] = types.SimpleNamespace(build_run=build_run)
from obsspec.config import load_recipe
from obsspec.training import grpo

try:
    grpo.run_training(load_recipe("recipes/tiny-cpu.yaml", sys.argv[2:]), sys.argv[1])
except Reached:
    print("past the main process's work", flush=True)
    os._exit(0)   # (the interpreter's teardown of torch takes longer than the test)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(out, *overrides) -> list[subprocess.CompletedProcess]:
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, str(out), *overrides], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


def test_the_others_wait_out_the_main_processs_work_alone(tmp_path):
    ranks = _two_processes(tmp_path / "run", "train.collective_timeout_s=120")
    for rank, r in enumerate(ranks):
        assert r.returncode == 0 and "past the main process's work" in r.stdout, (
            f"rank {rank} did not wait out the main process's work: {r.stderr[-1500:]}")
