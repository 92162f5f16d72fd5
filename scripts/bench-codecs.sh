#!/usr/bin/env bash
# The lossless-codec benchmark of docs/BENCHMARKS.md: the default configuration on both corpus
# series (median of 3, with zstd -3 / -19 baselines), then the delta policies on traj-fp32.
# Usage: scripts/bench-codecs.sh [CORPUS_DIR]   (default: ~/.cache/mdl-corpus, from
# ../shared/corpus/make.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
corpus="${1:-$HOME/.cache/mdl-corpus}"
cargo build --release -p mdl-cli
bench=target/release/mdl-bench
echo "## default configuration"
"$bench" --repeat 3 "$corpus/traj-fp32" "$corpus/traj-bf16"
for cfg in delta.max_depth=4 delta.max_depth=8 delta.max_depth=16 delta.mode=forward delta.mode=off; do
    echo
    echo "## $cfg"
    "$bench" --repeat 1 --no-zstd19 --config "$cfg" "$corpus/traj-fp32"
done
