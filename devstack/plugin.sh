#!/bin/bash
# devstack plugin for YOLO for OpenStack.
#
# In local.conf:
#
#   [[local|localrc]]
#   enable_plugin yolo <path or URL of this repository>
#
# Tunables (see devstack/settings): YOLOFS_SOURCE (Nova's image cache, instances/_base),
# YOLOFS_MOUNTPOINT, YOLOFS_BOOT_IMAGES, YOLOFS_CONTROL_SOCKET, YOLOFS_OPTIONS,
# YOLO_NOVA_DRIVER (True: compute_driver = yolo.YoloLibvirtDriver), YOLO_SCHEDULER (True:
# YoloBootFilter and YoloBootTimeWeigher in nova-scheduler), YOLO_GLANCE_WORKER (True: Glance
# notifications on, the yolo container format, the import plugin, yolo-glance-worker running).
#
# Phases: install builds yolofs (Rust >= 1.85 must be installed) into $YOLOFS_BIN and installs
# the Python package (not editable: it ships the nova.virt.yolo driver module); post-config
# writes nova.conf and starts `yolofs mount` as the devstack@yolofs service, before nova-compute
# starts.

XTRACE=$(set +o | grep xtrace)
set -o xtrace

function install_yolo {
    local repo
    repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    install_package fuse3 qemu-utils
    (cd "$repo/yolofs" && cargo build --release --locked)
    sudo install -m 0755 "$repo/yolofs/target/release/yolofs" "$YOLOFS_BIN"
    pip_install "$repo"
}

function configure_yolo {
    sudo mkdir -p "$YOLOFS_SOURCE" "$YOLOFS_MOUNTPOINT" "$YOLOFS_BOOT_IMAGES" "$(dirname "$YOLOFS_CONTROL_SOCKET")"
    if [[ "$YOLO_NOVA_DRIVER" == "True" ]]; then
        iniset $NOVA_CONF DEFAULT compute_driver yolo.YoloLibvirtDriver
        iniset $NOVA_CONF yolo mount_point "$YOLOFS_MOUNTPOINT"
        iniset $NOVA_CONF yolo boot_image_dir "$YOLOFS_BOOT_IMAGES"
        iniset $NOVA_CONF yolo control_socket "$YOLOFS_CONTROL_SOCKET"
        iniset $NOVA_CONF yolo yolofs_binary "$YOLOFS_BIN"
    fi
    if [[ "$YOLO_SCHEDULER" == "True" ]]; then
        # A first available_filters line replaces Nova's default: keep Nova's filters.
        if ! iniget_multiline $NOVA_CONF filter_scheduler available_filters | grep -q all_filters; then
            iniadd $NOVA_CONF filter_scheduler available_filters nova.scheduler.filters.all_filters
        fi
        iniadd $NOVA_CONF filter_scheduler available_filters \
            yolo_nova.scheduler.filters.boot_time_filter.YoloBootFilter
        local enabled
        enabled=$(iniget $NOVA_CONF filter_scheduler enabled_filters)
        iniset $NOVA_CONF filter_scheduler enabled_filters "${enabled:+$enabled,}YoloBootFilter"
        iniset $NOVA_CONF filter_scheduler weight_classes \
            nova.scheduler.weights.all_weighers,yolo_nova.scheduler.weights.boot_time.YoloBootTimeWeigher
    fi
}

function configure_yolo_glance {
    iniset $GLANCE_API_CONF oslo_messaging_notifications driver messagingv2
    iniset $GLANCE_API_CONF image_format container_formats ami,ari,aki,bare,ovf,ova,docker,compressed,yolo
    if [[ -n "$GLANCE_IMAGE_IMPORT_CONF" ]]; then
        iniset $GLANCE_IMAGE_IMPORT_CONF image_import_opts image_import_plugins "['yolo_boot_image']"
    fi
    sudo install -d -o $STACK_USER /etc/yolo "$YOLO_WORKER_DIR"
    local conf=/etc/yolo/yolo-glance-worker.conf
    iniset $conf DEFAULT transport_url $(get_notification_url)
    iniset $conf yolo_worker work_dir "$YOLO_WORKER_DIR"
    iniset $conf yolo_worker yolofs_binary "$YOLOFS_BIN"
    iniset $conf glance auth_type password
    iniset $conf glance auth_url "$KEYSTONE_SERVICE_URI"
    iniset $conf glance username admin
    iniset $conf glance password "$ADMIN_PASSWORD"
    iniset $conf glance user_domain_name Default
    iniset $conf glance project_name admin
    iniset $conf glance project_domain_name Default
}

function start_yolo {
    # yolofs mounts a FUSE filesystem and locks memory: it runs as root.
    run_process yolofs "$YOLOFS_BIN mount --source $YOLOFS_SOURCE --mountpoint $YOLOFS_MOUNTPOINT --boot-images $YOLOFS_BOOT_IMAGES --control-socket $YOLOFS_CONTROL_SOCKET $YOLOFS_OPTIONS" "" root
}

function stop_yolo {
    stop_process yolofs
    stop_process yolo-glance-worker
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
        echo_summary "Configuring and starting yolofs"
        configure_yolo
        start_yolo
        if [[ "$YOLO_GLANCE_WORKER" == "True" ]]; then
            configure_yolo_glance
        fi
    elif [[ "$1" == "stack" && "$2" == "extra" && "$YOLO_GLANCE_WORKER" == "True" ]]; then
        # Profiling boots mount yolofs: the worker runs as root.
        run_process yolo-glance-worker "$(which yolo-glance-worker) --config-file /etc/yolo/yolo-glance-worker.conf" "" root
    fi
    if [[ "$1" == "unstack" ]]; then
        stop_yolo
    fi
    if [[ "$1" == "clean" ]]; then
        cleanup_yolo
    fi
fi

$XTRACE
