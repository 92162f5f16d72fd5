"""What a step per row and column, or per element, would save a weight residual (issue 73).

For each 2-D weight of a checkpoint pair, the residual between them is quantized three ways at
the same weighted error Σ v̂·(δ − q·s)² (v̂: the newer checkpoint's exp_avg_sq, bias-corrected
with β2 = 0.95): one step for the tensor, a step per row times a factor per column fitted to
1/√v̂ in the log domain, and a step per element ∝ 1/√v̂. Prints the codes' entropy in bits an
element. The common error is what one step of `FACTOR` × rms(residual) makes.

  $CACHE/venv/bin/python bench/lossy-bound/step-scaling.py SERIES OLD NEW STEP FACTOR
  e.g. traj-fp32 ckpt_000100.safetensors ckpt_000120.safetensors 120 1.0
"""
import json
import os
import struct
import sys

import numpy as np


def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    d = b[8 + n:]
    out = {}
    for k, v in h.items():
        if k == "__metadata__" or v["dtype"] != "F32":
            continue
        lo, hi = v["data_offsets"]
        out[k] = np.frombuffer(d[lo:hi], dtype=np.float32).reshape(v["shape"]).astype(np.float64)
    return out


def entropy(q):
    _, c = np.unique(q, return_counts=True)
    p = c / c.sum()
    return -(p * np.log2(p)).sum()


def bits_at(delta, vh, scale, target):
    """Entropy of the codes at the global step whose weighted error is `target`."""
    lo, hi = 1e-12, 1e3
    for _ in range(80):
        mid = np.sqrt(lo * hi)
        s = mid * scale
        err = delta - np.round(delta / s) * s
        if (vh * err * err).sum() > target:
            hi = mid
        else:
            lo = mid
    return entropy(np.round(delta / (lo * scale)))


def main():
    series, old, new, step, factor = sys.argv[1:6]
    cache = os.environ.get("MDL_CORPUS", os.path.expanduser("~/.cache/mdl-corpus"))
    a = load(os.path.join(cache, series, old))
    b = load(os.path.join(cache, series, new))
    correction = 1 - 0.95 ** int(step)
    total = {"one": 0.0, "rowcol": 0.0, "element": 0.0, "n": 0}
    for k in b:
        if not k.startswith("model.") or b[k].ndim != 2:
            continue
        v = b.get("optim." + k[len("model."):] + ".exp_avg_sq")
        if v is None:
            continue
        vh = v / correction + 1e-30
        delta = b[k] - a[k]
        s0 = np.sqrt((delta ** 2).mean()) * float(factor)
        target = (vh * (delta - np.round(delta / s0) * s0) ** 2).sum()
        lv = np.log(vh)
        rows = lv.mean(axis=1, keepdims=True)
        cols = (lv - rows).mean(axis=0, keepdims=True)
        one = bits_at(delta, vh, np.ones_like(delta), target)
        rowcol = bits_at(delta, vh, np.exp(-(rows + cols) / 2), target)
        element = bits_at(delta, vh, 1 / np.sqrt(vh), target)
        n = delta.size
        total["one"] += one * n
        total["rowcol"] += rowcol * n
        total["element"] += element * n
        total["n"] += n
        print("%-32s %8d one %.2f rowcol %.2f element %.2f" % (k, n, one, rowcol, element))
    n = total["n"]
    print("all: one step %.3f, row x column %.3f, per element %.3f bits an element"
          % (total["one"] / n, total["rowcol"] / n, total["element"] / n))


if __name__ == "__main__":
    main()
