#!/bin/bash
# devstack plugin for YOLO for OpenStack: yolofs and the Nova driver on compute nodes,
# YoloBootFilter and YoloBootTimeWeigher in nova-scheduler, the boot image worker beside
# glance-api. In local.conf:
#
#   [[local|localrc]]
#   enable_plugin yolo <URL or path of this repository> main
#
# (the branch named: devstack's default is master, which this repository does not have)
#
# devstack/settings lists the services and every variable with its default; docs/devstack.md
# says what each phase does.

_XTRACE_YOLO=$(set +o | grep xtrace)
set +o xtrace

# Where each part runs: a service of this plugin, on a node that runs what it serves.
function _yolo_on_compute {
    is_service_enabled yolofs && is_service_enabled n-cpu
}

function _yolo_on_glance {
    is_service_enabled yolo-glance-worker && is_service_enabled g-api
}

function _yolo_on_scheduler {
    [[ "$YOLO_SCHEDULER" == "True" ]] && is_service_enabled n-sch
}

# pre-install: yolofs mounts with fusermount3 and the driver rebases disks with qemu-img; the
# worker's profiling boots also need QEMU itself, and bubblewrap, their sandbox.
function preinstall_yolo {
    local qemu_img="qemu-img" qemu="qemu-kvm"
    if is_ubuntu; then
        qemu_img="qemu-utils"
        qemu="qemu-system-x86"
    fi
    if _yolo_on_glance; then
        install_package fuse3 "$qemu_img" "$qemu" bubblewrap
    elif _yolo_on_compute; then
        install_package fuse3 "$qemu_img"
    fi
}

# install: the yolofs binary where yolofs or the worker (its learning mounts) runs, and the
# Python package everywhere: yolo-configure writes every node's settings.
function install_yolo {
    if _yolo_on_compute || _yolo_on_glance; then
        if [[ -n "$YOLOFS_BIN_SOURCE" ]]; then
            sudo install -m 0755 "$YOLOFS_BIN_SOURCE" "$YOLOFS_BIN"
        elif [[ -n "$YOLOFS_WHEEL" ]]; then
            pip_install "$YOLOFS_WHEEL"
            sudo install -m 0755 "$YOLO_BIN_DIR/yolofs" "$YOLOFS_BIN"
        else
            build_yolofs
        fi
    fi
    # A wheel, not an editable install (setup_develop): Nova loads the driver as nova.virt.yolo
    # through the yolo-openstack-nova-virt.pth the wheel carries (yolo_build.py). The re2
    # extra: the worker's linear-time matcher for the ready patterns images carry.
    pip_install "${YOLO_DIR}[re2]"
}

# The Rust toolchain. yolofs needs Rust >= 1.85, newer than the cargo of Debian 12 and of the
# Ubuntu LTS releases. A recent enough cargo on the host is used as it is; otherwise rustup
# installs the stable toolchain (minimal profile) for the stack user under $YOLO_RUSTUP_HOME
# and $YOLO_CARGO_HOME, touching nothing system-wide and nothing on PATH. A prebuilt binary
# (YOLOFS_BIN_SOURCE) or wheel (YOLOFS_WHEEL) needs no toolchain at all.

# Succeeds if the cargo run by the given command is 1.85 or newer.
function _yolo_cargo_is_recent {
    local version
    version=$("$@" --version 2>/dev/null) || return 1
    [[ "$version" =~ ^cargo\ ([0-9]+)\.([0-9]+) ]] || return 1
    (( BASH_REMATCH[1] > 1 || (BASH_REMATCH[1] == 1 && BASH_REMATCH[2] >= 85) ))
}

# rustup's cargo proxy finds its toolchain through these two variables.
function _yolo_rustup_cargo {
    RUSTUP_HOME=$YOLO_RUSTUP_HOME CARGO_HOME=$YOLO_CARGO_HOME "$YOLO_CARGO_HOME/bin/cargo" "$@"
}

