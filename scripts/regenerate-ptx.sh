#!/usr/bin/env bash
# Regenerates crates/mdl-gpu/kernels/mdl.ptx from kernels/mdl.cu with NVRTC (installed from
# the pinned wheel; no CUDA or GPU needed). Run it after any change to the kernel source: the
# test `committed_ptx_matches_the_source` fails until the PTX is regenerated.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/nvrtc-env.sh
cargo run -q -p mdl-gpu --example write-ptx
