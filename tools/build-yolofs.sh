#!/usr/bin/env bash
# Build the yolofs binary (release) into yolofs/target/release/yolofs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
[[ -x $HOME/.cargo/bin/cargo ]] && export PATH=$HOME/.cargo/bin:$PATH
cd "$repo/yolofs"
cargo build --release --locked 2>&1 | tail -n 3
