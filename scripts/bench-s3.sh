#!/usr/bin/env bash
# Object storage against local disk (docs/BENCHMARKS.md, "Repositories in object storage"):
# commits a checkpoint series (default: the corpus's traj-fp32, ../shared/corpus) into a
# local repository and into a repository in a local SeaweedFS (scripts/seaweedfs-env.sh),
# checks out the newest and the oldest commit from each (the S3 checkout from a fresh
# machine's cache, so it fetches; also a fresh machine's log and a machine whose cache is a
# quarter of a checkpoint), and uploads the same files with boto3 (pinned below,
# installed beside SeaweedFS) as the plain-upload baseline. Prints one table: seconds, MB/s of
# checkpoint bytes, and PUTs per commit.
#   MDL=path/to/mdl SERIES=dir scripts/bench-s3.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mdl=${MDL:-target/release/mdl}
series=${SERIES:-$HOME/.cache/mdl-corpus/traj-fp32}
weed=$(scripts/seaweedfs-env.sh)
venv=$(dirname "$(dirname "$weed")")
[ -e "$venv/.boto3-1.44.5" ] || { "$venv/bin/pip" install --quiet --disable-pip-version-check boto3==1.44.5 >&2 && touch "$venv/.boto3-1.44.5"; }
work=$(mktemp -d /tmp/mdl-bench-s3.XXXXXX)
trap 'kill $(cat "$work/pid" 2>/dev/null) 2>/dev/null; rm -rf "$work"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
p=(); for i in $(seq 0 11); do p+=("$(port)"); done
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret AWS_ALLOW_HTTP=true
export AWS_ENDPOINT_URL=http://127.0.0.1:${p[6]}
mkdir -p "$work/weed"
"$weed" mini -dir="$work/weed" -ip=127.0.0.1 -ip.bind=127.0.0.1 -webdav=false -admin.ui=false -bucket=bench \
    -master.port=${p[0]} -master.port.grpc=${p[1]} -volume.port=${p[2]} -volume.port.grpc=${p[3]} \
    -filer.port=${p[4]} -filer.port.grpc=${p[5]} -s3.port=${p[6]} -s3.port.grpc=${p[7]} \
    -s3.port.iceberg=${p[8]} -s3.port.lance=${p[9]} -admin.port=${p[10]} -admin.port.grpc=${p[11]} \
    >"$work/weed.log" 2>&1 &
