#!/usr/bin/env bash
# The web view on a large repository (docs/BENCHMARKS.md): COMMITS commits (default 1000:
# main, and a branch of the last tenth forked from its 80%) of TENSORS tensors each (default
# 1000, 256 f32 each, every one changed by every commit, with step and loss recorded), served
# by `mdl serve`; each page and, as same-run baselines, the JSON API's log and show of the
# same data, fetched RUNS times (default 5) with curl. Prints the first fetch and the median
# (the server keeps the storage page's report after its first fetch, until the repository
# changes).
# Usage: scripts/bench-web.sh [COMMITS] [TENSORS]
#   MDL   the mdl binary (default: target/release/mdl, built here)
#   RUNS  fetches a page (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
commits=${1:-1000}
tensors=${2:-1000}
runs=${RUNS:-5}
if [ -z "${MDL:-}" ]; then
    cargo build --release -p mdl-cli
    MDL=$PWD/target/release/mdl
fi
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
"$MDL" init >/dev/null
export MDL_AUTHOR=bench
python3 - "$commits" "$tensors" "$MDL" <<'PY'
import json, os, random, struct, subprocess, sys, time
commits, tensors, mdl = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
random.seed(0)
base = [bytearray(os.urandom(1024)) for _ in range(tensors)]
names = [f"model.layers.{i // 8}.part{i % 8}.weight" for i in range(tensors)]
header, off = {}, 0
for n in names:
    header[n] = {"dtype": "F32", "shape": [16, 16], "data_offsets": [off, off + 1024]}
    off += 1024
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
def write(step, state):
    with open("c.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(state))
def commit(step, state, extra=()):
    for t in state:
        at = random.randrange(0, 1024, 4)
        t[at:at + 4] = struct.pack("<f", random.gauss(0, 0.02))
    write(step, state)
    subprocess.run([mdl, "commit", "c.safetensors", "-m", f"step {step}", "--step", str(step),
                    "--metric", f"loss={3.0 / (1 + step / 100):.4f}", *extra],
                   check=True, stdout=subprocess.DEVNULL)
side = commits // 10
fork = int((commits - side) * 0.8)
start = time.time()
state = base
for s in range(commits - side):
    commit(s * 10, state)
    if s + 1 == fork:
        saved = [bytearray(t) for t in state]
subprocess.run([mdl, "branch", "exp", f"HEAD~{commits - side - fork}"], check=True, stdout=subprocess.DEVNULL)
subprocess.run([mdl, "switch", "exp"], check=True, stdout=subprocess.DEVNULL)
for s in range(fork, fork + side):
    commit(s * 10, saved)
subprocess.run([mdl, "switch", "main"], check=True, stdout=subprocess.DEVNULL)
print(f"made {commits} commits of {tensors} tensors in {time.time() - start:.0f} s", file=sys.stderr)
PY
port=$((20000 + RANDOM % 20000))
"$MDL" serve --addr 127.0.0.1:$port --read-public >serve.log 2>&1 &
for _ in $(seq 50); do grep -q "^web view" serve.log 2>/dev/null && break; sleep 0.2; done
base=http://127.0.0.1:$port
repo=$(basename "$work")
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
printf '%-40s %10s %10s %10s\n' "page ($commits commits x $tensors tensors)" "first s" "median s" "bytes"
for path in "/ui/$repo" "/ui/$repo?page=20" "/ui/$repo/commit/HEAD" "/ui/$repo/commit/HEAD?page=10" \
    "/ui/$repo/compare?a=HEAD~1&b=HEAD" "/ui/$repo/compare?a=main&b=exp" "/ui/$repo/storage" \
    "/ui/$repo/storage?page=5" "/v1/repos/$repo/log" "/v1/repos/$repo/commits/HEAD"; do
    for _ in $(seq "$runs"); do
        curl -sf -o page.out -w '%{time_total}\n' "$base$path"
    done >times
    size=$(stat -c %s page.out)
    printf '%-40s %10s %10s %10s\n' "$path" "$(head -1 times)" "$(median <times)" "$size"
done | sed "s#/$repo#/REPO#"
