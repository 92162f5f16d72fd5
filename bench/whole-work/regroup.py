"""The corpus series with a large model's tensor sizes: each checkpoint's weights, first moments
and second moments (of its float dtype) concatenated by role and cut into tensors of 2 Mi
elements (the rest of each role dropped), so that every tensor spans 16 element chunks as a
large model's do, while the values keep the corpus' training statistics. What
`run.py --corpus OUT` then measures is how mdl's work scales with tensors far larger than the
corpus' small model has (its largest is 256 Ki elements)::

    python3 bench/whole-work/regroup.py --out /dev/shm/big
    python3 bench/whole-work/run.py --corpus /dev/shm/big --series traj-fp32,ft-fp32 --no-lossy
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import struct

ELEMENTS = 2 << 20
WIDTH = {"F32": 4, "BF16": 2, "F16": 2}


def role(name: str) -> str | None:
    if name.endswith(".exp_avg"):
        return "exp_avg"
    if name.endswith(".exp_avg_sq"):
        return "exp_avg_sq"
    return None if name.startswith("optim.") else "weight"


def regroup(src: str, dst: str) -> int:
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    tensors = {k: v for k, v in sorted(header.items()) if k != "__metadata__"}
    dtype = next(v["dtype"] for v in tensors.values() if v["dtype"] in WIDTH)
    roles: dict[str, bytearray] = {"weight": bytearray(), "exp_avg": bytearray(), "exp_avg_sq": bytearray()}
    for name, v in tensors.items():
        r = role(name)
        if r and v["dtype"] == dtype:
            a, b = v["data_offsets"]
            roles[r] += raw[8 + n + a : 8 + n + b]
    out, parts, at = {}, [], 0
    per = ELEMENTS * WIDTH[dtype]
    for r, blob in roles.items():
        for i in range(len(blob) // per):
            part = bytes(blob[i * per : (i + 1) * per])
            out[f"{r}.{i}"] = {"dtype": dtype, "shape": [ELEMENTS], "data_offsets": [at, at + per]}
            parts.append(part)
            at += per
    text = json.dumps(out).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for p in parts:
            f.write(p)
    return at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=os.path.expanduser("~/.cache/mdl-corpus"))
    ap.add_argument("--series", default="traj-fp32,ft-fp32")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    for s in a.series.split(","):
        os.makedirs(os.path.join(a.out, s), exist_ok=True)
        files = sorted(glob.glob(os.path.join(a.corpus, s, "*.safetensors")))
        sizes = [regroup(f, os.path.join(a.out, s, os.path.basename(f))) for f in files]
        print(f"{s}: {len(files)} checkpoints of {sizes[0] / 1e6:.1f} MB in tensors of {ELEMENTS} elements")


if __name__ == "__main__":
    main()
