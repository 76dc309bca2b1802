"""Where a training run's processes go on one node's GPUs, and whether each GPU holds them.

    node = detect_node() or Node(8, 80.0, "given")   # torch.cuda when present, else --gpus/--gpu-memory-gb
    plan = gpu_plan(recipe, node, processes=2)       # PlanError (one line) when it cannot fit
    print(render(plan))                              # placement, then every GPU's estimate

Arithmetic only (obsspec/memory.py): nothing is loaded, so `obsspec train RECIPE
--dry-run` runs it on any machine and every real start runs it before a model loads. The layout
is the `servers` section's: `trainer_gpus` (one process each), `policy_gpus` and
`world_model_gpus` (vLLM servers, tensor parallel over several), `cotrain_gpu` (the world model's
co-training worker, obsspec/training/cotrain.py) and `gpu_memory_utilization` (each server's share
of each of its GPUs). The servers take their shares; the trainer's processes may use 90 % of the
rest (the other 10 %: CUDA context, NCCL buffers, the caching allocator's fragmentation).

Activation checkpointing is on when the policy trains on CUDA and generates elsewhere (a vLLM
server); with `policy.engine: hf` the trainer's model generates the rollouts, and transformers
drops the KV cache of a checkpointed layer in training mode, so it stays off there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from obsspec.engines.server import LOCAL_HOSTS
from obsspec.training.config import TrainError
from obsspec.memory import (GIB, TrainerMemory, cotrain_memory, model_shape, server_memory,
                                     trainer_memory)

TRAINER_SHARE = 0.9
VLLM_DEFAULT_SHARE = 0.9
HF_WM_BATCH = 32          # obsspec/build.py make_engine: the world model's hf engine batch


class PlanError(TrainError):
    """A layout that cannot fit (one line); `plan` holds what was computed, for printing."""

    def __init__(self, message: str, plan: dict | None = None):
        super().__init__(message)
        self.plan = plan
        self.text = ""   # the plan as printed, set by who prints it


class NoPlan(Exception):
    """The plan cannot be made (a model of unknown shape): the run goes on without it."""


@dataclass(frozen=True)
class Node:
    gpus: int
    memory_gib: float
    source: str = "given"     # "given" (--gpus, --gpu-memory-gb) or "detected" (torch.cuda)


def detect_node(named: int = 0) -> Node | None:
    """This machine's GPUs (None without CUDA). Under CUDA_VISIBLE_DEVICES the hidden GPUs are
    taken to be like the visible ones, as many as the layout names (`named`)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    count = torch.cuda.device_count()
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        count = max(count, named)
    return Node(count, round(torch.cuda.get_device_properties(0).total_memory / GIB, 1), "detected")


def no_gpu_reason() -> str:
    """One line: why a recipe on GPUs cannot start on this machine."""
    import torch

    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) is a CPU build"
    else:
        why = (f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: no NVIDIA driver, one older "
               f"than CUDA {torch.version.cuda} needs, or CUDA_VISIBLE_DEVICES hides them")
    return (f"the recipe trains on GPUs (policy.device: cuda) but {why}; run it on a GPU node after make install, "
            f"or train a CPU recipe (recipes/tiny-cpu.yaml)")


def uses_checkpointing(policy, cuda: bool) -> bool:
    """Activation checkpointing of the trainer's policy: on GPUs, unless the trainer's model
    generates the rollouts itself (policy.engine hf: transformers drops the KV cache of a
    checkpointed layer in training mode)."""
    return cuda and policy.engine != "hf"


def _gpus(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x != ""]


def _local(url: str) -> bool:
    from urllib.parse import urlsplit

    return urlsplit(url).hostname in LOCAL_HOSTS


def named_gpus(recipe) -> int:
    """How many GPUs the recipe's layout names (its highest index + 1)."""
    s = recipe.servers
    found = [*_gpus(s.trainer_gpus), *_gpus(s.policy_gpus), *_gpus(s.world_model_gpus), *_gpus(s.cotrain_gpu)]
    return max(found) + 1 if found else 0


