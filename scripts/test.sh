#!/usr/bin/env bash
# The whole test suite: the Rust workspace, then the Python tests (scripts/test-python.sh).
# What the README names and .ci/run runs (after fmt and clippy).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
scripts/test-python.sh
