"""Commit and checkout speed of mdl beside its peers, in one run (docs/BENCHMARKS.md, issue 22).

For each corpus series (a directory of safetensors checkpoints, committed in name order):

- CPU-bound: inputs, repository and outputs on tmpfs (/dev/shm). mdl commits the series
  losslessly with eager reverse deltas (`delta.defer=false`; each commit timed as the whole
  process), checks out the newest and the oldest
  commit (verified byte for byte; the newest against `zstd -d` and `cp` of the same file), then
  commits the series again with --lossy and checks out its newest commit from the decoded tips
  and again without them (the two compared byte for byte). `zstd -3 -T2` and
  `lmz compress -j 2` compress the same files, one at a time, from the same tmpfs.
- Deferred: the series again with `delta.defer=true` (commits alone, then one `mdl maintenance`;
  and beside the background maintenance each commit starts), with the ratio afterwards.
- ZipNN (with --zipnn-python/--zipnn-path; scripts/bench-peers.sh installs it): each file
  compressed in memory on two threads by bench/peers/zipnn_compress.py (its Python start-up
  left out, where every other tool's process start is counted), checked to round-trip.
- Durable: the disk's fsync bandwidth (`dd conv=fsync` of random data, same run), then the
  lossless series committed into a repository on that disk, eager and deferred (commits alone);
  the target is 80 % of bandwidth × stored ratio.

Prints markdown tables: per series the ratio, total MB/s of input (all commits) and the median
per-commit MB/s, and speed ratios against the peers.

    python3 bench/speed/run.py [--corpus DIR] [--series traj-fp32,...] [--mdl PATH]
                               [--lmz PATH] [--zipnn-python PY --zipnn-path DIR]
                               [--disk DIR] [--repeat N]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
import zipnn_compress as zipnn  # noqa: E402  (bench/peers: runs ZipNN where it is installed)

SHM = "/dev/shm/mdl-speed-bench"


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def timed(cmd, env=None):
    t = time.perf_counter()
    out = run(cmd, env=env)
    return time.perf_counter() - t, out


QUIET = dict(os.environ, MDL_NO_BACKGROUND="1")


def deferred_series(mdl, repo, files, config):
    """The series with `delta.defer=true`: each commit alone (no background maintenance), then
    one `mdl maintenance` doing every queued re-encode; then the series again with the
    background maintenance each commit starts, waited for at the end. Returns the commits' MB/s,
    the maintenance's seconds, the ratio afterwards (from `mdl stats`), and the MB/s of the
    commits beside their background maintenance."""
    cfg = [*config, "delta.defer=true"]
    _r, speed, _m, _t = mdl_series(mdl, repo, files, [], cfg, env=QUIET, settle=False)
    dt, _ = timed([mdl, "-C", repo, "maintenance"])
    stats = json.loads(run([mdl, "-C", repo, "--json", "stats"]))
    ratio = stats["raw_bytes"] / stats["stored_bytes"]
    _r, beside, _m, _t = mdl_series(mdl, repo, files, [], cfg)
    return speed, dt, ratio, beside


def size_of(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


def mdl_series(mdl, repo, files, flags, config, env=None, settle=True):
    """Commits `files` into a fresh repository: (ratio, total MB/s, median MB/s, seconds each).
    With `settle`, `mdl maintenance` first does what the commits deferred (ratio: `mdl stats`)."""
    shutil.rmtree(repo, ignore_errors=True)
    run([mdl, "init", repo])
    for kv in config:
        k, v = kv.split("=", 1)
        run([mdl, "-C", repo, "config", k, v])
    raw = 0
    times = []
    for f in files:
        dt, out = timed([mdl, "-C", repo, "--json", "commit", f, *flags], env=env)
        raw += json.loads(out)["raw_bytes"]
        times.append(dt)
    speeds = [size_of(f) / t / 1e6 for f, t in zip(files, times)]
    # The ratio once what the commits deferred is done (`mdl maintenance` also waits for a
    # background run): what the repository settles at.
    if settle:
        run([mdl, "-C", repo, "maintenance"])
    stats = json.loads(run([mdl, "-C", repo, "--json", "stats"]))
    return stats["raw_bytes"] / stats["stored_bytes"], raw / sum(times) / 1e6, \
        statistics.median(speeds), times


def mdl_checkouts(mdl, repo, files, verify):
    """Checkout MB/s of the newest and the oldest commit."""
    speeds = []
    for rev, src in [("main", files[-1]), (f"main~{len(files) - 1}", files[0])]:
        out = os.path.join(SHM, "out.safetensors")
        if os.path.exists(out):
            os.remove(out)
        dt, _ = timed([mdl, "-C", repo, "checkout", rev, "-o", out])
        if verify:
            run(["cmp", out, src])  # fails the run on any difference
        speeds.append(size_of(out) / dt / 1e6)
        os.remove(out)
    return speeds


def lossy_tip_checkouts(mdl, repo):
    """Checkout MB/s of a lossy series' newest commit read from its decoded tips, then again
    with the tips removed (every residual chain decoded), the two outputs compared byte for
    byte; and the tips' MB (`mdl stats`), measured before they are removed."""
    tips_mb = json.loads(run([mdl, "-C", repo, "--json", "stats"])).get("tips_bytes", 0) / 1e6
    outs = []
    speeds = []
    for k in range(2):
        out = os.path.join(SHM, f"lossy{k}.safetensors")
        if os.path.exists(out):
            os.remove(out)
        if k == 1:
            shutil.rmtree(os.path.join(repo, ".mdl", "tips"), ignore_errors=True)
        dt, _ = timed([mdl, "-C", repo, "checkout", "main", "-o", out])
        speeds.append(size_of(out) / dt / 1e6)
        outs.append(out)
    run(["cmp", *outs])  # fails the run on any difference
    for out in outs:
        os.remove(out)
    return speeds[0], speeds[1], tips_mb


