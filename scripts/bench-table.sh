#!/usr/bin/env bash
# Every row of issue 70's table in one run, each with its same-run baselines (docs/BENCHMARKS.md,
# "The whole table"): on the corpus series (../shared/corpus/make.sh, cached in
# ~/.cache/mdl-corpus) and on tmpfs,
#   1. commits until they return beside `zstd -3 -T2`, `lmz -j 2` and ZipNN on two threads;
#      newest and oldest checkouts beside `zstd -d` and `cp`; the lossy commit and its tip
#      checkout (bench/speed/run.py, the durable part left out);
#   2. the whole work per checkpoint (commits plus every deferred re-encode) and the lossy
#      commits in CPU-seconds beside `zstd -3` and ZipNN on one thread (bench/whole-work);
#   3. the entropy coder alone beside zstd's HUF_ coders (scripts/bench-huffman.sh);
#   4. Python's blocking `commit_state` of a 1 GiB state beside a lone `torch.save` + fsync, and
#      its peak memory (bench/python-stall --only-blocking, the package built here in release);
#   5. each phase of a commit at one thread and at two (bench/phases);
#   6. the oldest checkout of a depth-16 chain: the corpus' traj-fp32 deepened to 19 checkpoints
#      with midpoints (bench/speed/deepen.py), newest and oldest checked out.
# The 16-core row needs the GPU machine's host (scripts/gpu-check.sh). About 7 minutes here, the
# first run longer (the peers' install and a release build).
# Run it with /dev/shm empty: where tmpfs already holds several GB, the kernel reclaims memory
# while the commits write theirs, which doubled a 1 GiB blocking commit's system time here.
# Usage: scripts/bench-table.sh [--repeat N]     (default 3; the speed table runs once)
#   MDL  the mdl binary (default: target/release/mdl, built here)
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=3
if [ "${1:-}" = "--repeat" ]; then repeat=$2; fi
if [ -z "${MDL:-}" ]; then
    cargo build --release -p mdl-cli
    MDL=$PWD/target/release/mdl
fi
eval "$(scripts/bench-peers.sh)"
python_env=$(scripts/python-env.sh)
pkg=$PWD/target/bench-package
wheel=$(MATURIN="$python_env/bin/maturin" scripts/build-wheel.sh --profile release \
    --out target/wheels-bench --cli "$MDL" | tail -1)
rm -rf "$pkg"
"$python_env/bin/pip" install --quiet --no-deps --target "$pkg" "$wheel"
uptime
echo "## 1. Commits and checkouts beside the peers"
python3 bench/speed/run.py --mdl "$MDL" --lmz "$LMZ" --zipnn-python "$ZIPNN_PYTHON" \
    --zipnn-path "$ZIPNN_PATH" --skip durable
echo
echo "## 2. The whole work per checkpoint, in CPU-seconds"
python3 bench/whole-work/run.py --mdl "$MDL" --repeat "$repeat" \
    --zipnn-python "$ZIPNN_PYTHON" --zipnn-path "$ZIPNN_PATH"
echo
echo "## 3. The entropy coder alone"
scripts/bench-huffman.sh --repeat $((repeat * 3))
echo
echo "## 4. Python: a blocking commit_state beside torch.save"
PYTHONPATH=$pkg "$python_env/bin/python" bench/python-stall/run.py --dir /dev/shm --sizes 1 \
    --reps $((repeat + 2)) --only-blocking
echo
echo "## 5. A commit's phases at one thread and at two"
python3 bench/phases/run.py --mdl "$MDL" --repeat "$repeat"
echo
echo "## 6. The oldest checkout of a depth-16 chain"
deep=/dev/shm/mdl-bench-deep
rm -rf "$deep"
"$python_env/bin/python" bench/speed/deepen.py --series traj-fp32,ft-fp32 --out "$deep"
python3 bench/speed/run.py --mdl "$MDL" --corpus "$deep" --series traj-fp32,ft-fp32 \
    --skip lossy,durable --repeat "$repeat"
rm -rf "$deep"
uptime
