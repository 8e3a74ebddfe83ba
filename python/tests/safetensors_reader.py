"""A minimal reader of the port dump's step files (safetensors: docs/port-dump.md), for the tests."""
import json
import struct

import numpy as np

_DT = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BF16": np.uint16}


def read_step(path):
    """{key: array}; BF16 tensors decoded to float32 (exact)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, e in header.items():
        if k == "__metadata__":
            continue
        a, b = e["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=_DT[e["dtype"]]).reshape(e["shape"])
        if e["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[k] = arr
    return out
