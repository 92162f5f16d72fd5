#!/usr/bin/env bash
# Real quality of lossy commits (docs/BENCHMARKS.md): the corpus training run with every
# checkpoint committed with --lossy and checked out again before training continues
# (gen_trajectory.py --restore-cmd, 9 restores), against the unbroken run, for fp32 and for
# bf16 with fp32 master weights.
# Usage: scripts/lossy-quality.sh [EXTRA mdl commit ARGS...]   (needs ../shared/corpus/make.sh run)
#   MDL_QUALITY_RUNS  which runs: "fp32", "bf16" or "fp32 bf16" (the default)
#   MDL_QUALITY_CONFIG  "key=value;..." configuration for the lossy repositories
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MDL_CORPUS:-$HOME/.cache/mdl-corpus}"
py="$cache/venv/bin/python"
gen=../shared/corpus/gen_trajectory.py
cargo build --release -p mdl-cli
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export MDL_RT_CONFIG="quant.adam_betas=0.9,0.95;${MDL_QUALITY_CONFIG:-}"
export MDL_RT_ARGS="--lossy $*"
final() { grep 'step    200  lr' "$1" | awk '{print $8}'; }
for dtype in ${MDL_QUALITY_RUNS:-fp32 bf16}; do
    case $dtype in
        fp32) set -- ;;
        bf16) set -- --master ;;
        *) echo "MDL_QUALITY_RUNS: fp32 or bf16, not $dtype" >&2; exit 2 ;;
    esac
    "$py" "$gen" --dtype "$dtype" "$@" --out "$work/base-$dtype" > "$work/base-$dtype.log"
    MDL_RT="$work/repo-$dtype" "$py" "$gen" --dtype "$dtype" "$@" --out "$work/lossy-$dtype" \
        --restore-cmd "$PWD/scripts/lossy-roundtrip.sh" > "$work/lossy-$dtype.log"
    b=$(final "$work/base-$dtype.log"); l=$(final "$work/lossy-$dtype.log")
    echo "$dtype: unbroken $b, 9 lossy restores $l ($(awk "BEGIN{printf \"%+.2f\", ($l/$b-1)*100}") %), repository $(du -sb "$work/repo-$dtype/.mdl/objects" | cut -f1) bytes"
    grep -E 'restored from' "$work/lossy-$dtype.log" | awk '{print "  step " $2 ": restored val_loss " $NF}'
done
