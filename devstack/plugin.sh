#!/bin/bash
# devstack plugin for YOLO for OpenStack.
#
# In local.conf:
#
#   [[local|localrc]]
#   enable_plugin yolo <path or URL of this repository>
#
# Tunables (see devstack/settings): YOLOFS_SOURCE (Nova's image cache, instances/_base),
# YOLOFS_MOUNTPOINT, YOLOFS_BOOT_IMAGES, YOLOFS_CONTROL_SOCKET, YOLOFS_OPTIONS.
#
# Phases: install builds yolofs (Rust >= 1.85 must be installed) into $YOLOFS_BIN; start runs
# `yolofs mount` as the devstack@yolofs service on compute nodes.

XTRACE=$(set +o | grep xtrace)
set -o xtrace

function install_yolo {
    local repo
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    install_package fuse3 qemu-utils
    (cd "$repo/yolofs" && cargo build --release --locked)
    sudo install -m 0755 "$repo/yolofs/target/release/yolofs" "$YOLOFS_BIN"
}

function configure_yolo {
    sudo mkdir -p "$YOLOFS_SOURCE" "$YOLOFS_MOUNTPOINT" "$YOLOFS_BOOT_IMAGES" "$(dirname "$YOLOFS_CONTROL_SOCKET")"
}

function start_yolo {
    # yolofs mounts a FUSE filesystem and locks memory: it runs as root.
    run_process yolofs "$YOLOFS_BIN mount --source $YOLOFS_SOURCE --mountpoint $YOLOFS_MOUNTPOINT --boot-images $YOLOFS_BOOT_IMAGES --control-socket $YOLOFS_CONTROL_SOCKET $YOLOFS_OPTIONS" "" root
}

function stop_yolo {
    stop_process yolofs
}

function cleanup_yolo {
    sudo fusermount3 -uz "$YOLOFS_MOUNTPOINT" 2>/dev/null || true
    sudo rm -rf "$YOLOFS_BOOT_IMAGES"
}

if is_service_enabled yolofs; then
    if [[ "$1" == "stack" && "$2" == "install" ]]; then
        echo_summary "Installing yolofs"
        install_yolo
    elif [[ "$1" == "stack" && "$2" == "post-config" ]]; then
        echo_summary "Configuring yolofs"
        configure_yolo
    elif [[ "$1" == "stack" && "$2" == "extra" ]]; then
        echo_summary "Starting yolofs"
        start_yolo
    fi
    if [[ "$1" == "unstack" ]]; then
        stop_yolo
    fi
    if [[ "$1" == "clean" ]]; then
        cleanup_yolo
    fi
fi

$XTRACE
