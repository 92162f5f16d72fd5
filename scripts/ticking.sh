# Sourced by the scripts that install something large once (torch, SeaweedFS, Chromium,
# NVRTC): `ticking WHAT COMMAND…` runs COMMAND and, every 20 s while it runs, says on stderr
# that WHAT is still going, so that a download or an unpack that prints nothing for minutes
# does not look hung. Its status is COMMAND's; Ctrl-C stops COMMAND too.
ticking() {
    local what=$1
    shift
    "$@" &
    local pid=$! start=$SECONDS next=20
    trap 'kill "$pid" 2>/dev/null; exit 130' INT TERM
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        if ((SECONDS - start >= next)); then
            echo "… still $what ($((SECONDS - start)) s)" >&2
            next=$((next + 20))
        fi
    done
    trap - INT TERM
    wait "$pid"
}
