#!/usr/bin/env bash
# Install Debian's chromium for the headless browser tests when it is missing.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium not found and cannot be installed here (need root and apt-get); browser tests will fail" >&2
    exit 0
fi
echo "installing chromium for the browser tests (apt-get)..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq chromium >/dev/null
