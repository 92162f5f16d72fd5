"""Measures mdl on a Trainer-format checkpoint series (bench/trainer-series/make.py): each
checkpoint committed as the folder Trainer wrote, against the same tensors as one safetensors
file, lossless and --lossy, and against `zstd -3 -T2` of the folder (as a tar). Repositories and
outputs on /dev/shm, each input read once before it is timed (CPU-bound numbers; a durable
commit is bounded by the disk, see BENCHMARKS.md). Prints a markdown table: ratio (input bytes / stored bytes, whole series),
median commit speed and checkout speed of the newest and oldest commit.

    python3 bench/trainer-series/run.py SERIES_DIR [--mdl target/release/mdl] [--modes lossless,lossy]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time

SHM = "/dev/shm/mdl-trainer-bench"


def size_of(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


def remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def same(a, b):
    return subprocess.run(["diff", "-rq", a, b], capture_output=True).returncode == 0 if os.path.isdir(a) \
        else subprocess.run(["cmp", "-s", a, b]).returncode == 0


def timed(cmd):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{cmd} failed: {r.stderr}")
    return dt, r.stdout


def recorded(tree):
    """The step and loss a Trainer folder records (trainer_state.json)."""
    with open(os.path.join(tree, "trainer_state.json")) as f:
        state = json.load(f)
    step = state["global_step"]
    loss = [e["loss"] for e in state["log_history"] if e.get("step") == step and "loss" in e]
    return ["--step", str(step)] + (["--metric", f"loss={loss[-1]}"] if loss else [])


def run_mdl(mdl, inputs, mode, meta):
    repo = os.path.join(SHM, "repo")
    shutil.rmtree(repo, ignore_errors=True)
    subprocess.run([mdl, "init", repo], check=True, capture_output=True)
    flags = ["--lossy"] if mode == "lossy" else []
    raw = stored = 0
    speeds = []
    for path, m in zip(inputs, meta):
        # Read once first: both inputs are then timed from the page cache.
        subprocess.run(f"cat $(find '{path}' -type f) > /dev/null", shell=True, check=True)
        dt, out = timed([mdl, "-C", repo, "--json", "commit", path, *flags, *m])
        o = json.loads(out)
        raw += o["raw_bytes"]
        stored += o["stored_bytes"]
        speeds.append(o["raw_bytes"] / dt / 1e6)
    checkouts = []
    for rev, src in [("main", inputs[-1]), (f"main~{len(inputs) - 1}", inputs[0])]:
        out = os.path.join(SHM, "out")
        remove(out)
        dt, _ = timed([mdl, "-C", repo, "checkout", rev, "-o", out])
        if mode == "lossless" and not same(out, src):
            raise SystemExit(f"checkout of {rev} differs from {src}")
        checkouts.append(size_of(out) / dt / 1e6)
        remove(out)
    shutil.rmtree(repo, ignore_errors=True)
    return raw / stored, statistics.median(speeds), checkouts[0], checkouts[1]


def run_zstd(inputs):
    raw = packed = 0
    speeds = []
    out = os.path.join(SHM, "x.tar.zst")
    for path in inputs:
        subprocess.run(f"cat $(find '{path}' -type f) > /dev/null", shell=True, check=True)
        t = time.perf_counter()
        subprocess.run(f"tar -cf - -C '{path}' . | zstd -q -3 -T2 -f -o '{out}'", shell=True, check=True)
        dt = time.perf_counter() - t
        n = size_of(path)
        raw += n
        packed += os.path.getsize(out)
        speeds.append(n / dt / 1e6)
    os.remove(out)
    return raw / packed, statistics.median(speeds)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("series")
    p.add_argument("--mdl", default="target/release/mdl")
    p.add_argument("--modes", default="lossless,lossy")
    a = p.parse_args()
    os.makedirs(SHM, exist_ok=True)
    ks = sorted(int(d.split("-")[1]) for d in os.listdir(a.series) if d.startswith("checkpoint-"))
    trees = [os.path.join(a.series, f"checkpoint-{k}") for k in ks]
    singles = [os.path.join(a.series, f"single-{k}.safetensors") for k in ks]
    # Both inputs get the same step and loss (the folder's trainer_state.json), given
    # explicitly: the loss sets the lossy budget (ε × loss).
    meta = [recorded(t) for t in trees]
    print(f"{len(ks)} checkpoints; folder {size_of(trees[-1]) / 1e6:.0f} MB, one file {size_of(singles[-1]) / 1e6:.0f} MB")
    print()
    print("| input | mode | ratio | commit MB/s (median) | checkout newest MB/s | checkout oldest MB/s |")
    print("|---|---|---|---|---|---|")
    for mode in a.modes.split(","):
        for label, inputs in [("Trainer folder", trees), ("one safetensors file", singles)]:
            r, c, new, old = run_mdl(a.mdl, inputs, mode, meta)
            print(f"| {label} | {mode} | {r:.3f} | {c:.0f} | {new:.0f} | {old:.0f} |", flush=True)
    r, c = run_zstd(trees)
    print(f"| Trainer folder | zstd -3 -T2 (tar) | {r:.3f} | {c:.0f} | | |")
    shutil.rmtree(SHM, ignore_errors=True)


if __name__ == "__main__":
    main()
