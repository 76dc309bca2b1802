"""Published world-model adapter versions: numbered PEFT LoRA folders and a pointer to the newest.

    store = AdapterStore("runs/world_model/adapters")
    version = store.publish("runs/world_model/.training-v1", meta={"loss": 0.4})
    version.name, version.path          # "wm-v1", ".../adapters/v000001"
    await engine.load_adapter(version.name, version.path)

Layout under the root:

    v000001/   adapter_config.json  adapter_model.safetensors  version.json
    v000002/   ...
    latest     the newest version's folder name, one line

Each version folder is what `PeftModel.from_pretrained` loads and what vLLM serves as a LoRA
module (`--lora-modules wm-v2=.../v000002`). Publishing copies the trained folder into a hidden
temporary folder next to the versions and renames it into place (one `os.rename`, atomic on a
POSIX file system), then replaces `latest` the same way: a reader sees no version or a whole
one, never half an adapter, and a crash leaves only a hidden folder that the next publish
removes. Version numbers only grow; a broken folder (no adapter weights) is refused.
`prune(keep, protect)` deletes all but the newest `keep` versions, never the one `latest` names
nor a protected one (the version serving, those a checkpoint records); a version leaves the
listing (renamed to a hidden folder) before its files are deleted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass

LATEST = "latest"
_VERSION_DIR = re.compile(r"^v(\d{6,})$")
ADAPTER_FILES = ("adapter_config.json",)
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_REMOVING = ".removing-"


from obsspec.worldmodel.config import WorldModelError


class AdapterError(WorldModelError):
    """A folder that is not a usable adapter, or a version that does not exist (user error)."""


@dataclass(frozen=True)
class AdapterVersion:
    version: int
    path: str
    name: str  # what an engine loads it as: f"wm-v{version}" (vLLM wants a new name per version)

    @classmethod
    def at(cls, root: str, version: int, prefix: str = "wm") -> AdapterVersion:
        return cls(version, os.path.join(root, f"v{version:06d}"), f"{prefix}-v{version}")

    def meta(self) -> dict:
        path = os.path.join(self.path, "version.json")
        if not os.path.exists(path):
            return {}
        with open(path) as f:
            return json.load(f)


def check_adapter_folder(path: str) -> None:
    """Raise AdapterError unless `path` holds a PEFT adapter (config + weights)."""
    if not os.path.isdir(path):
        raise AdapterError(f"{path}: no such adapter folder")
    missing = [f for f in ADAPTER_FILES if not os.path.isfile(os.path.join(path, f))]
    if missing or not any(os.path.isfile(os.path.join(path, w)) for w in WEIGHT_FILES):
        raise AdapterError(f"{path}: not a PEFT adapter folder (needs adapter_config.json and "
                           "adapter_model.safetensors)")
    try:
        with open(os.path.join(path, "adapter_config.json")) as f:
            json.load(f)
    except json.JSONDecodeError as e:
        raise AdapterError(f"{path}/adapter_config.json: not valid JSON ({e.msg})") from None


class AdapterStore:
    """The adapter versions under one root folder (e.g. RUN_DIR/world_model/adapters); engines
    load version N as f"{prefix}-vN" ("wm" for world models, "policy" for a policy LoRA)."""

    def __init__(self, root: str, prefix: str = "wm"):
        self.root, self.prefix = root, prefix

    def versions(self) -> list[AdapterVersion]:
        if not os.path.isdir(self.root):
            return []
        numbers = sorted(int(m.group(1)) for m in map(_VERSION_DIR.match, os.listdir(self.root)) if m)
        return [AdapterVersion.at(self.root, n, self.prefix) for n in numbers]

    def latest(self) -> AdapterVersion | None:
        pointer = os.path.join(self.root, LATEST)
        if os.path.exists(pointer):
            with open(pointer) as f:
                m = _VERSION_DIR.match(f.read().strip())
            if m and os.path.isdir(os.path.join(self.root, m.group(0))):
                return AdapterVersion.at(self.root, int(m.group(1)), self.prefix)
        versions = self.versions()  # no pointer yet (or a stale one): the highest number
        return versions[-1] if versions else None

    def get(self, version: int) -> AdapterVersion:
        found = AdapterVersion.at(self.root, version, self.prefix)
        if not os.path.isdir(found.path):
            have = ", ".join(str(v.version) for v in self.versions()) or "none"
            raise AdapterError(f"{self.root}: no adapter version {version} (published: {have})")
        return found

    def publish(self, trained_dir: str, meta: dict | None = None) -> AdapterVersion:
        """Copy a saved PEFT adapter in as the next version and point `latest` at it."""
        check_adapter_folder(trained_dir)
        os.makedirs(self.root, exist_ok=True)
        self._remove_leftovers()
        versions = self.versions()
        version = AdapterVersion.at(self.root, versions[-1].version + 1 if versions else 1, self.prefix)
        tmp = tempfile.mkdtemp(prefix=".publishing-", dir=self.root)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a vLLM server may run as another user
        try:
            for name in os.listdir(trained_dir):
                src = os.path.join(trained_dir, name)
                if os.path.isfile(src):  # PEFT writes flat files; README.md etc. come along
                    shutil.copy2(src, os.path.join(tmp, name))
            with open(os.path.join(tmp, "version.json"), "w") as f:
                json.dump({"version": version.version, "name": version.name, **(meta or {})},
                          f, indent=2, sort_keys=True)
            _fsync_dir(tmp)
            os.rename(tmp, version.path)  # fails if the number was taken meanwhile: never overwrite
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._point_latest(version)
        return version

    def prune(self, keep: int, protect=()) -> list[int]:
        """Delete every version but the newest `keep`, the one `latest` names and those in
        `protect` (0 = keep all); the versions deleted."""
        if keep <= 0:
            return []
        versions, latest = self.versions(), self.latest()
        kept = {v.version for v in versions[-keep:]} | set(protect) | ({latest.version} if latest else set())
        removed = []
        for v in versions:
            if v.version not in kept:
                aside = os.path.join(self.root, f"{_REMOVING}{os.path.basename(v.path)}")
                os.rename(v.path, aside)  # out of the listing first: never half a version listed
                shutil.rmtree(aside, ignore_errors=True)
                removed.append(v.version)
        return removed

    def _point_latest(self, version: AdapterVersion) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".latest-", dir=self.root)
        with os.fdopen(fd, "w") as f:
            f.write(os.path.basename(version.path) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(self.root, LATEST))

    def _remove_leftovers(self) -> None:
        for name in os.listdir(self.root):  # a publish (or a deletion) that crashed half-way
            if name.startswith((".publishing-", ".latest-", _REMOVING)):
                path = os.path.join(self.root, name)
                shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)


def _fsync_dir(path: str) -> None:
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as f:
            os.fsync(f.fileno())


def resolve_adapter(spec: str) -> AdapterVersion | None:
    """What `world_model.adapter=...` names: '' (none), an adapter folder, a store root or a
    train-worldmodel run directory (its latest version), or `DIR@N` (version N there)."""
    if not spec:
        return None
    root, _, number = spec.rpartition("@") if "@" in spec else (spec, "", "")
    if number:
        if not number.isdigit():
            raise AdapterError(f"{spec}: expected DIR@VERSION with a number after '@'")
        return _store_for(root, spec).get(int(number))
    if os.path.isfile(os.path.join(spec, "adapter_config.json")):
        check_adapter_folder(spec)
        m = _VERSION_DIR.match(os.path.basename(os.path.normpath(spec)))
        n = int(m.group(1)) if m else 0
        return AdapterVersion(n, spec, f"wm-v{n}")
    latest = _store_for(spec, spec).latest()
    if latest is None:
        raise AdapterError(f"{spec}: no published adapter versions there")
    return latest


def _store_for(path: str, spec: str) -> AdapterStore:
    for root in (path, os.path.join(path, "adapters")):  # a store root, or the run dir above it
        if os.path.isdir(root) and (os.path.exists(os.path.join(root, LATEST))
                                    or AdapterStore(root).versions()):
            return AdapterStore(root)
    raise AdapterError(f"{spec}: neither an adapter folder nor a folder of adapter versions")
