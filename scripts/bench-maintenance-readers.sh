#!/usr/bin/env bash
# Readers during maintenance (issue 68, docs/BENCHMARKS.md): two versions of a checkpoint of
# GIB GiB (a training step apart) committed with their re-encode deferred, then `mdl
# maintenance` turning the first into a reverse delta of the second while, in a loop, `mdl log`,
# `mdl show` and `mdl checkout` of both commits run with --wait 0 (a read that would have to
# wait fails instead); every checkout is compared with the bytes it gave before. The same for
# a lossy series (`--lossy`; it defers nothing, so its maintenance is `mdl compact --max-depth
# 0`, every chain re-encoded whole). Prints the counts, failures and median latencies.
# Usage: scripts/bench-maintenance-readers.sh [GIB]   (default 2; MDL_PYTHON: a python with
# numpy, default the test suite's cached environment)
#   MDL  the mdl binary (default: target/release/mdl, built here)
set -euo pipefail
cd "$(dirname "$0")/.."
gib=${1:-2}
py=${MDL_PYTHON:-$(ls -d "$HOME"/.cache/mdl/python/*/bin/python | head -1)}
if [ -z "${MDL:-}" ]; then
    cargo build --release -p mdl-cli
    MDL=$PWD/target/release/mdl
fi
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
MDL="$MDL" WORK="$work" GIB="$gib" "$py" - <<'EOF'
import hashlib, json, os, statistics, struct, subprocess, threading, time
import numpy as np

mdl, work, gib = os.environ["MDL"], os.environ["WORK"], float(os.environ["GIB"])
env = dict(os.environ, MDL_NO_BACKGROUND="1")

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

n = max(1, int(gib * 2**30 / 4 / 2**24))
rng = np.random.default_rng(0)
versions = []
for step in range(2):
    path = os.path.join(work, f"v{step}.safetensors")
    tensors = []
    for k in range(n):
        g = np.random.default_rng([k])
        w = (g.standard_normal(2**24, dtype=np.float32) * np.float32(0.02)).reshape(4096, 4096)
        if step:
            d = np.random.default_rng([k, step])
            w = w + (d.standard_normal(2**24, dtype=np.float32) * np.float32(1e-4)).reshape(4096, 4096)
        tensors.append((f"layer{k}.weight", w.astype(np.float32)))
    safetensors(path, tensors)
    versions.append(path)

def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(1 << 24):
            h.update(b)
    return h.hexdigest()

def series(name, lossy):
    repo = os.path.join(work, name)
    subprocess.run([mdl, "init", repo], check=True, capture_output=True)
    subprocess.run([mdl, "-C", repo, "config", "delta.defer", "true"], check=True, capture_output=True)
    for i, v in enumerate(versions):
        extra = ["--lossy"] if lossy else []
        subprocess.run([mdl, "-C", repo, "commit", v, "-m", f"v{i}", "--step", str(i), *extra],
                       check=True, capture_output=True, env=env)
    out = os.path.join(work, "out.safetensors")
    want = {}
    for rev in ("main~1", "main"):
        subprocess.run([mdl, "-C", repo, "checkout", rev, "-o", out, "--force"], check=True, capture_output=True)
        want[rev] = sha(out)
    reads = {
        "log": ["log", "--wait", "0"],
        "show main": ["show", "main", "--wait", "0"],
        "checkout main~1": ["checkout", "main~1", "-o", "OUT", "--force", "--wait", "0"],
        "checkout main": ["checkout", "main", "-o", "OUT", "--force", "--wait", "0"],
    }
    t0 = time.perf_counter()
    upkeep = ["compact", "--max-depth", "0"] if lossy else ["maintenance"]
    maint = subprocess.Popen([mdl, "-C", repo, *upkeep], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    done = {k: [] for k in reads}
    failed = {k: [] for k in reads}
    wrong = [0]

    def loop(keys, out):
        # Checkouts (seconds each) in a thread of their own, beside the quick reads.
        while maint.poll() is None:
            for k in keys:
                t = time.perf_counter()
                args = [a if a != "OUT" else out for a in reads[k]]
                r = subprocess.run([mdl, "-C", repo, *args], capture_output=True, text=True)
                s = time.perf_counter() - t
                if r.returncode != 0:
                    failed[k].append(r.stderr.strip())
                    continue
                done[k].append(s)
                if k.startswith("checkout") and sha(out) != want[k.split()[1]]:
                    wrong[0] += 1

    checkouts = threading.Thread(target=loop, args=(["checkout main~1", "checkout main"], out))
    checkouts.start()
    loop(["log", "show main"], None)
    checkouts.join()
    wrong = wrong[0]
    took = time.perf_counter() - t0
    said = maint.stdout.read().strip()
    assert maint.returncode == 0, maint.stderr.read()
    reads_n = sum(len(v) for v in done.values()) + sum(len(v) for v in failed.values())
    print(f"\n{name}: `mdl {' '.join(upkeep)}` {took:.1f} s ({said}); {reads_n} reads during it, "
          f"{sum(len(v) for v in failed.values())} refused, {wrong} checkouts not byte-identical\n")
    print("| read | runs during maintenance | median | refused (--wait 0) |")
    print("|---|---:|---:|---:|")
    for k in reads:
        med = f"{statistics.median(done[k]) * 1000:.0f} ms" if done[k] else "—"
        print(f"| `mdl {k}` | {len(done[k])} | {med} | {len(failed[k])} |")
    for k, errs in failed.items():
        for e in errs[:2]:
            print(f"{k}: {e}")

print(f"two versions of {n} f32 tensors of 4096 × 4096 ({os.path.getsize(versions[0]) / 2**30:.1f} GiB each), {os.cpu_count()} cores")
series("lossless", False)
series("lossy", True)
EOF
