# Sourced by the tools/ scripts: where rustup's cargo lives, even when the caller's PATH lacks it.
for cargo_bin in "${CARGO_HOME:-${HOME:-/root}/.cargo}/bin" /root/.cargo/bin; do
    if [[ -x $cargo_bin/cargo ]]; then
        export PATH=$cargo_bin:$PATH
        break
    fi
done
