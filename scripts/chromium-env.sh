#!/usr/bin/env bash
# Prints the path of the Chromium the browser test (tests/e2e/web.rs, `web::in_chromium`)
# drives headless: $MDL_CHROMIUM if set, else Debian's `chromium` package, installed with
# apt-get on first use when running as root (CI does). Fails with a message where neither
# is possible. Progress goes to stderr.
set -euo pipefail
if [ -n "${MDL_CHROMIUM:-}" ]; then
    echo "$MDL_CHROMIUM"
    exit 0
fi
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "Chromium is not installed (as root: apt-get install chromium)" >&2
        exit 1
    fi
    echo "installing Debian's chromium (once; ~300 MB)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >&2 || { apt-get update -q >&2 && apt-get install -y -q chromium >&2; }
fi
bin=$(command -v chromium)
"$bin" --version >&2
echo "$bin"
