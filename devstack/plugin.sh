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
    # yolofs' directories; Nova's own (_base) are Nova's to create, as its user.
    sudo install -d -m 0755 "$YOLOFS_MOUNTPOINT" "$YOLOFS_BOOT_IMAGES"
    # The settings themselves come from yolo-configure, which the all-in-one cloud (tools/aio)
    # also uses: one place knows how YOLO is wired into Nova and Glance.
    if [[ "$YOLO_NOVA_DRIVER" == "True" ]]; then
        yolo-configure nova-compute --config-file "$NOVA_CONF" \
            --mount-point "$YOLOFS_MOUNTPOINT" --control-socket "$YOLOFS_CONTROL_SOCKET"
    fi
    if [[ "$YOLO_SCHEDULER" == "True" ]]; then
        yolo-configure nova-scheduler --config-file "$NOVA_CONF"
    fi
    if is_service_enabled n-api; then
        yolo-configure nova-api --config-file "$NOVA_CONF"
    fi
}

function configure_yolo_glance {
    local import_conf=()
    if [[ -n "$GLANCE_IMAGE_IMPORT_CONF" ]]; then
        import_conf=(--import-config-file "$GLANCE_IMAGE_IMPORT_CONF")
    fi
    yolo-configure glance-api --config-file "$GLANCE_API_CONF" "${import_conf[@]}" \
        --property-protection-file "$GLANCE_CONF_DIR/property-protections.conf"
    sudo install -d -o "$STACK_USER" /etc/yolo "$YOLO_WORKER_DIR"
    # The worker's own service user, in the service project: compute nodes trust the boot
    # images that project publishes (they fetch them as Nova's service user, its member).
    local user
    user=$(get_or_create_user yolo "$SERVICE_PASSWORD" default)
    get_or_add_user_project_role admin "$user" "$SERVICE_PROJECT_NAME"
    get_or_add_user_project_role service "$user" "$SERVICE_PROJECT_NAME"
    yolo-configure worker --config-file /etc/yolo/yolo-glance-worker.conf \
        --transport-url "$(get_notification_url)" --auth-url "$KEYSTONE_SERVICE_URI" \
        --username yolo --password "$SERVICE_PASSWORD" --project-name "$SERVICE_PROJECT_NAME" \
        --work-dir "$YOLO_WORKER_DIR" --yolofs-binary "$YOLOFS_BIN"
}

function start_yolo {
    # yolofs mounts a FUSE filesystem and locks memory: it runs as root.
    # nova-compute (the stack user's group) uses its control socket.
    run_process yolofs "$YOLOFS_BIN mount --source $YOLOFS_SOURCE --mountpoint $YOLOFS_MOUNTPOINT --boot-images $YOLOFS_BOOT_IMAGES --control-socket $YOLOFS_CONTROL_SOCKET --control-socket-group $(id -gn "$STACK_USER") $YOLOFS_OPTIONS" "" root
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
        # The worker runs tenants' images: as the stack user, never root (its profiling boots'
        # yolofs mounts are unprivileged FUSE mounts, readable by their owner alone).
        run_process yolo-glance-worker "$(which yolo-glance-worker) --config-file /etc/yolo/yolo-glance-worker.conf"
    fi
    if [[ "$1" == "unstack" ]]; then
        stop_yolo
    fi
    if [[ "$1" == "clean" ]]; then
        cleanup_yolo
    fi
fi

$XTRACE
