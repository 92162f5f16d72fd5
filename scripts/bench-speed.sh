#!/usr/bin/env bash
# Commit and checkout speed beside the peers (docs/BENCHMARKS.md, issue 22): mdl against
# `zstd -3 -T2`, `lmz compress -j 2` and ZipNN on two threads (scripts/bench-peers.sh installs
# them, pinned, into caches outside the clone) on the corpus series, on tmpfs and durably on
# the disk, in one run.
# Usage: scripts/bench-speed.sh [ARGS...]   (passed to bench/speed/run.py; see its --help)
#   MDL  the mdl binary (default: target/release/mdl, built here)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${MDL:-}" ]; then
    cargo build --release -p mdl-cli
    MDL=$PWD/target/release/mdl
fi
eval "$(scripts/bench-peers.sh)"
exec python3 bench/speed/run.py --mdl "$MDL" --lmz "$LMZ" \
    --zipnn-python "$ZIPNN_PYTHON" --zipnn-path "$ZIPNN_PATH" "$@"
