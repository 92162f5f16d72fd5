#!/usr/bin/env bash
# Commit and checkout speed beside the peers (docs/BENCHMARKS.md, issue 22): mdl against
# `zstd -3 -T2` and `lmz compress -j 2` (PyPI lmzip, pinned below, installed into a cache outside
# the clone) on the corpus series, on tmpfs and durably on the disk, in one run.
# Usage: scripts/bench-speed.sh [ARGS...]   (passed to bench/speed/run.py; see its --help)
#   MDL  the mdl binary (default: target/release/mdl, built here)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${MDL:-}" ]; then
    cargo build --release -p mdl-cli
    MDL=$PWD/target/release/mdl
fi
lmzip=1.3.0
peers="${XDG_CACHE_HOME:-$HOME/.cache}/mdl/bench/peers-lmzip-$lmzip"
if [ ! -e "$peers/installed" ]; then
    rm -rf "$peers"
    python3 -m venv "$peers"
    "$peers/bin/pip" install -q "lmzip==$lmzip" "zstandard==0.25.0"
    touch "$peers/installed"
fi
exec python3 bench/speed/run.py --mdl "$MDL" --lmz "$peers/bin/lmz" "$@"
