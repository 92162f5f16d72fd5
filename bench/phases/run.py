"""Where a commit's time goes, phase by phase, at one thread and at two (issue 70, target 6):
each corpus series committed into a fresh repository on tmpfs with the background maintenance
off (`MDL_NO_BACKGROUND=1`), then one `mdl maintenance`, once with `RAYON_NUM_THREADS=1` and
once with 2, the two runs interleaved `--repeat` times. mdl logs each phase's wall time when it
ends (`MDL_LOG=mdl::phase=debug`); what no phase covers (process start, opening the
repository, exit) is the process' wall time less its phases.

At one thread a phase's wall time is about its CPU time (the pool has one thread; a framed
record's writer thread, for tensors of 64 MiB and more, is the exception). A phase whose wall
time does not fall from one thread to two is serial; issue 70 asks that none be longer than
5 % of a commit at two threads.

Prints a markdown table per series: each phase's milliseconds summed over the series (median
of the repeats) at 1 and 2 threads, the speed-up, and its share of the two-thread commits'
wall time; then the processes' CPU-seconds.

    python3 bench/phases/run.py [--corpus DIR] [--series traj-fp32,...] [--mdl PATH]
                                [--repeat N]
"""

import argparse
import collections
import os
import re
import resource
import shutil
import statistics
import subprocess
import time

SHM = "/dev/shm/mdl-phases"
LINE = re.compile(r'phase="([^"]+)" wall_us=(\d+)')


def timed(cmd, env):
    """Runs `cmd`: (wall s, CPU s, {phase: µs summed}) of the process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    phases = collections.Counter()
    for name, us in LINE.findall(r.stderr):
        phases[name] += int(us)
    return wall, cpu, phases


def series(mdl, files, threads):
    """One run of the series at `threads`: {row: ms} and CPU-s of commits and maintenance."""
    repo = os.path.join(SHM, "repo")
    shutil.rmtree(repo, ignore_errors=True)
    subprocess.run([mdl, "init", repo], check=True, capture_output=True)
    env = dict(os.environ, MDL_NO_BACKGROUND="1", RAYON_NUM_THREADS=str(threads),
               MDL_LOG="mdl::phase=debug,warn")
    rows = collections.Counter()
    cpu = {"commit": 0.0, "maintenance": 0.0}
    for f in files:
        wall, c, phases = timed([mdl, "-C", repo, "commit", f], env)
        for name, us in phases.items():
            rows[("commit", name)] += us / 1e3
        rows[("commit", "outside the phases")] += wall * 1e3 - sum(phases.values()) / 1e3
        rows[("commit", "whole process")] += wall * 1e3
        cpu["commit"] += c
    wall, c, phases = timed([mdl, "-C", repo, "maintenance"], env)
    for name, us in phases.items():
        rows[("maintenance", name)] += us / 1e3
    rows[("maintenance", "outside the phases")] += wall * 1e3 - sum(phases.values()) / 1e3
    rows[("maintenance", "whole process")] += wall * 1e3
    cpu["maintenance"] += c
    shutil.rmtree(repo, ignore_errors=True)
    return rows, cpu


ORDER = ["open input", "prepare", "tensors", "manifest and commit records", "publish",
         "re-encode", "publish re-encodes", "outside the phases", "whole process"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=os.path.expanduser("~/.cache/mdl-corpus"))
    ap.add_argument("--series", default="traj-fp32,traj-bf16,ft-fp32")
    ap.add_argument("--mdl", default="target/release/mdl")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(SHM, exist_ok=True)
    print(f"{os.cpu_count()} cores; medians of {args.repeat}; tmpfs; ms summed over the series")
    for name in args.series.split(","):
        src = os.path.join(SHM, "src")
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(os.path.join(args.corpus, name), src)
        files = sorted(os.path.join(src, f) for f in os.listdir(src)
                       if f.endswith(".safetensors"))
        runs = {1: [], 2: []}
        for _ in range(args.repeat):
            for threads in (1, 2):
                runs[threads].append(series(args.mdl, files, threads))
        med = {t: {k: statistics.median(r[0][k] for r in runs[t])
                   for k in set().union(*(r[0] for r in runs[t]))} for t in (1, 2)}
        cpu = {t: {k: statistics.median(r[1][k] for r in runs[t]) for k in ("commit", "maintenance")}
               for t in (1, 2)}
        print()
        print(f"### {name} ({len(files)} checkpoints)")
        print()
        print("| process | phase | 1 thread ms | 2 threads ms | speed-up | share of the 2-thread process |")
        print("|---|---|---:|---:|---:|---:|")
        for process in ("commit", "maintenance"):
            whole = med[2].get((process, "whole process"), 0) or 1
            for phase in ORDER:
                key = (process, phase)
                if key not in med[1] and key not in med[2]:
                    continue
                one, two = med[1].get(key, 0.0), med[2].get(key, 0.0)
                speed = one / two if two > 0 else float("nan")
                print(f"| {process} | {phase} | {one:.0f} | {two:.0f} | {speed:.2f}× "
                      f"| {100 * two / whole:.1f} % |")
        print()
        print(f"CPU-s, commits / maintenance: 1 thread {cpu[1]['commit']:.2f} / "
              f"{cpu[1]['maintenance']:.2f}; 2 threads {cpu[2]['commit']:.2f} / "
              f"{cpu[2]['maintenance']:.2f}")
        shutil.rmtree(src, ignore_errors=True)


if __name__ == "__main__":
    main()
