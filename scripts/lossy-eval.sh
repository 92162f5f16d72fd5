#!/usr/bin/env bash
# Validation loss of every lossily reconstructed corpus checkpoint against its original
# (docs/BENCHMARKS.md): each series is committed with --lossy into one repository, every commit
# is checked out, and gen_trajectory.py --eval scores originals and reconstructions.
# Usage: scripts/lossy-eval.sh [EXTRA mdl commit ARGS...]   (needs ../shared/corpus/make.sh run;
# MDL_EVAL_SERIES picks the series, default "traj-fp32 traj-bf16")
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MDL_CORPUS:-$HOME/.cache/mdl-corpus}"
py="$cache/venv/bin/python"
gen=../shared/corpus/gen_trajectory.py
cargo build --release -p mdl-cli
mdl="$PWD/target/release/mdl"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for series in ${MDL_EVAL_SERIES:-traj-fp32 traj-bf16}; do
    dtype=${series#traj-}
    repo="$work/$series"
    mkdir -p "$repo/out"
    "$mdl" -C "$repo" init >/dev/null
    # The corpus trains with AdamW betas 0.9/0.95.
    "$mdl" -C "$repo" config quant.adam_betas 0.9,0.95 >/dev/null
    files=("$cache/$series"/ckpt_*.safetensors)
    for f in "${files[@]}"; do
        "$mdl" -C "$repo" commit "$f" --lossy "$@" -m "$(basename "$f")" >/dev/null 2>&1
    done
    n=${#files[@]}
    outs=()
    for ((i = 0; i < n; i++)); do
        out="$repo/out/$(basename "${files[$i]}")"
        "$mdl" -C "$repo" checkout "HEAD~$((n - 1 - i))" -o "$out" >/dev/null
        outs+=("$out")
    done
    echo "## $series (repository $(du -sb "$repo/.mdl/objects" | cut -f1) bytes)"
    echo "| checkpoint | original val loss | reconstructed | change |"
    echo "|---|---:|---:|---:|"
    paste <("$py" "$gen" --dtype "$dtype" --out "$work/gen" --eval "${files[@]}" | awk '{print $1, $NF}') \
        <("$py" "$gen" --dtype "$dtype" --out "$work/gen" --eval "${outs[@]}" | awk '{print $NF}') |
        awk '{n = $1; sub(/.*\//, "", n); printf "| %s | %.4f | %.4f | %+.4f (%+.2f %%) |\n", n, $2, $3, $3-$2, ($3/$2-1)*100}'
done