echo $! >"$work/pid"
for _ in $(seq 1 240); do (exec 3<>/dev/tcp/127.0.0.1/${p[6]}) 2>/dev/null && break; sleep 0.25; done
sleep 2
files=$(ls "$series"/*.safetensors | sort)
n=$(echo "$files" | wc -l)
bytes=$(cat $files | wc -c)
oldest=$(echo "$files" | head -1)
newest=$(echo "$files" | tail -1)
size() { stat -c %s "$1"; }
now() { date +%s.%N; }
row() { printf '%-34s %8.2f s %9.1f MB/s %s\n' "$1" "$2" "$(echo "$3 / $2 / 1000000" | bc -l)" "${4:-}"; }
echo "series: $series ($n files, $((bytes / 1000000)) MB); $(nproc) cores"
# Local disk.
"$mdl" init "$work/local" >/dev/null
t=$(now); for f in $files; do "$mdl" -C "$work/local" commit "$f" -m x >/dev/null 2>&1; done
row "commit, local disk" "$(echo "$(now) - $t" | bc)" "$bytes"
# The deferred re-encodes the commits left (DECISIONS, "Deferred reverse deltas"), done before
# the checkouts are timed: a background run still going would take their cores.
"$mdl" -C "$work/local" maintenance >/dev/null 2>&1
t=$(now); "$mdl" -C "$work/local" checkout HEAD -o "$work/o1" >/dev/null
row "checkout newest, local disk" "$(echo "$(now) - $t" | bc)" "$(size "$newest")"
t=$(now); "$mdl" -C "$work/local" checkout "HEAD~$((n - 1))" -o "$work/o2" >/dev/null
row "checkout oldest, local disk" "$(echo "$(now) - $t" | bc)" "$(size "$oldest")"
# SeaweedFS.
export MDL_CACHE_DIR=$work/cache-writer
"$mdl" -C s3://bench/run init >/dev/null
puts=0
t=$(now); for f in $files; do
    c=$("$mdl" -v -C s3://bench/run commit "$f" -m x 2>&1 >/dev/null | sed -n 's/.*: \([0-9]*\) PUTs.*/\1/p')
    puts=$((puts + c))
done
row "commit, SeaweedFS" "$(echo "$(now) - $t" | bc)" "$bytes" "$(echo "$puts / $n" | bc -l | xargs printf '%.1f') PUTs a commit"
down() { sed -n 's/.* \([0-9]*\) bytes down.*/\1/p' | awk '{s += $1} END {printf "%.1f MB down", s / 1e6}'; }
export MDL_CACHE_DIR=$work/cache-log
t=$(now); got=$("$mdl" -v -C s3://bench/run log 2>&1 >/dev/null | down)
row "log, SeaweedFS, fresh machine" "$(echo "$(now) - $t" | bc)" 0 "$got"
export MDL_CACHE_DIR=$work/cache-reader
t=$(now); got=$("$mdl" -v -C s3://bench/run checkout HEAD -o "$work/o3" 2>&1 >/dev/null | down)
row "checkout newest, SeaweedFS, cold" "$(echo "$(now) - $t" | bc)" "$(size "$newest")" "(fresh cache; $got)"
t=$(now); "$mdl" -C s3://bench/run checkout HEAD -o "$work/o3" --force >/dev/null
row "checkout newest, SeaweedFS, warm" "$(echo "$(now) - $t" | bc)" "$(size "$newest")"
t=$(now); got=$("$mdl" -v -C s3://bench/run checkout "HEAD~$((n - 1))" -o "$work/o4" 2>&1 >/dev/null | down)
row "checkout oldest, SeaweedFS, after newest" "$(echo "$(now) - $t" | bc)" "$(size "$oldest")" "($got)"
cmp "$work/o3" "$newest" && cmp "$work/o4" "$oldest"
# A machine whose cache holds a quarter of one checkpoint: every checkout fetches again.
export MDL_CACHE_DIR=$work/cache-small MDL_CACHE_SIZE=$(( $(size "$newest") / 4 ))
"$mdl" -C s3://bench/run log >/dev/null
t=$(now); got=$("$mdl" -v -C s3://bench/run checkout HEAD -o "$work/o5" 2>&1 >/dev/null | down)
row "checkout newest, cache 1/4 checkpoint" "$(echo "$(now) - $t" | bc)" "$(size "$newest")" "($got; $(du -sb "$work/cache-small" | cut -f1 | awk '{printf "%.1f", $1 / 1e6}') MB cached after)"
cmp "$work/o5" "$newest"
unset MDL_CACHE_SIZE
bucket=$("$venv/bin/python" -c '
import os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
pages = s3.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix="run/")
print(sum(o["Size"] for p in pages for o in p.get("Contents", [])))')
echo "repository in the bucket: $(echo "$bucket / 1000000" | bc -l | xargs printf '%.1f') MB; writer's replica: $(du -sb "$work/cache-writer" | cut -f1 | awk '{printf "%.1f", $1 / 1e6}') MB"
# Plain uploads of the same files (what `aws s3 cp` does), boto3's default transfer settings.
t=$(now)
"$venv/bin/python" - "$series" <<'PY'
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
d = sys.argv[1]
for name in sorted(os.listdir(d)):
    if name.endswith(".safetensors"):
        s3.upload_file(os.path.join(d, name), "bench", "plain/" + name)
PY
row "upload with boto3 (plain files)" "$(echo "$(now) - $t" | bc)" "$bytes" "$(( $(size "$newest") / (8 << 20) + 1 )) PUTs a file (8 MiB parts)"
t=$(now)
"$venv/bin/python" - "$work/dl" "$series" <<'PY'
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
name = sorted(n for n in os.listdir(sys.argv[2]) if n.endswith(".safetensors"))[-1]
s3.download_file("bench", "plain/" + name, sys.argv[1])
PY
row "download newest with boto3" "$(echo "$(now) - $t" | bc)" "$(size "$newest")"
