"""Whole work per checkpoint in CPU-seconds (issue 70, target 1): each corpus series committed
into a fresh repository on tmpfs with the background maintenance off (`MDL_NO_BACKGROUND=1`),
then one `mdl maintenance` doing every deferred re-encode the commits queued; beside it,
`zstd -3` (one thread) over the same files. CPU-seconds are user + system of each process (and
its threads), from the kernel's accounting of waited-for children. Prints a markdown table:
per series the commits', the maintenance's and the whole CPU-seconds, zstd's, their ratio, and
both compression ratios (mdl's from `mdl stats` once the maintenance is done). A second table
(target 4): the same series committed `--lossy` into a fresh repository (a lossy series defers
nothing), its CPU-seconds against the lossless whole work of the same run, and its ratio.
With --zipnn-python/--zipnn-path (scripts/bench-peers.sh), ZipNN's CPU-seconds compressing
the same files on one thread (bench/peers/zipnn_compress.py; its start-up left out) and its
ratio are printed beside zstd's.

    python3 bench/whole-work/run.py [--corpus DIR] [--series traj-fp32,...] [--mdl PATH]
                                    [--repeat N] [--zipnn-python PY --zipnn-path DIR]
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
import zipnn_compress as zipnn  # noqa: E402  (bench/peers: runs ZipNN where it is installed)

SHM = "/dev/shm/mdl-whole-work"


def cpu_of(cmd, env=None):
    """Runs `cmd`; its CPU-seconds (user + system, threads included) and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, r.stdout


def mdl_series(mdl, files, flags=(), config=()):
    """(commits' CPU-s, maintenance CPU-s, ratio once settled)."""
    repo = os.path.join(SHM, "repo")
    shutil.rmtree(repo, ignore_errors=True)
    cpu_of([mdl, "init", repo])
    for kv in config:
        cpu_of([mdl, "-C", repo, "config", *kv.split("=", 1)])
    quiet = dict(os.environ, MDL_NO_BACKGROUND="1")
    commits = sum(cpu_of([mdl, "-C", repo, "commit", f, *flags], env=quiet)[0] for f in files)
    maintenance, _ = cpu_of([mdl, "-C", repo, "maintenance"], env=quiet)
    _, out = cpu_of([mdl, "-C", repo, "--json", "stats"])
    stats = json.loads(out)
    shutil.rmtree(repo, ignore_errors=True)
    return commits, maintenance, stats["raw_bytes"] / stats["stored_bytes"]


def zstd_series(files):
    """(CPU-s of `zstd -3 -T1` over each file, ratio)."""
    cpu = 0.0
    raw = packed = 0
    for f in files:
        dst = os.path.join(SHM, "peer.zst")
        c, _ = cpu_of(["zstd", "-3", "-T1", "-q", "-f", f, "-o", dst])
        cpu += c
        raw += os.path.getsize(f)
        packed += os.path.getsize(dst)
        os.remove(dst)
    return cpu, raw / packed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=os.path.expanduser("~/.cache/mdl-corpus"))
    ap.add_argument("--series", default="traj-fp32,traj-bf16,ft-fp32")
    ap.add_argument("--mdl", default="target/release/mdl")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--config", action="append", default=["quant.adam_betas=0.9,0.95"],
                    help="lossy repositories' configuration KEY=VALUE (the corpus trains with "
                         "betas 0.9/0.95)")
    ap.add_argument("--no-lossy", action="store_true", help="the lossless table only")
    ap.add_argument("--zipnn-python", default=None,
                    help="a Python with torch for ZipNN (scripts/bench-peers.sh); left out if absent")
    ap.add_argument("--zipnn-path", default=None, help="the folder ZipNN is installed in")
    args = ap.parse_args()
    os.makedirs(SHM, exist_ok=True)
    print(f"one thread for zstd; mdl as it runs (all cores); medians of {args.repeat}; tmpfs")
    peer = " ZipNN CPU-s | whole / ZipNN | ZipNN ratio |" if args.zipnn_python else ""
    print("| series | mdl commits CPU-s | mdl maintenance CPU-s | mdl whole CPU-s "
          "| zstd -3 CPU-s | whole / zstd | mdl ratio | zstd ratio |" + peer)
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|---:|---:|" * bool(peer))
    lossy = []
    for name in args.series.split(","):
        d = os.path.join(args.corpus, name)
        # Copied to tmpfs once, so neither tool waits on the disk.
        src = os.path.join(SHM, "src")
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(d, src)
        files = sorted(os.path.join(src, f) for f in os.listdir(src)
                       if f.endswith(".safetensors"))
        runs = []
        for _ in range(args.repeat):
            # Interleaved, so both meet the same machine.
            c, m, ratio = mdl_series(args.mdl, files)
            z, zratio = zstd_series(files)
            lc = lratio = float("nan")
            if not args.no_lossy:
                lc, _, lratio = mdl_series(args.mdl, files, ["--lossy"], args.config)
            zc = zr = float("nan")
            if args.zipnn_python:
                zn = zipnn.series(files, args.zipnn_python, args.zipnn_path, threads=1)
                zc, zr = zn["cpu"], zn["ratio"] if zn["round_trips"] else float("nan")
            runs.append((c, m, c + m, z, (c + m) / z, ratio, zratio, lc, lc / (c + m), lratio,
                         zc, (c + m) / zc, zr))
        med = [statistics.median(col) for col in zip(*runs)]
        line = (f"| {name} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} | {med[3]:.2f} "
                f"| {med[4]:.2f} | {med[5]:.3f} | {med[6]:.3f} |")
        if peer:
            # A ratio of "nan": ZipNN's output did not decompress to the file.
            line += f" {med[10]:.2f} | {med[11]:.2f} | {med[12]:.3f} |"
        print(line, flush=True)
        lossy.append((name, med))
        shutil.rmtree(src, ignore_errors=True)
    if args.no_lossy:
        return
    print()
    print("| series | lossy commits CPU-s | lossless whole CPU-s | lossy / lossless whole "
          "| lossy ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, med in lossy:
        print(f"| {name} | {med[7]:.2f} | {med[2]:.2f} | **{med[8]:.2f}×** | {med[9]:.2f} |")


if __name__ == "__main__":
    main()