# ---------------------------------------------------------------------------------------------
# The plan


def gpu_plan(recipe, node: Node, processes: int) -> dict | None:
    """The placement and per-GPU estimates of `recipe` on `node` (None: the policy trains on the
    CPU); raises PlanError when a process cannot start or a GPU overflows."""
    pol, wm, t, s = recipe.policy, recipe.world_model, recipe.train, recipe.servers
    if pol.device != "cuda":
        return None
    shape = _shape(recipe, "policy")
    speculative = t.speculative and recipe.rollout.predictor != "none"
    wm_shape = _shape(recipe, "world_model") if speculative else None
    for section, found in (("policy", shape), ("world_model", wm_shape if speculative else True)):
        if found is None:
            raise NoPlan(f"no GPU plan: the shape of {section}.model {getattr(recipe, section).model!r} is "
                         "unknown here (no config.json in a folder or the Hugging Face cache)")
    trainer = _gpus(s.trainer_gpus) or list(range(processes))
    if len(trainer) != processes:
        raise PlanError(f"servers.trainer_gpus names {len(trainer)} GPU(s) ({s.trainer_gpus}) but the run has "
                        f"{processes} process(es): launch one process per trainer GPU, or change servers.trainer_gpus")
    per_process = t.episodes_per_step // processes
    checkpointing = uses_checkpointing(pol, cuda=True)
    rows = min(t.micro_batch_size, per_process)
    share = s.gpu_memory_utilization or VLLM_DEFAULT_SHARE
    plan = {"node": {"gpus": node.gpus, "memory_gib": node.memory_gib, "source": node.source},
            "checkpointing": checkpointing, "micro_batch": rows, "largest_micro_batch": None,
            "processes": [], "gpus": {}}
    placed: dict[int, list] = {}

    def place(gpu: int, process: str, gib: float, parts: dict, key: str, server: float = 0.0) -> None:
        if gpu >= node.gpus:
            raise PlanError(f"{key} names GPU {gpu} but the node has {node.gpus} GPU(s) (0-{node.gpus - 1}): "
                            f"this layout needs {named_gpus(recipe)} GPUs; change {key}", plan)
        placed.setdefault(gpu, []).append(
            {"process": process, "gib": round(gib, 2), "parts": {k: round(v, 2) for k, v in parts.items()},
             "server_share": server})

    # -- servers ------------------------------------------------------------------------------------
    servers = []
    if pol.engine == "vllm" and _local(pol.server_url):
        servers.append(("policy server", shape, _gpus(s.policy_gpus) or [0], pol.max_context,
                        t.policy_lora_rank, "servers.policy_gpus"))
    if speculative and wm.engine == "vllm" and _local(wm.server_url) and wm_shape is not None:
        need = pol.max_context + wm.extra_tokens(pol.max_turns) + wm.max_tokens
        servers.append(("world-model server", wm_shape, _gpus(s.world_model_gpus) or [0],
                        min(need, wm_shape.positions or need), recipe.wm_train.rank, "servers.world_model_gpus"))
    for name, m, gpus, max_len, rank, key in servers:
        tp = len(gpus)
        if m.heads % tp or (m.kv_heads % tp and tp % m.kv_heads):
            raise PlanError(f"{key}: tensor parallel over {tp} GPUs does not divide {m.name}'s {m.heads} "
                            f"query / {m.kv_heads} key-value heads: name 1, 2, 4 or 8 GPUs", plan)
        mem = server_memory(m, tp, share, node.memory_gib, max_len, rank)
        parts = {"weights": mem.weights / GIB, "lora_slots": mem.lora / GIB, "runtime": mem.reserve / GIB,
                 "kv_cache": max(mem.kv, 0) / GIB}
        plan["processes"].append({"process": name, "gpus": gpus, "tensor_parallel": tp, "share": share,
                                  "kv_cache_gib": round(mem.kv_total / GIB, 1), "max_len": max_len,
                                  "sequences": mem.sequences})
        for g in gpus:
            place(g, name, mem.budget / GIB, parts, key, share)
        if mem.sequences < 1:
            raise PlanError(f"the {name}'s KV cache holds no sequence of {max_len:,} tokens: "
                            f"{share:.2f} x {node.memory_gib:g} GiB a GPU less weights {mem.weights / GIB:.1f}, "
                            f"LoRA slots {mem.lora / GIB:.1f} and runtime {mem.reserve / GIB:.1f} leaves "
                            f"{mem.kv / GIB:.1f} GiB; give it more GPUs ({key}) or a larger share "
                            "(servers.gpu_memory_utilization)", plan)

    # -- co-training ---------------------------------------------------------------------------------
    w = recipe.wm_train
    cotrain = None

    def cotrain_at(micro: int):
        return cotrain_memory(wm_shape, w.rank, w.target_modules, micro, w.max_length, w.activation_checkpointing)

    if speculative and t.cotrain_every and wm_shape is not None:
        cotrain = cotrain_at(w.micro_batch_size or w.batch_size)
        gpu = int(s.cotrain_gpu) if s.cotrain_gpu else trainer[0]
        plan["processes"].append({"process": "co-training", "gpus": [gpu], "rank": w.rank,
                                  "batch": w.batch_size, "micro_batch": w.micro_batch_size or w.batch_size,
                                  "max_length": w.max_length, "checkpointing": w.activation_checkpointing})
        place(gpu, "co-training", cotrain.total() / GIB,
              {"weights": cotrain.weights / GIB, "lora_state": cotrain.train_state / GIB,
               "activations": cotrain.activations / GIB, "attention_mask": cotrain.mask / GIB,
               "logits": cotrain.logits / GIB}, "servers.cotrain_gpu")

    # -- trainer ranks -------------------------------------------------------------------------------
    def rank_memory(b: int, tokens: int = pol.max_context) -> TrainerMemory:
        kv = min(pol.max_batch_size, per_process) if pol.engine == "hf" else 0
        mem = trainer_memory(shape, t.policy_lora_rank, t.policy_lora_targets, b, tokens, kv)
        if speculative and wm.engine == "hf" and wm.device == "cuda" and wm_shape is not None:
            wm_len = min(tokens + wm.extra_tokens(pol.max_turns) + wm.max_tokens, wm_shape.positions or 1 << 30)
            mem = replace(mem, weights=mem.weights + wm_shape.params * 2,
                          kv_cache=mem.kv_cache + HF_WM_BATCH * wm_len * wm_shape.kv_bytes_per_token)
        return mem

    mem = rank_memory(rows)
    plan["processes"].insert(0, {"process": "trainer", "gpus": trainer, "micro_batch": rows,
                                 "tokens": pol.max_context, "accumulation": per_process // rows,
                                 "checkpointing": checkpointing})
    for r, g in enumerate(trainer):
        place(g, f"trainer rank {r}", mem.total(checkpointing) / GIB, _trainer_parts(mem, checkpointing),
              "servers.trainer_gpus")

    # -- every GPU ------------------------------------------------------------------------------------
    for g, occupants in sorted(placed.items()):
        taken = sum(o["server_share"] for o in occupants)
        plan["gpus"][str(g)] = {"usable_gib": round(TRAINER_SHARE * node.memory_gib * max(0.0, 1 - taken), 2),
                                "servers_share": round(taken, 2),
                                "occupants": sorted(occupants, key=lambda o: not o["process"].startswith("trainer"))}
    best = [b for b in range(1, per_process + 1) if per_process % b == 0
            and _fits(plan, trainer, rank_memory(b).total(checkpointing) / GIB - mem.total(checkpointing) / GIB)]
    plan["largest_micro_batch"] = max(best) if best else None
    for g, gpu in plan["gpus"].items():
        servers_here = [o for o in gpu["occupants"] if o["server_share"]]
        if gpu["servers_share"] > 1:
            names = " and ".join(f"the {o['process']} ({o['server_share']:.2f})" for o in servers_here)
            raise PlanError(f"GPU {g}: {names} take {gpu['servers_share']:.2f} of it: give each its own GPUs "
                            "(servers.policy_gpus, servers.world_model_gpus) or lower "
                            f"servers.gpu_memory_utilization to {0.9 / len(servers_here):.2f}", plan)
        rest = [o for o in gpu["occupants"] if not o["server_share"]]
        used = sum(o["gib"] for o in rest)
        if used > gpu["usable_gib"]:
            _overflow(recipe, plan, g, rest, used, gpu["usable_gib"], rank_memory, per_process, checkpointing,
                      cotrain, cotrain_at)
    return plan


