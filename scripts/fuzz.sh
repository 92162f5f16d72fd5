#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets: one per decoder of untrusted bytes, each calling
# the function of the same name in crates/mdl-fuzzing) for SECONDS each (default 60), starting
# from the seeds mdl-fuzzing writes into fuzz/corpus. `cargo test -p mdl-fuzzing` runs the same
# checks over seeds and a few thousand generated inputs on the stock toolchain (and CI does).
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`); the stable toolchain is enough:
# RUSTC_BOOTSTRAP lets cargo-fuzz pass its sanitizer flags. Crashes land in
# fuzz/artifacts/TARGET/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
cargo run -q -p mdl-fuzzing --example write_seeds -- fuzz/corpus
cd fuzz
mkdir -p artifacts
for target in $(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^mdl-fuzz$'); do
    echo "== $target (${secs} s)"
    log="artifacts/$target.log"
    status=0
    RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$target" "corpus/$target" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|SUMMARY|Test unit written' "$log" || true
    if [ "$status" != 0 ]; then
        echo "$target: crashed (exit $status); see fuzz/$log"
        exit "$status"
    fi
done
