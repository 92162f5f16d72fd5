"""Weight sync over loopback (issue 72): from `commit_state` returning on a trainer to a
watcher's model brought to that commit in place, through `mdl serve`.

A trainer holds a bf16 model of `--size-mb` (tensors of 4096 x 4096) and, each step, changes
`--changed` of its elements (random places, each value moved by at least one bf16 step, as an
RL update leaves about 1 % of bf16 weights changed) and commits it (`commit_state`, weights
only) into a repository that `mdl serve` serves. A watcher process holds a clone and follows
the server's branch (`Repository.follow(..., remote="origin")`: a long poll, then a fetch of
what changed as deltas against what it holds, then `load_state(new, model, since=previous)`
into its model in place). Each row prints, per step, the trainer's commit time and the
latency from the commit returning to the watcher's model holding it (both clocks this
machine's), and at the end the watcher's in-place apply alone (`load_state(..., since=)` of
the last step again: decode of the changed tensors and copy into the model), as GB/s of model
per core used.

    target/wheel-venv/bin/python bench/weight-sync/run.py [--size-mb 1024] [--side 4096] [--steps 5] [--changed 0.01] [--watchers 1] [--mode reverse|forward]

`--side 8192` makes the tensors 128 MiB each, the size of real models' embeddings and MLP
matrices, which a commit reads a window at a time (64 MiB and more).

Each step is also committed whole into an empty repository in the same round (a full commit),
for the ratio issue 72's target 3 names (a step's commit ≤ 0.3× a full commit).

With `--watchers N`, N watchers (each its own clone and process) follow the same server, as
rollout engines follow one trainer; each row gives the first and the last to hold the step
(the server makes a step's deltas once and keeps them for the others).

`target/wheel-venv` is what `scripts/test-python.sh` installs (the wheel and the pinned torch).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import mdl

def weights(size_mb, side=4096):
    n = max(1, (size_mb << 20) // (side * side * 2))
    g = torch.Generator().manual_seed(0)
    return torch.nn.ParameterDict(
        {
            f"w{i}": torch.nn.Parameter(
                (torch.randn(side, side, generator=g) * 0.02).bfloat16(), requires_grad=False
            )
            for i in range(n)
        }
    )


def step(model, fraction, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.values():
            flat = p.view(-1)
            k = int(flat.numel() * fraction)
            idx = torch.randint(0, flat.numel(), (k,), generator=g)
            # One bf16 step up: the bit pattern plus one (never a no-op).
            bits = flat[idx].view(torch.int16)
            flat[idx] = (bits + 1).view(torch.bfloat16)


def watch(clone, steps, size_mb, side):
    repo = mdl.open(clone)
    model = weights(size_mb, side)
    held = repo.resolve("main")
    repo.load_state(held, model)
    print("ready", flush=True)
    # Where the watcher's time goes: the fetch (deltas over what it holds, each verified) and
    # the in-place load, timed around the calls `follow` makes.
    spent = {}

    def timed(name):
        call = getattr(repo, name)

        def run(*args, **kwargs):
            t = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[name] = time.perf_counter() - t

        setattr(repo, name, run)

    timed("_fetch")
    timed("load_state")
    previous = held
    for n, state in enumerate(repo.follow("main", model, since=held, remote="origin", timeout=300)):
        print(json.dumps({"step": state.step, "at": time.time(), "changed": state.changed,
                          "fetch": spent.get("_fetch", 0.0), "load": spent.get("load_state", 0.0)}),
              flush=True)
        if n + 1 == steps:
            last = state.commit
            break
        previous = state.commit
    # The model back at the step before (whole), for the in-place apply alone.
    repo.load_state(previous, model)
    # The in-place apply alone: the last step over the one before.
    cpu0 = time.process_time()
    t = time.perf_counter()
    again = repo.load_state(last, model, since=previous)
    wall = time.perf_counter() - t
    cpu = time.process_time() - cpu0
    print(json.dumps({"apply_s": wall, "apply_cpu_s": cpu, "changed": again.changed}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--side", type=int, default=4096, help="each tensor is SIDE x SIDE bf16")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--changed", type=float, default=0.01)
    ap.add_argument("--watchers", type=int, default=1)
    ap.add_argument("--mode", default="reverse", choices=["reverse", "forward"],
                    help="the trainer repository's delta.mode")
    ap.add_argument("--mdl", default=shutil.which("mdl"))
    ap.add_argument("--watch", nargs=2, metavar=("CLONE", "STEPS"))
    a = ap.parse_args()
    if a.watch:
        return watch(a.watch[0], int(a.watch[1]), a.size_mb, a.side)
    work = tempfile.mkdtemp(prefix="mdl-weight-sync-")
    try:
        trainer_dir = os.path.join(work, "trainer")
        repo = mdl.init(trainer_dir)
        subprocess.run([a.mdl, "-C", trainer_dir, "config", "delta.mode", a.mode], check=True)
        model = weights(a.size_mb, a.side)
        size = sum(p.numel() * 2 for p in model.values())
        repo.commit_state(model, step=0).wait()
        server = subprocess.Popen(
            [a.mdl, "-C", trainer_dir, "serve", "--addr", "127.0.0.1:0", "--read-public"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        url = None
        for line in server.stdout:
            m = re.match(r"serving (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        watchers = []
        for n in range(a.watchers):
            clone = os.path.join(work, f"clone{n}")
            subprocess.run([a.mdl, "clone", url, clone], check=True, capture_output=True)
            watchers.append(subprocess.Popen(
                [sys.executable, __file__, "--size-mb", str(a.size_mb), "--side", str(a.side),
                 "--watch", clone, str(a.steps)],
                stdout=subprocess.PIPE, text=True,
            ))
        for w in watchers:
            assert w.stdout.readline().strip() == "ready"
        rows = []
        for s in range(1, a.steps + 1):
            step(model, a.changed, s)
            t = time.perf_counter()
            repo.commit_state(model, step=s).wait()
            returned = time.time()
            commit_s = time.perf_counter() - t
            seen = [json.loads(w.stdout.readline()) for w in watchers]
            assert all(x["step"] == s for x in seen), seen
            lat = sorted(x["at"] - returned for x in seen)
            # The same state committed whole into an empty repository: a full commit.
            empty = os.path.join(work, "empty")
            shutil.rmtree(empty, ignore_errors=True)
            fresh = mdl.init(empty)
            t = time.perf_counter()
            fresh.commit_state(model, step=s).wait()
            full_s = time.perf_counter() - t
            del fresh
            rows.append((s, commit_s, lat[0], lat[-1], seen[0]["changed"], full_s,
                         seen[0]["fetch"], seen[0]["load"]))
        applied = [json.loads(w.stdout.readline()) for w in watchers][0]
        for w in watchers:
            w.wait()
        server.terminate()
        server.wait()
        print(f"# weight sync over loopback: {size / 1e9:.2f} GB bf16 model, {a.changed:.1%} of "
              f"elements changed a step, tensors {a.side} x {a.side}, {a.watchers} watcher(s), {os.cpu_count()} cores, "
              f"delta.mode {a.mode}")
        print()
        print("| step | tensors changed | commit_state | full commit | step / full | commit returned → first watcher updated | → last | watcher 1: fetch | load |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for s, c, first, last, ch, full, fetch, load in rows:
            print(f"| {s} | {ch} | {c:.2f} s | {full:.2f} s | {c / full:.2f} | {first:.2f} s | {last:.2f} s "
                  f"| {fetch:.2f} s | {load:.2f} s |")
        print()
        ratio = statistics.median(r[1] / r[5] for r in rows)
        print(f"median commit of a step / full commit: {ratio:.2f}")
        lats = [r[2] for r in rows]
        print(f"median latency {statistics.median(lats):.2f} s; in-place apply of one step: "
              f"{applied['apply_s']:.2f} s wall, {applied['apply_cpu_s']:.2f} s CPU, "
              f"{size / 1e9 / applied['apply_s']:.2f} GB/s of model, "
              f"{size / 1e9 / max(applied['apply_cpu_s'], 1e-9):.2f} GB/s per CPU second "
              f"({applied['changed']} tensors)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
