"""`obsspec export RUN`: a training run's policy and world model as model folders that serve.

    summary = export_run("runs/train-tiny-cpu", "runs/export", step=None, best=False,
                         adapters=False, device="cpu", command="obsspec export ...")

Writes, into OUT (built in a hidden folder beside it and renamed into place at the end, so OUT
is whole or absent):

    README.md        the model card: recipe, checkpoint, val figures, speculation's figures, usage
    obsspec.json     the command, the commit, the run and checkpoint, what each folder holds
    policy/          the trained policy (obsspec/export/models.py: LoRA merged, the base's dtype)
    world_model/     the world model as the checkpoint's rollouts would have used it
    policy-lora/, world_model-lora/   with --adapters: the LoRA adapters alone

Each model folder carries the card too, so it can be published on its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

from obsspec.export.card import model_card, record
from obsspec.export.models import is_adapter, write_adapter, write_merged
from obsspec.export import ExportError
from obsspec.export.source import RunSource, read_run
from obsspec.jsonl import write_json


def export_run(run_dir: str, out: str, step: int | None = None, best: bool = False,
               adapters: bool = False, device: str = "cpu", command: str = "", log=print) -> dict:
    source = read_run(run_dir, step, best)
    out = out or os.path.join(run_dir, "export", f"step-{source.step}")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ExportError(f"--out {out} already exists and is not empty: choose another folder")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ExportError(f"--device must be cpu or cuda (got {device!r})")
    log(source.note)
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}-", dir=parent)
    t0 = time.monotonic()
    try:
        models = _write_models(source, tmp, adapters, device, log)
        summary = record(source, models, command, time.monotonic() - t0, out)
        card = model_card(source, summary)
        for folder in ("", *(m["folder"] for m in models.values() if m.get("folder"))):
            with open(os.path.join(tmp, folder, "README.md"), "w") as f:
                f.write(card)
        write_json(os.path.join(tmp, "obsspec.json"), summary)
        _readable(tmp)  # mkdtemp and safetensors make them private; a server may run as another user
        if os.path.isdir(out):
            os.rmdir(out)  # (empty: checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _write_models(source: RunSource, tmp: str, adapters: bool, device: str, log) -> dict:
    out = {}
    lora = source.policy_lora
    if lora and source.policy_base is None:
        raise ExportError(f"{source.checkpoint}: a LoRA checkpoint whose base is unknown "
                          "(no models.json in the run, no base in adapter_config.json)")
    policy = write_merged(source.policy_base if lora else source.checkpoint, os.path.join(tmp, "policy"),
                          adapter=source.checkpoint if lora else None, device=device,
                          dtype_of=source.policy_base)
    out["policy"] = {"folder": "policy", "base": source.policy_base,
                     "trained": "LoRA, merged" if lora else "all weights", **policy}
    log(f"policy: {'LoRA merged into ' + source.policy_base if lora else 'fully fine-tuned weights'}, "
        f"{policy['dtype']}, {policy['bytes'] / 1e6:.1f} MB in {policy['seconds']:.1f} s")
    if adapters:
        if lora:
            out["policy"]["adapter_folder"] = "policy-lora"
            write_adapter(source.checkpoint, os.path.join(tmp, "policy-lora"))
        else:
            log("policy: fully fine-tuned (train.policy_lora_rank=0), so there is no adapter to write alone")
    if not _uses_world_model(source.recipe):
        log("world model: not used by this run (train.speculative or rollout.predictor): not exported")
        out["world_model"] = {"folder": None, "why": "the run used no world model"}
        return out
    if source.wm_base is None:
        log("world model: its base is unknown (a run from before models.json, never co-trained): not exported")
        out["world_model"] = {"folder": None, "why": "base unknown"}
        return out
    wm = write_merged(source.wm_base, os.path.join(tmp, "world_model"), adapter=source.wm_adapter,
                      device=device)
    what = (f"adapter v{source.wm_version} merged" if source.wm_version is not None
            else "the run's starting adapter merged" if source.wm_adapter else "the base as loaded (not co-trained)")
    out["world_model"] = {"folder": "world_model", "base": source.wm_base, "adapter_version": source.wm_version,
                          "trained": what, **wm}
    log(f"world model: {what}, {wm['dtype']}, {wm['bytes'] / 1e6:.1f} MB in {wm['seconds']:.1f} s")
    if adapters and source.wm_adapter and is_adapter(source.wm_adapter):
        out["world_model"]["adapter_folder"] = "world_model-lora"
        write_adapter(source.wm_adapter, os.path.join(tmp, "world_model-lora"))
    return out


def _uses_world_model(recipe: dict) -> bool:
    return bool(recipe["train"].get("speculative", True)) and recipe.get("rollout", {}).get("predictor") != "none"



def _readable(root: str) -> None:
    for folder, _, files in os.walk(root):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
