#!/usr/bin/env bash
# The whole test suite: the Rust workspace, the object-storage tests against a real
# S3-compatible server (SeaweedFS, installed by scripts/seaweedfs-env.sh; ignored in a plain
# `cargo test`), then the Python tests (scripts/test-python.sh).
# What the README names and .ci/run runs (after fmt and clippy).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
MDL_WEED=$(scripts/seaweedfs-env.sh) cargo test -p mdl-cli --test e2e s3:: -- --ignored
scripts/test-python.sh
