#!/usr/bin/env bash
# The entropy coder alone beside zstd's Huffman coder (HUF_, through zstd-sys) and the
# huffman-compress crate, one thread, on the exponent planes of the corpus' last checkpoints
# (bench/huffman-compare; docs/BENCHMARKS.md). Needs ../shared/corpus/make.sh run once.
# Usage: scripts/bench-huffman.sh [--repeat N] [FILE.safetensors...]
set -euo pipefail
cd "$(dirname "$0")/.."
corpus="${MDL_CORPUS:-$HOME/.cache/mdl-corpus}"
args=()
files=()
while [ $# -gt 0 ]; do
    case "$1" in
        --repeat) args+=("$1" "$2"); shift 2 ;;
        *) files+=("$1"); shift ;;
    esac
done
if [ ${#files[@]} -eq 0 ]; then
    files=("$corpus/traj-fp32/ckpt_000200.safetensors" "$corpus/traj-bf16/ckpt_000200.safetensors")
fi
cargo run --release -q --manifest-path bench/huffman-compare/Cargo.toml -- "${args[@]}" "${files[@]}"
