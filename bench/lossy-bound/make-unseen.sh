#!/usr/bin/env bash
# A fine-tune no lossy setting was tuned on (issue 73's target "a fine-tune of a real
# pretrained model that is not in the corpus"): the corpus model pretrained 800 steps from seed 7,
# then fine-tuned on the shifted domain (the stdlib's tests) at 3e-4 — three
# times ft-fp32's learning rate — for 200 steps, a checkpoint every 20 and the pretrained base
# first. About 13 minutes on 2 cores; cached like the corpus.
#   bench/lossy-bound/make-unseen.sh [CACHE_DIR]      then
#   MDL_EVAL_SERIES=ft-unseen-fp32 scripts/lossy-eval.sh
set -euo pipefail
source "$(dirname "$0")/corpus-env.sh"
out="$cache/ft-unseen-fp32"
if [ "$(ls "$out"/*.safetensors 2>/dev/null | wc -l)" -lt 11 ]; then
    pre="$cache/pretrain-unseen"
    rm -rf "$out.tmp" "$pre"
    "$py" "$gen" --out "$pre" --steps 800 --every 800 --seed 7 >&2
    "$py" "$gen" --out "$out.tmp" --init-from "$pre/ckpt_000800.safetensors" --domain tests \
        --lr 3e-4 --steps 200 --every 20 --save-init --seed 7 >&2
    rm -rf "$out" "$pre"
    mv "$out.tmp" "$out"
fi
echo "$out"
