#!/usr/bin/env bash
# The compaction benchmark of docs/BENCHMARKS.md: a 40-commit series (the corpus generator with
# --steps 800 --every 20) committed with forward deltas at depth caps 4, 8, 16 and unbounded,
# and the unbounded repository compacted to each cap with `mdl compact`: storage, worst-case and
# mean checkout time over all 40 commits, longest chain. The default (reverse deltas, cap 16) is
# the reference row.
# Usage: scripts/bench-compact.sh [SERIES_DIR]  (default: ~/.cache/mdl-corpus/traj40-fp32, made
# by: python shared/corpus/gen_trajectory.py --out DIR --steps 800 --every 20)
set -euo pipefail
cd "$(dirname "$0")/.."
series="${1:-$HOME/.cache/mdl-corpus/traj40-fp32}"
cargo build --release -p mdl-cli
MDL="$PWD/target/release/mdl" SERIES="$series" python3 - <<'EOF'
import json, os, shutil, statistics, subprocess, sys, tempfile, time

mdl, series = os.environ["MDL"], os.environ["SERIES"]
files = sorted(os.path.join(series, f) for f in os.listdir(series) if f.endswith(".safetensors"))
raw = sum(os.path.getsize(f) for f in files)
work = tempfile.mkdtemp(prefix="mdl-compact-")

def run(repo, *args):
    out = subprocess.run([mdl, "-C", repo, *args, "--json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout) if out.stdout.strip() else None

def stored(repo):
    total = 0
    for root, _, names in os.walk(os.path.join(repo, ".mdl", "objects")):
        total += sum(os.path.getsize(os.path.join(root, n)) for n in names)
    return total

def commit_all(name, mode, cap):
    repo = os.path.join(work, name)
    subprocess.run([mdl, "init", repo], check=True, capture_output=True)
    run(repo, "config", "delta.mode", mode)
    run(repo, "config", "delta.max_depth", str(cap))
    t = time.perf_counter()
    ids = [run(repo, "commit", f, "-m", os.path.basename(f))["id"] for f in files]
    return repo, ids, time.perf_counter() - t

def measure(repo, ids):
    out = os.path.join(work, "out.safetensors")
    times = []
    for i in ids:
        t = time.perf_counter()
        run(repo, "checkout", i, "-o", out, "--force")
        times.append(time.perf_counter() - t)
    longest = run(repo, "fsck")["longest_chain"]
    return stored(repo), max(times), statistics.mean(times), statistics.median(times), longest

rows = []
def row(label, repo, ids, extra=""):
    s, worst, mean, med, longest = measure(repo, ids)
    rows.append((label, s, worst, mean, med, longest, extra))
    print(f"{label:<34} {s/2**20:9.1f} MiB  ratio {raw/s:5.2f}  worst {worst:6.3f} s  mean {mean:6.3f} s  median {med:6.3f} s  longest {longest:3d}  {extra}", flush=True)

print(f"series: {len(files)} checkpoints, {raw/2**20:.1f} MiB raw")
repo, ids, secs = commit_all("reverse16", "reverse", 16)
row("reverse deltas, cap 16 (default)", repo, ids, f"commit {secs:.1f} s")
shutil.rmtree(repo)
for cap in [4, 8, 16]:
    repo, ids, secs = commit_all(f"fwd{cap}", "forward", cap)
    row(f"forward, cap {cap} at commit", repo, ids, f"commit {secs:.1f} s")
    shutil.rmtree(repo)
base, ids, secs = commit_all("fwd-unbounded", "forward", 512)
row("forward, unbounded", base, ids, f"commit {secs:.1f} s")
for cap in [16, 8, 4]:
    repo = os.path.join(work, f"compacted{cap}")
    shutil.copytree(base, repo)
    t = time.perf_counter()
    c = run(repo, "compact", "--max-depth", str(cap))
    secs = time.perf_counter() - t
    row(f"forward, unbounded -> compact {cap}", repo, ids, f"compact {secs:.1f} s, {c['reencoded']} re-encoded")
    shutil.rmtree(repo)
shutil.rmtree(work)
EOF