function install_rust_toolchain {
    local installer
    installer=$(mktemp)
    curl --proto '=https' --tlsv1.2 -sSf -o "$installer" "$YOLO_RUSTUP_URL" ||
        die $LINENO "cannot download rustup's installer from $YOLO_RUSTUP_URL"
    RUSTUP_HOME=$YOLO_RUSTUP_HOME CARGO_HOME=$YOLO_CARGO_HOME sh "$installer" -y \
        --no-modify-path --profile minimal --default-toolchain stable ||
        die $LINENO "rustup could not install Rust into $YOLO_CARGO_HOME"
    rm -f "$installer"
    # clean removes a toolchain only if the plugin installed it.
    touch "$YOLO_CARGO_HOME/.installed-by-yolo"
}

function build_yolofs {
    local cargo=cargo
    if ! _yolo_cargo_is_recent cargo; then
        cargo=_yolo_rustup_cargo
        if ! _yolo_cargo_is_recent _yolo_rustup_cargo; then
            install_rust_toolchain
        fi
    fi
    (cd "$YOLO_DIR/yolofs" && "$cargo" build --release --locked)
    sudo install -m 0755 "$YOLO_DIR/yolofs/target/release/yolofs" "$YOLOFS_BIN"
}

# post-config: YOLO's settings, written by yolo-configure (the code the all-in-one cloud runs
# too) into the files devstack wrote. nova-compute reads $NOVA_CPU_CONF, which devstack makes
# from $NOVA_CONF when it starts nova-compute, after this phase.
function configure_yolo {
    local configure=$YOLO_BIN_DIR/yolo-configure
    # stack.sh edits nova.conf in the background meanwhile (configure_neutron_nova, run
    # async): yolo-configure rewrites the file, so one of the two would lose its settings.
    # Waited for here first (stack.sh's own wait for it later then finds it done).
    if is_service_enabled nova && declare -F async_wait >/dev/null; then
        async_wait configure_neutron_nova
    fi
    # First: the worker's signing key, whose public key the compute node gets.
    if _yolo_on_glance; then
        configure_yolo_glance
    fi
    if _yolo_on_compute; then
        local keys=()
        if [[ -r $YOLO_SIGNING_PUBLIC_KEY_FILE ]]; then
            keys=(--boot-image-signing-key-file "$YOLO_SIGNING_PUBLIC_KEY_FILE")
        else
            echo "WARNING: no $YOLO_SIGNING_PUBLIC_KEY_FILE: no first boot before a download here" >&2
        fi
        "$configure" nova-compute --config-file "$NOVA_CONF" \
            --mount-point "$YOLOFS_MOUNTPOINT" --control-socket "$YOLOFS_CONTROL_SOCKET" \
            "${keys[@]}"
    fi
    if _yolo_on_scheduler; then
        "$configure" nova-scheduler --config-file "$NOVA_CONF"
    fi
    if is_service_enabled n-api; then
        # Snapshots must not inherit YOLO's links to boot images.
        "$configure" nova-api --config-file "$NOVA_CONF"
    fi
    if is_service_enabled c-api; then
        # Nor volumes uploaded as images (Glance would refuse a tenant's upload).
        "$configure" cinder-api --config-file "$CINDER_CONF"
    fi
}

function configure_yolo_glance {
    "$YOLO_BIN_DIR/yolo-configure" glance-api --config-file "$GLANCE_API_CONF" \
        --import-config-file "$GLANCE_IMAGE_IMPORT_CONF" \
        --property-protection-file "$GLANCE_CONF_DIR/property-protections.conf"

    # The worker's own service user, in the service project: compute nodes trust the boot
    # images that project publishes. admin: it reads every project's images.
    local password=${YOLO_SERVICE_PASSWORD:-$SERVICE_PASSWORD} user
    user=$(get_or_create_user "$YOLO_SERVICE_USER" "$password" default)
    get_or_add_user_project_role admin "$user" "$SERVICE_PROJECT_NAME" >/dev/null
    get_or_add_user_project_role service "$user" "$SERVICE_PROJECT_NAME" >/dev/null

    sudo install -d -o "$STACK_USER" -m 0755 "$YOLO_CONF_DIR" "$YOLO_WORKER_DIR"
    # The password on standard input: a command line is every local user's to read.
    "$YOLO_BIN_DIR/yolo-configure" worker --config-file "$YOLO_WORKER_CONF" \
        --transport-url "$(get_notification_url)" --auth-url "$KEYSTONE_SERVICE_URI" \
        --region-name "$REGION_NAME" --username "$YOLO_SERVICE_USER" --password-stdin \
        --project-name "$SERVICE_PROJECT_NAME" --work-dir "$YOLO_WORKER_DIR" \
        --yolofs-binary "$YOLOFS_BIN" --signing-key-file "$YOLO_SIGNING_KEY" <<<"$password"
}

