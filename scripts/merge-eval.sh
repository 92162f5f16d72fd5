#!/usr/bin/env bash
# `mdl merge` on a real case (docs/BENCHMARKS.md, "Merging fine-tunes"): the corpus' pretrained
# model (ft-fp32's step 0) fine-tuned three ways by the corpus script — on its test-suite domain
# with seeds 0 (ft-fp32's step 200) and 1, and on the stdlib domain with seed 2 — each
# committed on a branch of one repository over the base; then merged, and every parent and
# merge scored on both domains' validation sets (gen_trajectory.py --eval).
# Usage: scripts/merge-eval.sh   (needs ../shared/corpus/make.sh run; the two extra fine-tunes,
# about 3 minutes each on 2 cores, are cached beside the corpus)
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MDL_CORPUS:-$HOME/.cache/mdl-corpus}"
py="$cache/venv/bin/python"
gen=../shared/corpus/gen_trajectory.py
base="$cache/ft-fp32/ckpt_000000.safetensors"
tune() { # NAME DOMAIN SEED
    local out="$cache/merge-$1"
    if [ ! -e "$out/ckpt_000200.safetensors" ]; then
        rm -rf "$out.tmp"
        "$py" "$gen" --out "$out.tmp" --init-from "$base" --domain "$2" --lr 1e-4 --steps 200 \
            --every 200 --seed "$3" >&2
        rm -rf "$out"; mv "$out.tmp" "$out"
    fi
    echo "$out/ckpt_000200.safetensors"
}
tests_b=$(tune tests-s1 tests 1)
stdlib=$(tune stdlib-s2 stdlib 2)
cargo build -q --release -p mdl-cli
mdl="$PWD/target/release/mdl"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
repo="$work/repo"
"$mdl" init "$repo" >/dev/null
"$mdl" -C "$repo" commit "$base" -m "pretrained" >/dev/null 2>&1
for b in tests-a tests-b stdlib; do "$mdl" -C "$repo" branch "$b" >/dev/null; done
"$mdl" -C "$repo" commit "$cache/ft-fp32/ckpt_000200.safetensors" --branch tests-a -m "tests, seed 0" >/dev/null 2>&1
"$mdl" -C "$repo" commit "$tests_b" --branch tests-b -m "tests, seed 1" >/dev/null 2>&1
"$mdl" -C "$repo" commit "$stdlib" --branch stdlib -m "stdlib, seed 2" >/dev/null 2>&1
merge() { # BRANCH ARGS...
    local b=$1; shift
    "$mdl" -C "$repo" merge "$@" --branch "$b" >/dev/null 2>"$work/$b.err" || { cat "$work/$b.err" >&2; exit 1; }
    sed -n 's/^/  /p' "$work/$b.err" >&2
}
merge soup tests-a tests-b
merge cross tests-a stdlib
merge cross-task tests-a stdlib --strategy task-arithmetic
merge cross-ties tests-a stdlib --strategy ties --density 0.2
revs="main tests-a tests-b stdlib soup cross cross-task cross-ties"
for r in $revs; do "$mdl" -C "$repo" checkout "$r" -o "$work/$r.safetensors" >/dev/null 2>&1; done
score() { "$py" "$gen" --eval $(for r in $revs; do echo "$work/$r.safetensors"; done) --domain "$1" 2>/dev/null \
    | awk '{print $NF}'; }
mapfile -t on_tests < <(score tests)
mapfile -t on_stdlib < <(score stdlib)
printf '| %-11s | %-48s | %9s | %9s |\n' revision what "val tests" "val stdlib"
printf '|%s|%s|%s|%s|\n' "-------------" "--------------------------------------------------" "----------:" "-----------:"
i=0
for r in $revs; do
    what=$("$mdl" -C "$repo" log "$r" -n 1 --json | "$py" -c 'import json,sys; print(json.load(sys.stdin)[0]["message"])')
    printf '| %-11s | %-48s | %9s | %9s |\n' "$r" "$what" "${on_tests[$i]}" "${on_stdlib[$i]}"
    i=$((i + 1))
done
"$mdl" -C "$repo" log --graph --all >&2
