"""A loop that commits as often as it trains: what mdl costs in CPU when its deferred
re-encodes never get a pause (issue 70, target 5).

A 1 GiB state (``run.py``'s: square layers and their AdamW moments, fp32 or ``--bf16``
weights) is committed blocking after every small training step, ``--commits`` times, then the
repository is closed (which waits for the re-encodes still queued). It prints the median
blocking commit and the process' CPU-seconds less the training steps' own: the commits, their
re-encodes, and any re-encode stopped part-way by the next commit. ``--pause S`` sleeps
between steps, so the re-encodes finish before each commit (the same work, unstopped)::

    python bench/python-stall/busy.py --dir /dev/shm [--pause 12] [--bf16]
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import tempfile
import time

import torch

import mdl
from run import make_state, train_a_little


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the repository goes")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--commits", type=int, default=5)
    ap.add_argument("--pause", type=float, default=0.0, help="seconds slept between steps")
    ap.add_argument("--bf16", action="store_true", help="bf16 weights (fp32 moments)")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    model, opt = make_state(a.gib, torch.bfloat16 if a.bf16 else torch.float32)
    work = tempfile.mkdtemp(dir=a.dir, prefix="busy-")
    try:
        repo = mdl.init(os.path.join(work, "repo"))
        repo.commit_state(model, opt, step=0, wait=True)
        training, blocking = 0.0, []
        c0, t0 = cpu(), time.perf_counter()
        for step in range(1, a.commits + 1):
            c = cpu()
            train_a_little(model, opt)
            training += cpu() - c
            time.sleep(a.pause)
            t = time.perf_counter()
            repo.commit_state(model, opt, step=step, wait=True)
            blocking.append(time.perf_counter() - t)
        del repo
        gc.collect()
        spent = cpu() - c0 - training
        wall = time.perf_counter() - t0 - a.pause * a.commits
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"mdl {mdl.__version__}: {a.commits} commits of {a.gib:g} GiB, pause {a.pause:g} s: "
          f"blocking median {statistics.median(blocking):.2f} s, mdl CPU-s {spent:.2f}, "
          f"wall less pauses {wall:.1f} s")


if __name__ == "__main__":
    main()
