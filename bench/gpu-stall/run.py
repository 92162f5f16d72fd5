"""The training loop's stall when it commits CUDA state (issue 45's first target).

For weights plus AdamW moments on the GPU (fp32, about --gib GiB), it measures in one run:

- d2d:        a device-to-device copy of every tensor (clone, then synchronize), the floor;
- stall:      ``repo.commit_state(..., snapshot=S)`` returning and the training loop's stream
              catching up (its work queued by then done): what a training loop loses, for
              S = device and host;
- device:     the same and then the whole device catching up (``torch.cuda.synchronize``,
              which also waits for the snapshot's copy to the host on its side stream and the
              GPU engine's kernels): what a loop that synchronizes the device would lose;
- background: until the commit is durable, and its throughput (raw bytes / seconds): the
              commit from device state, on the CPU engine and on the GPU engine (which
              computes on the device snapshot where it lies);
- load:       ``repo.load_state(device="cuda")`` of the newest commit, on either engine (the
              GPU engine decodes into the CUDA tensors in place).

Medians of --reps commits, with the state moved a little between them (later commits are
deltas, as in a series). Needs torch with CUDA and the mdl package (scripts/gpu-check.sh runs
it on a device machine). Prints a Markdown table; ``--out FILE`` writes it there too, and
``--profile FILE`` a PyTorch-profiler summary of one ``commit_state`` and one
``load_state(device="cuda")`` on the GPU engine (where their time goes, host and device).

    python bench/gpu-stall/run.py --dir /dev/shm --gib 4 --reps 5 --mdl target/release/mdl
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import torch

import mdl


def make_state(gib: float):
    torch.manual_seed(0)
    width = 4096
    layers = max(1, int(gib * 2**30 / 12 / (width * width)))  # fp32 weight + two fp32 moments
    model = torch.nn.ModuleList(torch.nn.Linear(width, width, bias=False) for _ in range(layers)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
            st = opt.state[p]
            st["step"] = torch.tensor(100.0)
            st["exp_avg"] = torch.randn_like(p) * 1e-4
            st["exp_avg_sq"] = torch.rand_like(p) * 1e-8
    return model, opt


def tensors(model, opt):
    return list(model.parameters()) + [t for st in opt.state.values() for t in st.values() if t.is_cuda]


def step(model, opt):
    with torch.no_grad():
        for p in model.parameters():
            st = opt.state[p]
            st["exp_avg"].mul_(0.9).add_(torch.randn_like(p), alpha=1e-5)
            p.add_(st["exp_avg"], alpha=-1e-2)


def d2d(model, opt) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    copies = [t.detach().clone() for t in tensors(model, opt)]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del copies
    return dt


def profiled(what: str, work) -> str:
    """A PyTorch-profiler summary of ``work()``: the 20 costliest entries by host time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
    return f"### {what}\n\n```\n{table}\n```\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    ap.add_argument("--profile", help="write a PyTorch-profiler summary here")
    ap.add_argument("--mdl", default="mdl", help="the mdl binary (sets each repository's engine)")
    args = ap.parse_args()
    model, opt = make_state(args.gib)
    size = sum(t.numel() * t.element_size() for t in tensors(model, opt))
    lines = [
        f"device: {torch.cuda.get_device_name()}; state {size / 1e9:.2f} GB on the GPU",
        "",
        "| snapshot | engine | d2d copy ms | stall ms | stall / d2d | device-wide ms | background s | background GB/s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    loads = ["", "| load_state(device='cuda') | engine | s | GB/s |", "| --- | --- | ---: | ---: |"]
    for snapshot, engine in (("device", "gpu"), ("device", "cpu"), ("host", "gpu")):
        work = tempfile.mkdtemp(dir=args.dir, prefix="gpu-stall-")
        try:
            path = os.path.join(work, "repo")
            repo = mdl.init(path)
            subprocess.run([args.mdl, "-C", path, "config", "engine", engine], check=True)
            repo.commit_state(model, opt, step=0, wait=True, snapshot=snapshot)
            cells = {"d2d": [], "stall": [], "device": [], "background": []}
            for rep in range(args.reps):
                step(model, opt)
                cells["d2d"].append(d2d(model, opt))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                handle = repo.commit_state(model, opt, step=rep + 1, snapshot=snapshot)
                torch.cuda.current_stream().synchronize()
                cells["stall"].append(time.perf_counter() - t0)
                torch.cuda.synchronize()
                cells["device"].append(time.perf_counter() - t0)
                handle.wait()
                cells["background"].append(time.perf_counter() - t0)
            if args.profile and (snapshot, engine) == ("device", "gpu"):
                step(model, opt)
                summary = profiled(
                    "commit_state (device snapshot, GPU engine): the call",
                    lambda: repo.commit_state(model, opt, step=args.reps + 1, snapshot=snapshot),
                )
                repo.wait()
                summary += profiled("load_state(device='cuda'), GPU engine", lambda: repo.load_state(device="cuda"))
                with open(args.profile, "w") as f:
                    f.write(summary)
                print(summary, flush=True)
            if snapshot == "device":
                times = []
                for _ in range(3):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    state = repo.load_state(device="cuda")
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
                    del state
                loads.append(f"| load | {engine} | {statistics.median(times):.3f} | {size / statistics.median(times) / 1e9:.2f} |")
            del repo
        finally:
            shutil.rmtree(work, ignore_errors=True)
        m = {k: statistics.median(v) for k, v in cells.items()}
        lines.append(
            f"| {snapshot} | {engine} | {m['d2d'] * 1e3:.1f} | {m['stall'] * 1e3:.1f} | {m['stall'] / m['d2d']:.2f} | "
            f"{m['device'] * 1e3:.1f} | {m['background']:.2f} | {size / m['background'] / 1e9:.2f} |"
        )
    text = "\n".join(lines + loads) + "\n"
    print(text, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
