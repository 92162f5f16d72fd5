#!/usr/bin/env bash
# Readers beside a writer (docs/BENCHMARKS.md): the latency of `mdl log`, `mdl show HEAD` and
# `mdl checkout HEAD` of an existing commit on an idle repository, and again while a multi-GB
# commit is at work in another process (each read run with --wait 0, so one that would have to
# wait fails instead). Medians of the runs that completed while the commit was still running.
# Usage: scripts/bench-readers.sh [GIB]   (size of the large checkpoint, default 2; needs the
# corpus venv for numpy: ../shared/corpus/make.sh, or MDL_PYTHON=a python with numpy)
#   MDL  the mdl binary (default: target/release/mdl, built here)
set -euo pipefail
cd "$(dirname "$0")/.."
gib=${1:-2}
py=${MDL_PYTHON:-$HOME/.cache/mdl-corpus/venv/bin/python}
if [ -z "${MDL:-}" ]; then
    cargo build --release -p mdl-cli
    MDL=$PWD/target/release/mdl
fi
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
MDL="$MDL" WORK="$work" GIB="$gib" "$py" - <<'EOF'
import json, os, statistics, struct, subprocess, time
import numpy as np

mdl, work, gib = os.environ["MDL"], os.environ["WORK"], float(os.environ["GIB"])
repo = os.path.join(work, "repo")

def safetensors(path, tensors):
    header, offset = {}, 0
    for name, a in tensors:
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, a in tensors:
            f.write(a.tobytes())

rng = np.random.default_rng(0)
small = os.path.join(work, "small.safetensors")
safetensors(small, [(f"w{k}", (rng.standard_normal((1024, 1024)) * 0.02).astype(np.float32)) for k in range(8)])
big = os.path.join(work, "big.safetensors")
n = int(gib * 2**30 / 4 / 2**24)
safetensors(big, [(f"w{k}", (rng.standard_normal((4096, 4096)) * 0.02).astype(np.float32)) for k in range(n)])

def mdl_run(*args, check=True):
    return subprocess.run([mdl, "-C", repo, *args], capture_output=True, text=True, check=check)

subprocess.run([mdl, "init", repo], check=True, capture_output=True)
mdl_run("commit", small, "-m", "small")
out = os.path.join(work, "out.safetensors")
reads = {
    "log": ["log", "--wait", "0"],
    "show HEAD": ["show", "HEAD", "--wait", "0"],
    "checkout HEAD (32 MiB)": ["checkout", "HEAD", "-o", out, "--force", "--wait", "0"],
}

def timed(args):
    t = time.perf_counter()
    r = mdl_run(*args, check=False)
    return time.perf_counter() - t, r.returncode, r.stderr.strip()

idle = {k: statistics.median(timed(a)[0] for _ in range(5)) for k, a in reads.items()}
t0 = time.perf_counter()
writer = subprocess.Popen([mdl, "-C", repo, "commit", big, "-m", "big"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
time.sleep(0.5)
during = {k: [] for k in reads}
failed = {k: [] for k in reads}
while writer.poll() is None:
    for k, a in reads.items():
        s, rc, err = timed(a)
        if writer.poll() is not None:
            break
        (during[k] if rc == 0 else failed[k]).append(s if rc == 0 else err)
commit_s = time.perf_counter() - t0
assert writer.returncode == 0, writer.stderr.read()
print(f"commit of {os.path.getsize(big) / 2**30:.1f} GiB: {commit_s:.1f} s ({os.cpu_count()} cores)\n")
print("| read | idle, median of 5 | during the commit, median | runs during the commit | failed (--wait 0) |")
print("|---|---:|---:|---:|---:|")
for k in reads:
    med = f"{statistics.median(during[k]) * 1000:.0f} ms" if during[k] else "—"
    print(f"| `mdl {k}` | {idle[k] * 1000:.0f} ms | {med} | {len(during[k])} | {len(failed[k])} |")
for k, errs in failed.items():
    for e in errs[:2]:
        print(f"{k}: {e}")
EOF