def _shape(recipe, section: str):
    kit = recipe.kit
    folder = ""
    if kit.bases:
        from obsspec.models.bases import bases_dir

        folder = os.path.join(bases_dir(kit.bases), section)
    extra = recipe.world_model.snapshot_tokens if section == "world_model" else 0
    return model_shape(getattr(recipe, section).model, getattr(kit, section), kit.vocab_size,
                       kit.max_length + extra, folder)


def _trainer_parts(mem: TrainerMemory, checkpointing: bool) -> dict:
    parts = {"weights": mem.weights / GIB, "train_state": mem.train_state / GIB,
             "activations": (mem.activations_on if checkpointing else mem.activations_off) / GIB,
             "attention_mask": (mem.mask_on if checkpointing else mem.mask_off) / GIB,
             "activations_on": mem.activations_on / GIB, "attention_mask_on": mem.mask_on / GIB,
             "activations_off": mem.activations_off / GIB, "attention_mask_off": mem.mask_off / GIB,
             "lm_head": mem.lm_head / GIB, "logits_tile": mem.tile / GIB, "checkpointing": checkpointing}
    if mem.kv_cache:
        parts["kv_cache"] = mem.kv_cache / GIB
    return parts


def _fits(plan: dict, trainer: list[int], extra: float) -> bool:
    """Whether every trainer GPU still fits with `extra` GiB more on each rank."""
    for g in trainer:
        gpu = plan["gpus"][str(g)]
        used = sum(o["gib"] for o in gpu["occupants"] if not o["server_share"])
        if used + extra > gpu["usable_gib"]:
            return False
    return True


