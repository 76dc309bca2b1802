"""`doc(default, help)`: a dataclass field with its default and its one documentation string.

Every recipe section (obsspec/config.py and the sections it composes) declares its fields with
it, so that `obsspec validate --explain` can list every key with what it means.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


def doc(default: Any, help: str) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def to_dict(obj: Any) -> Any:
    """A config as plain data: dataclasses as dicts, tuples as lists (what JSON and YAML hold)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    return obj
