"""Which second moment a first moment is cheapest in units of (issue 73).

`exp_avg` is coded as q/2 times √v: the codes are round(m / (½·√v)). For a checkpoint pair this
prints the codes' order-0 entropy in bits an element (every `exp_avg` of the newer checkpoint)
with v the older checkpoint's `exp_avg_sq` and with v the newer one's, at the checkpoints' own
values (mdl codes against the stored, quantized v: the figures are close to, not equal to, a
commit's).

  $CACHE/venv/bin/python bench/lossy-bound/moment-units.py SERIES OLD NEW
  e.g. traj-fp32 ckpt_000180.safetensors ckpt_000200.safetensors
"""
import importlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
scaling = importlib.import_module("step-scaling")


def bits(m, v):
    return scaling.entropy(np.round(m / (0.5 * np.sqrt(v + 1e-45))))


def main():
    series, old, new = sys.argv[1:4]
    cache = os.environ.get("MDL_CORPUS", os.path.expanduser("~/.cache/mdl-corpus"))
    a = scaling.load(os.path.join(cache, series, old))
    b = scaling.load(os.path.join(cache, series, new))
    previous = current = 0.0
    n = 0
    for k in b:
        if not k.endswith(".exp_avg"):
            continue
        m = b[k]
        previous += bits(m, a[k + "_sq"]) * m.size
        current += bits(m, b[k + "_sq"]) * m.size
        n += m.size
    print("%s %s: in units of the previous v %.3f, of its own v %.3f bits an element"
          % (series, new, previous / n, current / n))


if __name__ == "__main__":
    main()
