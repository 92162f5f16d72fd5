"""How well does the Adam-moment loss estimate predict real loss changes?

For each parameter tensor of a corpus checkpoint, adds Gaussian noise of a given relative size
(or the difference to another file, e.g. a lossy reconstruction), measures the validation loss
change with the corpus model, and prints it beside mdl's estimate |Σ m̂·δ| + ½ Σ v̂·δ² and the
exact second-order term ½ δᵀHδ (Hessian-vector product on the validation set).

  $CACHE/venv/bin/python bench/lossy-bound/sensitivity.py CKPT [--domain tests] [--rel 0.05]
      [--recon FILE]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../shared/corpus"))
import gen_trajectory as g  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--domain", default="stdlib")
    ap.add_argument("--rel", type=float, default=0.05)
    ap.add_argument("--recon")
    ap.add_argument("--betas", default="0.9,0.95")
    ap.add_argument("--batches", type=int, default=2, help="validation batches of 16 sequences (8 is --eval's set)")
    ap.add_argument("--only", help="substring of the tensors to test")
    a = ap.parse_args()
    b1, b2 = (float(x) for x in a.betas.split(","))
    cfg = dict(g.SIZES["small"])
    data, _, _ = g.load_corpus(a.domain)
    nval = len(data) // 50
    val = data[-nval:]
    T, B = cfg["ctx"], cfg["batch"]
    vrng = np.random.default_rng(12345)
    voff = vrng.integers(0, len(val) - T - 1, size=(8, B))[: a.batches]
    vx = np.stack([np.stack([val[o:o + T] for o in row]) for row in voff]).reshape(-1, T)
    vy = np.stack([np.stack([val[o + 1:o + T + 1] for o in row]) for row in voff]).reshape(-1, T)
    like = g.init_params(jax.random.PRNGKey(0), cfg)
    params, mu, nu, step = g.load_state(a.ckpt, like)
    c1, c2 = 1 / (1 - b1 ** max(step, 1)), 1 / (1 - b2 ** max(step, 1))
    lossf = jax.jit(lambda p: g.loss_fn(p, vx, vy, cfg, jnp.float32))
    grad = jax.jit(jax.grad(lambda p: g.loss_fn(p, vx, vy, cfg, jnp.float32)))
    hvp = jax.jit(lambda p, d: jax.jvp(grad, (p,), (d,))[1])
    L0 = float(lossf(params))
    gv = grad(params)
    recon = None
    if a.recon:
        r, _, _, _ = g.load_state(a.recon, like)
        recon = r
    rng = np.random.default_rng(7)
    print(f"# {a.ckpt} step {step} val_loss {L0:.5f}")
    print(f"{'tensor':32} {'n':>8} {'rel':>7} {'true dL':>10} {'est':>10} {'est1':>9} {'est2':>9} "
          f"{'gv.d':>9} {'dHd/2':>9} {'true/est':>8} {'H/v':>7}")
    tot_true = tot_est = 0.0
    for n in params:
        if a.only and a.only not in n:
            continue
        w = np.asarray(params[n], np.float64)
        if recon is not None:
            d = np.asarray(recon[n], np.float64) - w
        else:
            d = rng.standard_normal(w.shape) * a.rel * np.sqrt(np.mean(w * w))
        if not np.any(d):
            continue
        rel = np.sqrt(np.sum(d * d) / max(np.sum(w * w), 1e-30))
        m = np.asarray(mu[n], np.float64) * c1
        v = np.asarray(nu[n], np.float64) * c2
        est1 = abs(np.sum(m * d))
        est2 = 0.5 * np.sum(v * d * d)
        p2 = dict(params)
        p2[n] = jnp.asarray((w + d).astype(np.float32))
        true = float(lossf(p2)) - L0
        dd = {k: jnp.zeros_like(x) for k, x in params.items()}
        dd[n] = jnp.asarray(d.astype(np.float32))
        dhd = 0.5 * float(jnp.sum(hvp(params, dd)[n] * dd[n]))
        gd = float(jnp.sum(gv[n] * dd[n]))
        est = est1 + est2
        tot_true += true
        tot_est += est
        print(f"{n:32} {w.size:8d} {rel:7.4f} {true:10.3e} {est:10.3e} {est1:9.2e} {est2:9.2e} "
              f"{gd:9.2e} {dhd:9.2e} {true / est if est else float('inf'):8.1f} "
              f"{dhd / est2 if est2 else float('inf'):7.1f}", flush=True)
    print(f"# total true {tot_true:.3e} est {tot_est:.3e}")


if __name__ == "__main__":
    main()
