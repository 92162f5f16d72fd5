"""What a residual could save by predicting from the commit's other tensors (issue 73; measured
offline, not built: a record has one base, and these predictions need two or three).

For each 2-D weight with Adam moments of a checkpoint pair (OLD → NEW, optimizer steps S_OLD,
S_NEW; AdamW betas 0.9 / 0.95):

- weights: the residual w_new − w_old coded with a step per element ∝ 1/√v̂ (the limit of
  format 14's row × column steps) at the weighted error one step of rms(residual) makes, as is,
  then after subtracting a per-tensor least-squares fit (weighted by v̂) of the Adam updates
  the moments imply: u_new = m̂_new / (√v̂_new + ε), then u_new and u_old, then those and w_old
  (weight decay).
- first moments: round(m_new / (½·√v_old)) — `exp_avg` in units of the previous `exp_avg_sq` — as
  is, then after subtracting a per-tensor fit of the weight's movement w_new − w_old (and with
  the previous first moment).

Prints each tensor's codes' order-0 entropy in bits an element and the totals.

  $CACHE/venv/bin/python bench/lossy-bound/cross-prediction.py SERIES OLD NEW S_OLD S_NEW
  e.g. traj-fp32 ckpt_000100.safetensors ckpt_000120.safetensors 100 120
"""
import importlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
scaling = importlib.import_module("step-scaling")


def fit_out(target, columns, weight):
    """`target` less its weighted least-squares fit on `columns`."""
    a = np.stack([c.ravel() for c in columns], 1)
    w = np.sqrt(weight.ravel())
    coef, *_ = np.linalg.lstsq(a * w[:, None], target.ravel() * w, rcond=None)
    return target - (a @ coef).reshape(target.shape)


def main():
    series, old, new, s_old, s_new = sys.argv[1:6]
    cache = os.environ.get("MDL_CORPUS", os.path.expanduser("~/.cache/mdl-corpus"))
    a = scaling.load(os.path.join(cache, series, old))
    b = scaling.load(os.path.join(cache, series, new))
    c1 = lambda t: 1 / (1 - 0.9 ** int(t))
    c2 = lambda t: 1 / (1 - 0.95 ** int(t))
    totals = {}
    n = 0
    for k in b:
        if not k.startswith("model.") or b[k].ndim != 2:
            continue
        o = "optim." + k[len("model."):]
        if o + ".exp_avg_sq" not in b:
            continue
        vh = b[o + ".exp_avg_sq"] * c2(s_new) + 1e-30
        u_new = b[o + ".exp_avg"] * c1(s_new) / (np.sqrt(b[o + ".exp_avg_sq"] * c2(s_new)) + 1e-8)
        u_old = a[o + ".exp_avg"] * c1(s_old) / (np.sqrt(a[o + ".exp_avg_sq"] * c2(s_old)) + 1e-8)
        dw = b[k] - a[k]
        s0 = np.sqrt((dw ** 2).mean())
        target = (vh * (dw - np.round(dw / s0) * s0) ** 2).sum()
        scale = 1 / np.sqrt(vh)
        rows = {
            "w as is": scaling.bits_at(dw, vh, scale, target),
            "w - u_new": scaling.bits_at(fit_out(dw, [u_new], vh), vh, scale, target),
            "w - u_new,u_old": scaling.bits_at(fit_out(dw, [u_new, u_old], vh), vh, scale, target),
            "w - u,w_old": scaling.bits_at(fit_out(dw, [u_new, u_old, a[k]], vh), vh, scale, target),
        }
        unit = 0.5 * np.sqrt(a[o + ".exp_avg_sq"] + 1e-45)
        t = b[o + ".exp_avg"] / unit * 0.5
        ones = np.ones_like(t)
        m_old = a[o + ".exp_avg"] / unit * 0.5
        rows["m as is"] = scaling.entropy(np.round(t / 0.5))
        rows["m - dw"] = scaling.entropy(np.round(fit_out(t, [dw], ones) / 0.5))
        rows["m - dw,m_old"] = scaling.entropy(np.round(fit_out(t, [dw, m_old], ones) / 0.5))
        for name, bits in rows.items():
            totals[name] = totals.get(name, 0.0) + bits * dw.size
        n += dw.size
        print("%-30s %s" % (k, "  ".join("%s %.2f" % r for r in rows.items())))
    print("all: " + ", ".join("%s %.3f" % (name, v / n) for name, v in totals.items())
          + " bits an element")


if __name__ == "__main__":
    main()
