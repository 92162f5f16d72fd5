"""How long a training loop is blocked by a checkpoint (issue 20's benchmark).

For a training state of weights plus AdamW moments (fp32 weights, or bf16 weights with fp32
moments; about 1 GB and 4 GB), it measures in one run, on the same disk:

- copy:      a plain host copy of the same tensors (``clone``), the floor;
- async:     ``repo.commit_state(...)`` returning (the loop goes on while mdl stores);
- blocking:  ``repo.commit_state(..., wait=True)``;
- torch.save of the model and optimizer state dicts to a file, fsynced, timed alone once the
  repository is closed (closing waits for the deferred re-encodes; timed beside them,
  torch.save was slowed 1.85-2.25x);
- closing: how long closing the repository waited for those re-encodes; the process' peak
  resident memory from the state's first commit to the repository's closing (the state itself
  and the Python runtime included; building the state, which peaks higher, is not counted);
- background: how long the asynchronous commit took to become durable, and its
  throughput (raw bytes / seconds).

With ``--only-blocking`` the copy column and the asynchronous commits are left out, so the peak
resident memory is what blocking commits need (a blocking commit reads the tensors where they
lie; an asynchronous one stages a copy of the state).

Each cell is the median of --reps commits; between commits the weights and moments move a
little, as in training, so later commits are deltas like a real series. Run with the
package's environment (scripts/test-python.sh builds it)::

    python bench/python-stall/run.py --dir /path/on/the/disk --sizes 1,4

It prints a Markdown table (docs/BENCHMARKS.md, "Python: the training loop's stall").
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import resource
import shutil
import statistics
import tempfile
import time

import torch

import mdl


def trim() -> None:
    """Hands the C allocator's freed memory back to the system (glibc keeps large freed blocks
    on its heaps), so that the peak resident memory measured is what is alive, not what
    building the state left behind."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak() -> None:
    """Starts the process' peak resident memory (VmHWM) again from what it holds now (Linux:
    /proc/self/clear_refs); elsewhere the peak is the process' whole life's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss() -> int:
    """Bytes: the peak resident memory since `reset_peak` (the process' life's elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def make_state(gib: float, weights: torch.dtype, seed: int = 0):
    """A module of square layers and an AdamW with moments, about ``gib`` GiB in all."""
    torch.manual_seed(seed)
    per_param = torch.finfo(weights).bits // 8 + 8  # weight + two fp32 moments
    n = int(gib * 2**30 / per_param)
    width = 2048
    layers = max(1, n // (width * width))
    model = torch.nn.ModuleList(
        torch.nn.Linear(width, width, bias=False, dtype=weights) for _ in range(layers)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        st = opt.state[p]
        st["step"] = torch.tensor(100.0)
        st["exp_avg"] = torch.randn(p.shape) * 1e-4
        st["exp_avg_sq"] = torch.rand(p.shape) * 1e-8
    trim()
    return model, opt


def nbytes(model, opt) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for st in opt.state.values():
        total += sum(t.numel() * t.element_size() for t in st.values())
    return total


def train_a_little(model, opt):
    """Moves weights and moments as a training step would (in place, like the optimizer)."""
    with torch.no_grad():
        for p in model.parameters():
            st = opt.state[p]
            st["exp_avg"].mul_(0.9).add_(torch.randn_like(st["exp_avg"]), alpha=1e-5)
            st["exp_avg_sq"].mul_(0.999).add_(1e-11)
            p.add_(st["exp_avg"].to(p.dtype), alpha=-1e-2)
            st["step"] += 1


def plain_copy(model, opt) -> float:
    t0 = time.perf_counter()
    copies = [p.detach().clone() for p in model.parameters()]
    copies += [t.clone() for st in opt.state.values() for t in st.values()]
    dt = time.perf_counter() - t0
    del copies
    trim()
    return dt


def torch_save(model, opt, path: str) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    os.remove(path)
    return dt


def measure(
    gib: float, weights: torch.dtype, root: str, reps: int, warm_bytes: int | None, only_blocking: bool = False
) -> dict:
    model, opt = make_state(gib, weights)
    size = nbytes(model, opt)
    work = tempfile.mkdtemp(dir=root, prefix="stall-")
    try:
        kw = {} if warm_bytes is None else {"warm_bytes": warm_bytes}
        repo = mdl.init(os.path.join(work, "repo"), **kw)
        cells: dict[str, list[float]] = {k: [] for k in ("copy", "async", "background", "blocking", "save")}
        reset_peak()
        # A first commit that later ones delta against (a running series), not timed.
        repo.commit_state(model, opt, step=0, wait=True)
        for rep in range(reps):
            if not only_blocking:
                train_a_little(model, opt)
                cells["copy"].append(plain_copy(model, opt))
                t0 = time.perf_counter()
                handle = repo.commit_state(model, opt, step=2 * rep + 1)
                cells["async"].append(time.perf_counter() - t0)
                handle.wait()
                cells["background"].append(time.perf_counter() - t0)
            train_a_little(model, opt)
            t0 = time.perf_counter()
            repo.commit_state(model, opt, step=2 * rep + 2, wait=True)
            cells["blocking"].append(time.perf_counter() - t0)
        stored = sum(e.stored_bytes for e in repo.log())
        raw = sum(e.raw_bytes for e in repo.log())
        # Closing the repository waits for the deferred re-encodes its committer is working
        # (`delta.defer`); the records then are what the series finally takes.
        t0 = time.perf_counter()
        del repo
        gc.collect()
        closing = time.perf_counter() - t0
        peak = peak_rss()
        # torch.save timed alone, once mdl's background work is done (timed beside the
        # re-encodes, it was slowed 1.85-2.25x).
        for _ in range(reps):
            cells["save"].append(torch_save(model, opt, os.path.join(work, "ckpt.pt")))
        objects = os.path.join(work, "repo", ".mdl", "objects")
        final = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(objects) for f in fs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) if v else float("nan") for k, v in cells.items()}
    med["bytes"] = size
    med["closing"] = closing
    med["peak"] = peak
    med["ratio"] = raw / stored
    med["final"] = raw / final
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where repositories and files go")
    ap.add_argument("--sizes", default="1,4", help="state sizes in GiB, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warm-bytes", type=int, default=None,
                    help="the repository's warm_bytes (the package's default if left out)")
    ap.add_argument("--only-blocking", action="store_true",
                    help="blocking commits only (no copy column, no asynchronous commits)")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"mdl {mdl.__version__}, torch {torch.__version__}, {os.cpu_count()} cores, dir {args.dir}")
    print()
    print("| state | weights | copy s | async s | async/copy | blocking s | torch.save s (alone) "
          "| blocking / torch.save | background s | background MB/s | closing s | peak RSS GiB "
          "| ratio as committed | after the re-encodes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for gib in [float(s) for s in args.sizes.split(",")]:
        for weights in (torch.float32, torch.bfloat16):
            m = measure(gib, weights, args.dir, args.reps, args.warm_bytes, args.only_blocking)
            name = str(weights).removeprefix("torch.")
            print(
                f"| {m['bytes'] / 2**30:.2f} GiB | {name} | {m['copy']:.2f} | {m['async']:.2f} | "
                f"{m['async'] / m['copy']:.2f} | {m['blocking']:.2f} | {m['save']:.2f} | "
                f"{m['blocking'] / m['save']:.2f} | {m['background']:.2f} | "
                f"{m['bytes'] / m['background'] / 1e6:.0f} | {m['closing']:.2f} | "
                f"{m['peak'] / 2**30:.2f} | {m['ratio']:.2f} | {m['final']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
