#!/usr/bin/env bash
# The lossy benchmark of docs/BENCHMARKS.md: each corpus series committed losslessly and with
# --lossy at the default ε in the same run (ratio, weights/optimizer ratios, commit time).
# Usage: scripts/bench-lossy.sh [CORPUS_DIR]   (default: ~/.cache/mdl-corpus)
set -euo pipefail
cd "$(dirname "$0")/.."
corpus="${1:-$HOME/.cache/mdl-corpus}"
cargo build --release -p mdl-cli
bench=target/release/mdl-bench
# The corpus trains with AdamW betas 0.9/0.95.
cfg=(--config quant.adam_betas=0.9,0.95)
for s in traj-fp32 traj-bf16 ft-fp32; do
    echo "## $s lossless"
    "$bench" --repeat 1 --no-zstd19 "${cfg[@]}" "$corpus/$s"
    echo "## $s lossy"
    "$bench" --repeat 1 --no-zstd19 "${cfg[@]}" --commit-arg --lossy "$corpus/$s"
done