def peer_series(files, command, suffix):
    """Compresses each file on its own with `command(src, dst)`: (ratio, total MB/s)."""
    raw = packed = 0
    total = 0.0
    for f in files:
        dst = os.path.join(SHM, "peer" + suffix)
        if os.path.exists(dst):
            os.remove(dst)
        dt, _ = timed(command(f, dst))
        total += dt
        raw += size_of(f)
        packed += size_of(dst)
        os.remove(dst)
    return raw / packed, raw / total / 1e6


def read_baselines(path):
    """MB/s of `zstd -d` of the file (compressed with `zstd -3` first) and of `cp` of it, both
    writing to tmpfs: what a newest checkout is measured against."""
    size = size_of(path)
    packed = os.path.join(SHM, "base.zst")
    out = os.path.join(SHM, "base.out")
    run(["zstd", "-q", "-3", "-T2", path, "-o", packed])
    speeds = []
    for cmd in (["zstd", "-q", "-d", packed, "-o", out], ["cp", path, out]):
        if os.path.exists(out):
            os.remove(out)
        dt, _ = timed(cmd)
        speeds.append(size / dt / 1e6)
    os.remove(out)
    os.remove(packed)
    return speeds


def fsync_bandwidth(disk, mib=512):
    """MB/s of `dd conv=fsync` writing random data onto `disk` (the data made first, on tmpfs)."""
    src = os.path.join(SHM, "random.bin")
    run(["dd", "if=/dev/urandom", f"of={src}", "bs=1M", f"count={mib}"])
    dst = os.path.join(disk, "dd.bin")
    t = time.perf_counter()
    run(["dd", f"if={src}", f"of={dst}", "bs=1M", "conv=fsync"])
    dt = time.perf_counter() - t
    os.remove(dst)
    os.remove(src)
    return mib * 1048576 / dt / 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--corpus", default=os.path.expanduser("~/.cache/mdl-corpus"))
    p.add_argument("--series", default="traj-fp32,traj-bf16,ft-fp32")
    p.add_argument("--mdl", default="target/release/mdl")
    p.add_argument("--lmz", default=None, help="the lmz CLI (PyPI lmzip 1.3.0); left out if absent")
    p.add_argument("--zipnn-python", default=None,
                   help="a Python with torch for ZipNN (scripts/bench-peers.sh); left out if absent")
    p.add_argument("--zipnn-path", default=None, help="the folder ZipNN is installed in")
    p.add_argument("--disk", default=os.path.expanduser("~/.cache/mdl/bench/disk"),
                   help="a directory on the real disk, for the durable commit")
    p.add_argument("--repeat", type=int, default=1, help="runs of everything; medians reported")
    p.add_argument("--config", action="append", default=["quant.adam_betas=0.9,0.95"],
                   help="repository configuration KEY=VALUE (the corpus trains with betas 0.9/0.95)")
    p.add_argument("--skip", default="", help="parts left out while iterating: lossy,durable")
    a = p.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    mdl = os.path.abspath(a.mdl)
    shutil.rmtree(SHM, ignore_errors=True)
    os.makedirs(SHM)
    os.makedirs(a.disk, exist_ok=True)
    print(f"{run([mdl, '--version']).strip()}; {run(['zstd', '--version']).strip()}"
          + (f"; {run([a.lmz, '--version']).strip()}" if a.lmz else ""))
    rows = {}
    for name in a.series.split(","):
        src = os.path.join(a.corpus, name)
        inp = os.path.join(SHM, "in", name)
        shutil.copytree(src, inp)
        files = sorted(os.path.join(inp, f) for f in os.listdir(inp) if f.endswith(".safetensors"))
        repo = os.path.join(SHM, "repo")
        runs = []
        for _ in range(a.repeat):
            r = {}
            # Eager reverse deltas (each commit re-encodes its parent's tensors itself).
            eager = [*a.config, "delta.defer=false"]
            r["ratio"], r["commit"], r["commit_med"], _t = mdl_series(mdl, repo, files, [], eager)
            r["newest"], r["oldest"] = mdl_checkouts(mdl, repo, files, verify=True)
            stats = json.loads(run([mdl, "-C", repo, "--json", "stats"]))
            r["stats_ratio"] = stats["raw_bytes"] / stats["stored_bytes"]
            r["deferred"], r["maintenance_s"], r["deferred_ratio"], r["beside"] = deferred_series(
                mdl, repo + "-deferred", files, a.config)
            shutil.rmtree(repo + "-deferred", ignore_errors=True)
            r["zstd_d"], r["cp"] = read_baselines(files[-1])
            r["lossy_ratio"] = r["lossy"] = r["lossy_med"] = float("nan")
            r["lossy_tip"] = r["lossy_chain"] = r["tips_mb"] = float("nan")
            if "lossy" not in skip:
                r["lossy_ratio"], r["lossy"], r["lossy_med"], _t = mdl_series(
                    mdl, repo, files, ["--lossy"], a.config, env=QUIET)
                r["lossy_tip"], r["lossy_chain"], r["tips_mb"] = lossy_tip_checkouts(mdl, repo)
            r["zstd_ratio"], r["zstd"] = peer_series(
                files, lambda f, d: ["zstd", "-q", "-3", "-T2", f, "-o", d], ".zst")
            if a.lmz:
                r["lmz_ratio"], r["lmz"] = peer_series(
                    files, lambda f, d: [a.lmz, "compress", "-q", "-j", "2", f, d], ".lmz")
            if a.zipnn_python:
                z = zipnn.series(files, a.zipnn_python, a.zipnn_path, threads=2)
                r["zipnn_ratio"], r["zipnn"], r["zipnn_ok"] = z["ratio"], z["mbps"], z["round_trips"]
            r["fsync"] = r["durable"] = r["durable_deferred"] = float("nan")
            if "durable" not in skip:
                disk_repo = os.path.join(a.disk, "repo")
                r["fsync"] = fsync_bandwidth(a.disk)
                _r, r["durable"], _m, _t = mdl_series(
                    mdl, disk_repo, files, [], [*a.config, "delta.defer=false"])
                _r, r["durable_deferred"], _m, _t = mdl_series(
                    mdl, disk_repo, files, [], [*a.config, "delta.defer=true"], env=QUIET)
                shutil.rmtree(disk_repo, ignore_errors=True)
            runs.append(r)
        rows[name] = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        if a.zipnn_python:
            rows[name]["zipnn_ok"] = all(x["zipnn_ok"] for x in runs)
        print(f"{name}: {len(files)} checkpoints of {size_of(files[0]) / 1e6:.1f} MB", flush=True)
        shutil.rmtree(inp)
        shutil.rmtree(repo, ignore_errors=True)

    print()
    print("CPU-bound (tmpfs). MB/s of input; commit = all commits' bytes / all commits' time "
          "(median per commit in brackets); eager reverse deltas (delta.defer=false).")
    print()
    lmz = bool(a.lmz)
    head = "| series | mdl ratio | mdl commit | zstd -3 -T2 ratio | zstd MB/s | mdl / zstd |"
    sep = "|---|---:|---:|---:|---:|---:|"
    if lmz:
        head += " lmz ratio | lmz -j 2 MB/s | mdl / lmz |"
        sep += "---:|---:|---:|"
    with_zipnn = bool(a.zipnn_python)
    if with_zipnn:
        head += " ZipNN ratio | ZipNN 2 threads MB/s | mdl / ZipNN |"
        sep += "---:|---:|---:|"
    print(head)
    print(sep)
    for name, r in rows.items():
        line = (f"| {name} | {r['ratio']:.3f} | {r['commit']:.0f} ({r['commit_med']:.0f}) "
                f"| {r['zstd_ratio']:.3f} | {r['zstd']:.0f} | **{r['commit'] / r['zstd']:.2f}×** |")
        if lmz:
            line += f" {r['lmz_ratio']:.3f} | {r['lmz']:.0f} | {r['commit'] / r['lmz']:.2f}× |"
        if with_zipnn:
            ok = "" if r["zipnn_ok"] else " (did not round-trip)"
            line += f" {r['zipnn_ratio']:.3f}{ok} | {r['zipnn']:.0f} | {r['commit'] / r['zipnn']:.2f}× |"
        print(line)
    print()
    print("Deferred reverse deltas (`delta.defer=true`): the commits alone, the one `mdl maintenance` "
          "after them, the ratio then (`mdl stats`, against the eager series' own), and the commits "
          "again beside the background maintenance each one starts.")
    print()
    print("| series | deferred commit MB/s | / zstd | maintenance s | ratio after / eager "
          "| commit beside background MB/s | / zstd |" + " deferred / lmz | deferred / ZipNN |" * with_zipnn)
    print("|---|---:|---:|---:|---:|---:|---:|" + "---:|---:|" * with_zipnn)
    for name, r in rows.items():
        line = (f"| {name} | {r['deferred']:.0f} | **{r['deferred'] / r['zstd']:.2f}×** "
                f"| {r['maintenance_s']:.2f} | {r['deferred_ratio']:.3f} / {r['stats_ratio']:.3f} "
                f"| {r['beside']:.0f} | {r['beside'] / r['zstd']:.2f}× |")
        if with_zipnn:
            lmz_x = r["deferred"] / r["lmz"] if lmz else float("nan")
            line += f" {lmz_x:.2f}× | {r['deferred'] / r['zipnn']:.2f}× |"
        print(line)
    print()
    print("| series | checkout newest MB/s | zstd -d MB/s | newest / zstd -d | cp MB/s "
          "| newest / cp | oldest MB/s | newest / oldest |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['newest']:.0f} | {r['zstd_d']:.0f} | **{r['newest'] / r['zstd_d']:.2f}×** "
              f"| {r['cp']:.0f} | {r['newest'] / r['cp']:.2f}× | {r['oldest']:.0f} "
              f"| {r['newest'] / r['oldest']:.2f} |")
    if "lossy" not in skip:
        print()
        print("| series | lossy ratio | lossy commit MB/s | / eager lossless time "
              "| / deferred lossless time |")
        print("|---|---:|---:|---:|---:|")
        for name, r in rows.items():
            print(f"| {name} | {r['lossy_ratio']:.2f} | {r['lossy']:.0f} | {r['commit'] / r['lossy']:.2f} "
                  f"| {r['deferred'] / r['lossy']:.2f} |")
        print()
        print("Lossy newest checkout: from the decoded tips (`.mdl/tips`), then with them removed "
              "(every residual chain decoded; same bytes), against the lossless newest checkout.")
        print()
        print("| series | tips MB | lossy tip checkout MB/s | lossless newest MB/s | lossy / lossless time "
              "| without tips MB/s | lossy / lossless time |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, r in rows.items():
            print(f"| {name} | {r['tips_mb']:.1f} | {r['lossy_tip']:.0f} | {r['newest']:.0f} "
                  f"| **{r['newest'] / r['lossy_tip']:.2f}×** | {r['lossy_chain']:.0f} "
                  f"| {r['newest'] / r['lossy_chain']:.2f}× |")
    if "durable" in skip:
        shutil.rmtree(SHM, ignore_errors=True)
        return
    print()
    print(f"Durable (repository in {a.disk}): fsync bandwidth of random data measured before "
          "each series.")
    print()
    print("| series | fsync MB/s | × ratio | durable commit MB/s, eager | fraction "
          "| deferred (alone) | fraction |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        bound = r["fsync"] * r["ratio"]
        print(f"| {name} | {r['fsync']:.0f} | {bound:.0f} | {r['durable']:.0f} "
              f"| {r['durable'] / bound:.2f} | {r['durable_deferred']:.0f} "
              f"| **{r['durable_deferred'] / bound:.2f}** |")
    shutil.rmtree(SHM, ignore_errors=True)


if __name__ == "__main__":
    main()