def _overflow(recipe, plan, g, rest, used, usable, rank_memory, per_process, checkpointing, cotrain, cotrain_at):
    """Raise the one-line error for GPU `g`, naming the key to change."""
    t, pol = recipe.train, recipe.policy
    over = used - usable
    head = f"GPU {g} needs {used:.1f} GiB, {over:.1f} over the {usable:.1f} its processes may use"
    if not any(o["process"].startswith("trainer") for o in rest):  # co-training alone
        w = recipe.wm_train
        micro = w.micro_batch_size or w.batch_size
        room = usable - (used - cotrain.total() / GIB)
        fit = [b for b in range(1, micro) if w.batch_size % b == 0 and cotrain_at(b).total() / GIB <= room]
        fix = (f"set wm_train.micro_batch_size={max(fit)}" if fit else
               "set wm_train.activation_checkpointing=true" if not w.activation_checkpointing else
               "lower wm_train.max_length")
        raise PlanError(f"{head}: world-model co-training at {micro} row(s) of wm_train.max_length={w.max_length} "
                        f"a pass takes {cotrain.total() / GIB:.1f} (logits {cotrain.logits / GIB:.1f}, activations "
                        f"{cotrain.activations / GIB:.1f}, attention mask {cotrain.mask / GIB:.1f}); {fix}, "
                        "or give it a GPU of its own (servers.cotrain_gpu)", plan)
    others = used - sum(o["gib"] for o in rest if o["process"].startswith("trainer"))
    room = usable - others
    fits = [b for b in range(1, per_process + 1) if per_process % b == 0
            and rank_memory(b).total(checkpointing) / GIB <= room]
    mem = rank_memory(plan["micro_batch"])
    act = (mem.activations_on + mem.mask_on if checkpointing else mem.activations_off + mem.mask_off) / GIB
    state = mem.weights / GIB + mem.train_state / GIB
    parts = (f"weights {mem.weights / GIB:.1f}, {'LoRA' if t.policy_lora_rank else 'full fine-tuning'} state "
             f"{mem.train_state / GIB:.1f}, activations {act:.1f}"
             f"{'' if checkpointing else ' with checkpointing off (policy.engine=hf)'}, LM head {mem.lm_head / GIB:.1f}"
             + (f", KV cache {mem.kv_cache / GIB:.1f}" if mem.kv_cache else "")
             + (f", co-training {others:.1f}" if others else ""))
    where = f"{head} ({parts}) at train.micro_batch_size={plan['micro_batch']} x policy.max_context={pol.max_context}"
    if fits:
        raise PlanError(f"{where}: set train.micro_batch_size={max(fits)}, the largest that fits", plan)
    if not t.policy_lora_rank:
        raise PlanError(f"{where}: full fine-tuning of {pol.model} (train.policy_lora_rank=0) keeps its bf16 "
                        f"weights, gradients and AdamW moments, {state:.1f} of the {room:.1f} GiB before any "
                        "activation: train a LoRA (train.policy_lora_rank=64, policy.engine=vllm)", plan)
    if mem.kv_cache and rank_memory(1).kv_cache / GIB > room - state:
        raise PlanError(f"{where}: the hf engine's KV cache for policy.max_batch_size={pol.max_batch_size} "
                        "sequences does not fit; lower policy.max_batch_size or use policy.engine=vllm", plan)
    tokens = [n for n in (24576, 16384, 12288, 8192) if n < pol.max_context
              and rank_memory(1, n).total(checkpointing) / GIB <= room]
    if tokens:
        fix = f"lower policy.max_context to {tokens[0]:,}"
    else:
        fix = (f"{pol.model}'s weights and {'LoRA' if t.policy_lora_rank else 'training'} state take {state:.1f} of "
               f"the {room:.1f} GiB; it needs GPUs with more memory")
    if others:
        fix += ", or give the trainer GPUs of its own (servers.trainer_gpus)"
    raise PlanError(f"{where}: even one row does not fit; {fix}", plan)


