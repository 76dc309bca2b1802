"""What a W&B run logged, read back from its offline folder (no network, no W&B service).

    steps = logged("runs/x/wandb")      # one dict per wandb.log call: key -> value

W&B writes an offline run as RUN/wandb/offline-run-*/run-*.wandb: a ':W&B' header, then
LevelDB-style log blocks of 32 KiB (records of 4-byte checksum, 2-byte length, 1-byte type: full,
first, middle, last), each record one protobuf `Record` of wandb's own schema; `history`
records are the logged steps.
"""

import glob
import json
import os
import struct

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str):
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        room = BLOCK - pos % BLOCK
        if room < 7:  # a block's tail too short for a header is padding
            pos += room
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += room
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(parts)
            yield record


def logged(wandb_dir) -> list[dict]:
    runs = sorted(glob.glob(os.path.join(str(wandb_dir), "offline-run-*", "run-*.wandb")))
    assert len(runs) == 1, f"expected one offline run under {wandb_dir}, found {runs}"
    steps = []
    for record in records(runs[0]):
        if record.WhichOneof("record_type") == "history":
            steps.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                          for item in record.history.item})
    return steps
