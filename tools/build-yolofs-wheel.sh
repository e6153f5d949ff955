#!/usr/bin/env bash
# Build a Python wheel that carries the yolofs binary (maturin's bin bindings), for hosts without
# a Rust toolchain: `pip install yolofs-*.whl` puts `yolofs` in the environment's bin directory.
# Usage: tools/build-yolofs-wheel.sh [OUTPUT_DIR]   (default: yolofs/target/wheels)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$repo/yolofs/target/wheels}")
source "$repo/tools/env.sh"
maturin=$repo/.venv/bin/maturin
[[ -x $maturin ]] || maturin=$(command -v maturin) || {
    echo "build-yolofs-wheel: maturin not found (pip install 'maturin>=1.5,<2')" >&2
    exit 1
}
cd "$repo/yolofs"
echo "==> building the yolofs wheel (a few minutes if yolofs was not built before)" >&2
built=$("$maturin" build --release --out "$out" 2>&1) || { echo "$built" >&2; exit 1; }
grep -v '^\s*Compiling' <<<"$built" >&2
# maturin's last word: "Built wheel to PATH".
sed -n 's/^.*Built wheel to //p' <<<"$built" | tail -n 1
