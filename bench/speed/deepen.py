"""A corpus series made deeper: between each two consecutive checkpoints, a checkpoint of their
midpoint (every float tensor the mean of the two, rounded to its dtype; other tensors the
earlier one's), so ten checkpoints become nineteen and a checkout of the oldest decodes a
chain of `delta.max_depth` (16) deltas, where the corpus' own ten reach depth 9 — what issue 70's
target 3 measures ("oldest of a depth-16 chain")::

    python bench/speed/deepen.py --series traj-fp32 --out /dev/shm/deep
    python3 bench/speed/run.py --corpus /dev/shm/deep --series traj-fp32 --skip lossy,durable

Needs numpy (the Python test environment, scripts/python-env.sh, has it).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import struct

import numpy as np


def as_f32(raw: bytes, dtype: str) -> np.ndarray | None:
    if dtype == "F32":
        return np.frombuffer(raw, np.float32).astype(np.float64)
    if dtype == "BF16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "F16":
        return np.frombuffer(raw, np.float16).astype(np.float64)
    return None


def to_dtype(x: np.ndarray, dtype: str) -> bytes:
    if dtype == "F32":
        return x.astype(np.float32).tobytes()
    if dtype == "F16":
        return x.astype(np.float16).tobytes()
    u = x.astype(np.float32).view(np.uint32)  # BF16: rounded to nearest, ties to even
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def midpoint(a: str, b: str, out: str) -> None:
    ra, rb = open(a, "rb").read(), open(b, "rb").read()
    n = struct.unpack("<Q", ra[:8])[0]
    m = struct.unpack("<Q", rb[:8])[0]
    header = json.loads(ra[8 : 8 + n])
    other = json.loads(rb[8 : 8 + m])
    header.pop("__metadata__", None)
    other.pop("__metadata__", None)
    if header != other:
        raise SystemExit(f"{a} and {b} do not hold the same tensors")
    # The earlier checkpoint's header, its metadata (a step number) included.
    body = bytearray(ra[8 + n :])
    rb = rb[8 + m :]
    for t in header.values():
        lo, hi = t["data_offsets"]
        x, y = as_f32(body[lo:hi], t["dtype"]), as_f32(rb[lo:hi], t["dtype"])
        if x is not None:
            body[lo:hi] = to_dtype((x + y) / 2, t["dtype"])
    with open(out, "wb") as f:
        f.write(ra[: 8 + n])
        f.write(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=os.path.expanduser("~/.cache/mdl-corpus"))
    ap.add_argument("--series", default="traj-fp32")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    for series in args.series.split(","):
        files = sorted(glob.glob(os.path.join(args.corpus, series, "*.safetensors")))
        dst = os.path.join(args.out, series)
        os.makedirs(dst, exist_ok=True)
        for k, f in enumerate(files):
            shutil.copyfile(f, os.path.join(dst, f"ckpt_{2 * k:03d}.safetensors"))
            if k + 1 < len(files):
                midpoint(f, files[k + 1], os.path.join(dst, f"ckpt_{2 * k + 1:03d}.safetensors"))
        print(f"{series}: {2 * len(files) - 1} checkpoints in {dst}")


if __name__ == "__main__":
    main()
