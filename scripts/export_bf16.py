#!/usr/bin/python3
"""Copies a training checkpoint (f32 model.safetensors) to a model directory with bf16 weights:
export_bf16.py CHECKPOINT_DIR OUT_DIR. Each f32 value is rounded to the nearest bf16 (ties to
even), as torch's .to(torch.bfloat16) does; config.json (torch_dtype set to bfloat16) and
tokenizer.json are copied. Only the model files: the optimizer state stays with the run."""
import json
import os
import shutil
import struct
import sys

import numpy as np


def to_bf16(a):
    u = a.astype("<f4").view("<u4").astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def main(src, dst):
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out_header, blobs, offset = {}, [], 0
    for name in sorted(header):
        info = header[name]
        if info["dtype"] != "F32":
            sys.exit("export_bf16: %s is %s, expected F32" % (name, info["dtype"]))
        b, e = info["data_offsets"]
        blob = to_bf16(np.frombuffer(data[8 + n + b:8 + n + e], dtype="<f4")).tobytes()
        out_header[name] = {"dtype": "BF16", "shape": info["shape"], "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    out_header["__metadata__"] = meta
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)
    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["torch_dtype"] = "bfloat16"
    with open(os.path.join(dst, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    shutil.copy(os.path.join(src, "tokenizer.json"), os.path.join(dst, "tokenizer.json"))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
