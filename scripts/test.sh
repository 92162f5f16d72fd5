#!/usr/bin/env bash
# The whole test suite: the Rust workspace, the object-storage tests against a real
# S3-compatible server (SeaweedFS, installed by scripts/seaweedfs-env.sh; ignored in a plain
# `cargo test`), the web view in headless Chromium (installed by scripts/chromium-env.sh; a
# machine where it cannot be says the test was skipped, and under CI that fails the run), then
# the Python tests (scripts/test-python.sh).
# What the README names and .ci/run runs (after fmt and clippy).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
# `--workspace --test e2e` rather than `-p mdl-cli`: the same feature set as the line above, so
# nothing is compiled again (`-p` resolves features for that package alone).
MDL_WEED=$(scripts/seaweedfs-env.sh) cargo test --workspace --test e2e -- --ignored s3:: s3_upkeep:: s3_availability:: backends::
if chromium=$(scripts/chromium-env.sh); then
    MDL_CHROMIUM=$chromium cargo test --workspace --test e2e web::in_chromium -- --ignored --nocapture
elif [ -n "${CI:-}" ]; then
    echo "error: CI needs Chromium for the browser test (scripts/chromium-env.sh)" >&2
    exit 1
else
    echo "skipped: web::in_chromium, the browser test (no Chromium; scripts/chromium-env.sh)"
fi
scripts/test-python.sh
