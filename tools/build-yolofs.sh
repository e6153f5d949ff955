#!/usr/bin/env bash
# Build the yolofs binary (release) into yolofs/target/release/yolofs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/tools/env.sh"
cd "$repo/yolofs"
echo "==> building yolofs (release; a few minutes the first time)"
# A line per 25 crates compiled instead of cargo's hundreds; errors and warnings as they come.
cargo build --release --locked 2>&1 | awk '
    /^ *Compiling/ { if (++n % 25 == 0) { print "    ... " n " crates compiled"; fflush() } next }
    /^ *(Downloading|Downloaded|Locking|Adding|Updating) / { next }
    { print; fflush() }'
