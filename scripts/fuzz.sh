#!/usr/bin/env bash
# Runs mdl's fuzz targets (entropy streams, float payloads, quant payloads) for SECONDS each (default 60).
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`); the stable toolchain is enough:
# RUSTC_BOOTSTRAP lets cargo-fuzz pass its sanitizer flags.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-60}"
for target in entropy_stream float_payload quant_payload; do
    RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$target" -- -max_total_time="$secs" -rss_limit_mb=2048
done
