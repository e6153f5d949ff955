#!/usr/bin/env bash
# Build the yolofs binary (release) into yolofs/target/release/yolofs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/tools/env.sh"
cd "$repo/yolofs"
cargo build --release --locked 2>&1 | tail -n 3
