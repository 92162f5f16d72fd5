# Sourced by the scripts here that make series beside the corpus: `cache` (the corpus cache,
# from the first argument, MDL_CORPUS or ~/.cache/mdl-corpus), `gen` (the corpus' training
# script) and `py` (the corpus' Python, which ../shared/corpus/make.sh installs).
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
cache=${1:-${MDL_CORPUS:-$HOME/.cache/mdl-corpus}}
gen="$here/../../../shared/corpus/gen_trajectory.py"
py="$cache/venv/bin/python"
[ -x "$py" ] || { echo "error: run ../shared/corpus/make.sh first (it makes $cache/venv)" >&2; exit 1; }