# ---------------------------------------------------------------------------------------------
# Launch check and printing


def check_launch(recipe, process_index: int, local_index: int, processes: int) -> None:
    """A real start: this process must run on the trainer GPU the layout gives its rank."""
    s = recipe.servers
    trainer = _gpus(s.trainer_gpus)
    if not trainer:
        return
    if len(trainer) != processes:
        raise PlanError(f"servers.trainer_gpus names {len(trainer)} GPU(s) ({s.trainer_gpus}) but {processes} "
                        f"process(es) were launched: launch {len(trainer)} (accelerate launch --num_processes "
                        f"{len(trainer)}), or change servers.trainer_gpus")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        seen = [int(x) for x in visible.split(",")] if visible else None
    except ValueError:  # GPU UUIDs: the indices cannot be checked
        return
    gpu = seen[local_index] if seen and local_index < len(seen) else local_index
    if gpu != trainer[process_index]:
        raise PlanError(f"rank {process_index} runs on GPU {gpu}, not on GPU {trainer[process_index]} that "
                        f"servers.trainer_gpus gives it: launch with CUDA_VISIBLE_DEVICES={s.trainer_gpus}")


def render(plan: dict) -> str:
    """The plan as lines: where each process runs, then each GPU's estimate (GiB)."""
    n = plan["node"]
    out = [f"node: {n['gpus']} GPU(s) x {n['memory_gib']:g} GiB ({n['source']})", "placement:"]
    for p in plan["processes"]:
        gpus = ",".join(map(str, p["gpus"]))
        if p["process"] == "trainer":
            out.append(f"  trainer             GPU{'s' if len(p['gpus']) > 1 else ''} {gpus}: {len(p['gpus'])} "
                       f"process{'es' if len(p['gpus']) > 1 else ''}, micro-batch {p['micro_batch']} x "
                       f"{p['tokens']:,} tokens ({p['accumulation']} a step each); activation checkpointing "
                       f"{'on' if p['checkpointing'] else 'off (policy.engine=hf generates with this model)'}")
        elif p["process"] == "co-training":
            out.append(f"  co-training         GPU {gpus}: world-model LoRA rank {p['rank']}, {p['micro_batch']} "
                       f"row{'s' if p['micro_batch'] > 1 else ''} of up to {p['max_length']:,} tokens a pass "
                       f"({p['batch']} a step); activation checkpointing {'on' if p['checkpointing'] else 'off'}; "
                       "logits of the observation tokens only, in chunks (wm_train)")
        else:
            tp = f" (tensor parallel {p['tensor_parallel']})" if p["tensor_parallel"] > 1 else ""
            out.append(f"  {p['process']:19} GPU{'s' if len(p['gpus']) > 1 else ''} {gpus}{tp}, {p['share']:.2f} "
                       f"of {'each' if len(p['gpus']) > 1 else 'it'}: KV cache {p['kv_cache_gib']:.1f} GiB = "
                       f"{p['sequences']} sequence{'' if p['sequences'] == 1 else 's'} of "
                       f"{p['max_len']:,} tokens at once")
    out.append("per GPU, GiB (trainer side: of the 90 % the servers leave; servers: their share):")
    for g, gpu in plan["gpus"].items():
        side = [o for o in gpu["occupants"] if not o["server_share"]]
        for o in gpu["occupants"]:
            of = f"= {o['server_share']:.2f} x GPU" if o["server_share"] else f"of {gpu['usable_gib']:.1f}"
            out.append(f"  GPU {g:>2}  {o['process']:19} {o['gib']:6.1f} {of:13}  {_parts_text(o)}")
        if len(side) > 1:
            out.append(f"  {'':6}  {'together':19} {sum(o['gib'] for o in side):6.1f} of {gpu['usable_gib']:.1f}")
    largest = plan.get("largest_micro_batch")
    out.append(f"micro-batch: {plan['micro_batch']} (train.micro_batch_size); the largest that fits: "
               f"{largest if largest else 'none'}")
    return "\n".join(out)


def _parts_text(o: dict) -> str:
    p = o["parts"]
    if o["server_share"]:
        return (f"weights {p['weights']:.1f}, LoRA slots {p['lora_slots']:.1f}, runtime {p['runtime']:.1f}, "
                f"KV cache {p['kv_cache']:.1f}")
    if "logits" in p:
        return (f"weights {p['weights']:.1f}, LoRA state {p['lora_state']:.1f}, activations {p['activations']:.1f}, "
                f"attention mask {p['attention_mask']:.1f}, logits {p['logits']:.1f}")
    off = p["activations_off"] + p["attention_mask_off"]
    text = (f"weights {p['weights']:.1f}, train state {p['train_state']:.1f}, activations {p['activations']:.1f} "
            f"+ attention mask {p['attention_mask']:.1f} (checkpointing {'on; off: ' if p['checkpointing'] else 'off; on: '}"
            f"{off if p['checkpointing'] else p['activations_on'] + p['attention_mask_on']:,.1f}), "
            f"LM head {p['lm_head']:.1f} (logits tile {p['logits_tile']:.2f})")
    return text + (f", KV cache {p['kv_cache']:.1f}" if "kv_cache" in p else "")