# Unmounts yolofs and the worker's learning mounts, also those whose process died (they
# answer ENOTCONN and would block a new mount or a removal).
function _yolo_unmount {
    sudo fusermount3 -uz "$YOLOFS_MOUNTPOINT" 2>/dev/null || true
    local target
    while read -r target; do
        if [[ "$target" == "$YOLO_WORKER_DIR"/* ]]; then
            sudo umount -l "$target" || true
        fi
    done < <(findmnt -rn -o TARGET 2>/dev/null || true)
}

# Started in post-config, before nova-compute. It runs as root (a FUSE mount serving other
# users, locked memory); nova-compute talks to it on the control socket.
function start_yolofs {
    _yolo_unmount
    local group=${YOLOFS_SOCKET_GROUP:-$(id -gn "$STACK_USER")}
    # The keeper starts yolofs again on the same mount if it dies (docs/operations.md).
    run_process yolofs "$YOLOFS_BIN keep -- $YOLOFS_BIN mount --source $YOLOFS_SOURCE --mountpoint $YOLOFS_MOUNTPOINT --boot-images $YOLOFS_BOOT_IMAGES --control-socket $YOLOFS_CONTROL_SOCKET --control-socket-group $group --control-socket-mode 0660 $YOLOFS_OPTIONS" "" root
}

# Started in extra, once glance-api answers. It boots tenants' images, so it runs as the stack
# user, never root (its learning mounts are unprivileged FUSE mounts).
function start_yolo_worker {
    run_process yolo-glance-worker "$YOLO_BIN_DIR/yolo-glance-worker --config-file $YOLO_WORKER_CONF"
}

function stop_yolo {
    # stop_process leaves alone a service that does not run on this node.
    stop_process yolo-glance-worker
    stop_process yolofs
    _yolo_unmount
}

# clean (devstack's clean.sh runs unstack first). Left to devstack's own clean, which runs
# after this: YOLO's settings in nova.conf and the glance-api files (it removes /etc/nova and
# /etc/glance whole, and yolo-configure has no revert), the yolo keystone user (it drops
# keystone's database), devstack's venv with the Python package in it ($DATA_DIR/venv), and
# the devstack@ unit files. The checkout and its yolofs/target stay, as every project's do.
function cleanup_yolo {
    _yolo_unmount
    sudo rm -rf "$YOLOFS_BOOT_IMAGES" "$YOLO_WORKER_DIR" "$YOLO_WORKER_CONF" "$YOLO_CONF_DIR"
    sudo rmdir "$YOLOFS_MOUNTPOINT" 2>/dev/null || true
    # yolofs' runtime directory, which it made for its control socket (if empty: never /run).
    sudo rmdir "$(dirname "$YOLOFS_CONTROL_SOCKET")" 2>/dev/null || true
    sudo rm -f "$YOLOFS_BIN"
    if [[ -e "$YOLO_CARGO_HOME/.installed-by-yolo" ]]; then
        rm -rf "$YOLO_RUSTUP_HOME" "$YOLO_CARGO_HOME"
    fi
    if [[ "$GLOBAL_VENV" != "True" ]]; then
        pip_uninstall yolo-openstack
    fi
}

if is_service_enabled yolofs yolo-glance-worker; then
    case "${1:-}/${2:-}" in
        stack/pre-install)
            echo_summary "Installing YOLO's system packages"
            preinstall_yolo
            ;;
        stack/install)
            echo_summary "Installing YOLO"
            install_yolo
            ;;
        stack/post-config)
            echo_summary "Configuring YOLO"
            configure_yolo
            if _yolo_on_compute; then
                start_yolofs
            fi
            ;;
        stack/extra)
            if _yolo_on_glance; then
                echo_summary "Starting yolo-glance-worker"
                start_yolo_worker
            fi
            ;;
        unstack/*)
            echo_summary "Stopping YOLO"
            stop_yolo
            ;;
        clean/*)
            echo_summary "Cleaning YOLO"
            cleanup_yolo
            ;;
    esac
fi

$_XTRACE_YOLO
