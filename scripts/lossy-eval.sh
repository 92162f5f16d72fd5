#!/usr/bin/env bash
# Validation loss of every lossily reconstructed corpus checkpoint against its original
# (docs/BENCHMARKS.md): each series is committed with --lossy into one repository, every commit
# is checked out, and gen_trajectory.py --eval scores originals and reconstructions.
# The table sets each reconstruction's measured change beside the change mdl recorded for it
# (the commit's estimated loss change) and their ratio: the bound holds where the ratio is at
# most 1 (measured changes below zero are improvements). Then the worst of those ratios, the
# largest share of its printed budget a commit recorded, and the series' ratios by mdl's,
# DynaQuant's and ExCP's accountings (`mdl stats --lossy`).
# Usage: scripts/lossy-eval.sh [EXTRA mdl commit ARGS...]   (needs ../shared/corpus/make.sh run;
# MDL_EVAL_SERIES picks the series, default "traj-fp32 traj-bf16 ft-fp32"; MDL_EVAL_CONFIG
# "key=value;..." sets repository configuration; a series is a folder of the corpus cache or
# any folder of checkpoints named ckpt_*.safetensors, with MDL_EVAL_DOMAIN_<name> overriding
# its validation domain; MDL_EVAL_BASE_CMD commits each series' first checkpoint with that
# --eval-cmd; MDL_BIN runs that mdl instead of building this tree's)
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${MDL_CORPUS:-$HOME/.cache/mdl-corpus}"
py="$cache/venv/bin/python"
gen=../shared/corpus/gen_trajectory.py
if [ -n "${MDL_BIN:-}" ]; then
    mdl=$MDL_BIN
else
    cargo build --release -p mdl-cli
    mdl="$PWD/target/release/mdl"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for series in ${MDL_EVAL_SERIES:-traj-fp32 traj-bf16 ft-fp32}; do
    dir=$series
    [ -d "$dir" ] || dir="$cache/$series"
    name=$(basename "$dir")
    dtype=fp32
    case $name in *bf16*) dtype=bf16 ;; esac
    domain=stdlib
    case $name in ft-*) domain=tests ;; esac
    var="MDL_EVAL_DOMAIN_${name//[^A-Za-z0-9]/_}"
    domain=${!var:-$domain}
    repo="$work/$name"
    mkdir -p "$repo/out"
    "$mdl" -C "$repo" init >/dev/null
    # The corpus trains with AdamW betas 0.9/0.95.
    "$mdl" -C "$repo" config quant.adam_betas 0.9,0.95 >/dev/null
    IFS=';' read -ra kvs <<< "${MDL_EVAL_CONFIG:-}"
    for kv in "${kvs[@]}"; do
        [ -n "$kv" ] && "$mdl" -C "$repo" config "${kv%%=*}" "${kv#*=}" >/dev/null
    done
    files=("$dir"/ckpt_*.safetensors)
    : > "$work/est"
    first=1
    for f in "${files[@]}"; do
        extra=()
        # MDL_EVAL_BASE_CMD: the series' first commit (a base without moments) is committed
        # with --eval-cmd "$MDL_EVAL_BASE_CMD" (scored by the user's metric, not held to ε of
        # relative error); '{}' is the candidate file, DOMAIN the series' validation domain.
        if [ "$first" = 1 ] && [ -n "${MDL_EVAL_BASE_CMD:-}" ]; then
            extra=(--eval-cmd "${MDL_EVAL_BASE_CMD//DOMAIN/$domain}")
        fi
        first=0
        "$mdl" -C "$repo" commit "$f" --lossy "$@" "${extra[@]}" -m "$(basename "$f")" 2>&1 |
            sed -n 's/.*estimated loss change \([^ ]*\) (budget \([^ )]*\).*/\1 \2/p' > "$work/one"
        if [ -s "$work/one" ]; then cat "$work/one" >> "$work/est"; else echo 0 0 >> "$work/est"; fi
    done
    n=${#files[@]}
    outs=()
    for ((i = 0; i < n; i++)); do
        out="$repo/out/$(basename "${files[$i]}")"
        "$mdl" -C "$repo" checkout "HEAD~$((n - 1 - i))" -o "$out" >/dev/null
        outs+=("$out")
    done
    raw=$(du -cb "${files[@]}" | tail -1 | cut -f1)
    stored=$(du -sb "$repo/.mdl/objects" | cut -f1)
    echo "## $name ($domain): repository $stored bytes, $(awk "BEGIN{printf \"%.2f\", $raw/$stored}")× the checkpoints' $raw"
    echo "| checkpoint | original val loss | reconstructed | change | recorded estimate | measured / recorded |"
    echo "|---|---:|---:|---:|---:|---:|"
    paste <("$py" "$gen" --dtype "$dtype" --domain "$domain" --out "$work/gen" --eval "${files[@]}" | awk '{print $1, $NF}') \
        <("$py" "$gen" --dtype "$dtype" --domain "$domain" --out "$work/gen" --eval "${outs[@]}" | awk '{print $NF}') \
        "$work/est" |
        awk '{n = $1; sub(/.*\//, "", n); d = $3 - $2; r = ($4 > 0) ? sprintf("%.2f", d / $4) : "—";
              if ($4 > 0 && (worst == "" || d / $4 > worst)) worst = d / $4;
              if ($5 > 0 && $4 / $5 > spent) spent = $4 / $5;
              printf "| %s | %.4f | %.4f | %+.4f (%+.2f %%) | %.2e | %s |\n", n, $2, $3, d, ($3/$2-1)*100, $4, r}
             END {printf "\nworst measured / recorded %s; largest recorded / printed budget %.3f\n",
                         (worst == "") ? "—" : sprintf("%.2f", worst), spent}'
    # The series as the lossy papers count it (`mdl stats --lossy`).
    "$mdl" -C "$repo" stats --lossy --json | python3 -c '
import json, sys
a = json.load(sys.stdin)["lossy"]
print("ratios: mdl %.2fx, DynaQuant %.2fx, ExCP %.2fx" % (a["ratio"], a["dynaquant"], a["excp"]))'
done
