# shellcheck shell=bash
# Functions of the all-in-one cloud (sourced by tools/aio/aio after settings).

progress() { printf '==> aio: %s\n' "$*"; }
die() { printf 'aio: %s\n' "$*" >&2; exit 1; }

# --- processes -----------------------------------------------------------------------------
# Daemons are started with start-stop-daemon: a pid file in $AIO_RUN_DIR, output appended to
# $AIO_LOG_DIR/<name>.log, the user's supplementary groups set (libvirt for nova), and a clean
# environment.

service_running() {
    pid_alive "$AIO_RUN_DIR/$1.pid"
}

start_service() {  # NAME USER COMMAND [ARG...]
    local name=$1 user=$2 home
    shift 2
    if service_running "$name"; then
        return 0
    fi
    # A stale pid file's pid may be another process's now: start-stop-daemon would not start.
    rm -f "$AIO_RUN_DIR/$name.pid"
    home=$(getent passwd "$user" | cut -d: -f6)
    install -d -m 0755 "$AIO_RUN_DIR" "$AIO_LOG_DIR"
    install -m 0640 -o "$user" -g adm /dev/null "$AIO_LOG_DIR/$name.log.new"
    [[ -e $AIO_LOG_DIR/$name.log ]] || mv "$AIO_LOG_DIR/$name.log.new" "$AIO_LOG_DIR/$name.log"
    rm -f "$AIO_LOG_DIR/$name.log.new"
    start-stop-daemon --start --quiet --background --make-pidfile \
        --pidfile "$AIO_RUN_DIR/$name.pid" --chuid "$user" --chdir "$home" \
        --output "$AIO_LOG_DIR/$name.log" \
        --startas /usr/bin/env -- -i HOME="$home" LANG=C.UTF-8 \
        PATH="$AIO_VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        OS_NOVA_DISABLE_EVENTLET_PATCHING=1 "$@"
}

stop_service() {  # NAME [SECONDS to stop before SIGKILL]
    local pidfile=$AIO_RUN_DIR/$1.pid group
    if ! service_running "$1"; then
        rm -f "$pidfile"
        return 0
    fi
    # start-stop-daemon made each service a session of its own (whose leader, the first of its
    # two forks, is gone: the service is not the group's leader): what the service started (the
    # worker's profiling QEMU, say) goes with it.
    group=$(ps -o pgid= -p "$(cat "$pidfile")" 2>/dev/null | tr -d ' ') || true
    start-stop-daemon --stop --quiet --pidfile "$pidfile" --retry "TERM/${2:-10}/KILL/5" \
        --remove-pidfile >/dev/null || true
    if [[ -n $group ]]; then
        kill -KILL -- "-$group" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

wait_for() {  # DESCRIPTION TIMEOUT COMMAND...
    local what=$1 timeout=$2 deadline
    shift 2
    deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$what did not come up within ${timeout} s (logs: $AIO_LOG_DIR)"
        sleep 1
    done
}

http_up() { curl -s -o /dev/null --max-time 5 "$1"; }

start_wsgi() {  # NAME USER PORT MODULE:APP [ADDRESS...]: also listening on each ADDRESS:PORT
    local name=$1 user=$2 port=$3 app=$4 address binds=(--bind "$AIO_HOST:$3")
    shift 4
    for address; do binds+=(--bind "$address:$port"); done
    start_service "$name" "$user" "$AIO_VENV/bin/gunicorn" --config "$AIO_HOME/gunicorn.conf.py" \
        "${binds[@]}" --name "$name" "$app"
    wait_for "$name" 120 http_up "http://$AIO_HOST:$port/"
}

# --- packages, users, venv -----------------------------------------------------------------

install_packages() {
    local packages=(
        mariadb-server rabbitmq-server memcached sudo curl kmod
        python3-venv python3-dev build-essential pkg-config libvirt-dev
        libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients
        qemu-system-x86 qemu-utils fuse3 bubblewrap "${CEPH_PACKAGES[@]}"
        fio     # the benchmarks' and the scheduling test's I/O stressors
    ) missing=() pkg
    for pkg in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        progress "installing Debian packages: ${missing[*]}"
        apt-get update -q
        # Debian's packages start their daemons where an init system does; here we do.
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}" >/dev/null
    fi
    [[ -e /dev/fuse ]] || modprobe fuse
    # What udev's rule does where udev runs: the worker mounts its learning yolofs unprivileged.
    chmod 0666 /dev/fuse
    open_kvm_to_its_group
}

open_kvm_to_its_group() {
    # udev's rule (root:kvm 0660) where udev does not run. Guests run under TCG all the same
    # (virt_type = qemu), but libvirt probes QEMU as root, with KVM, and throws its capabilities
    # away whenever its QEMU user cannot use KVM: without this, every spawn waited about a
    # minute for Nova's capability queries to re-probe QEMU.
    if [[ -c /dev/kvm ]]; then
        chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
    fi
}

service_home() {  # USER
    # The worker's home is its scratch space, inside root's /var/lib/yolo, which also holds
    # yolofs' boot image store: the user that runs tenants' images must not own the store's
    # parent (it could swap the store for one of its own).
    if [[ $1 == yolo ]]; then echo "$YOLO_WORKER_DIR"; else echo "/var/lib/$1"; fi
}

create_users() {
    local user home
    install -d -o root -g root -m 0755 "$(dirname "$YOLOFS_BOOT_IMAGES")" \
        "$(dirname "$YOLO_WORKER_DIR")"
    for user in keystone glance placement nova neutron barbican cinder yolo; do
        home=$(service_home "$user")
        if ! getent passwd "$user" >/dev/null; then
            useradd --system --user-group --home-dir "$home" --no-create-home \
                --shell /usr/sbin/nologin "$user"
        fi
        usermod -d "$home" "$user" >/dev/null 2>&1 || true
        # Also after a clean, which removes the state in them.
        install -d -o "$user" -g "$user" -m 0750 "$home"
    done
    chmod 0755 /var/lib/nova      # libvirt's QEMU user reaches the instances below it
    # nova-compute talks to libvirtd.
    usermod -a -G libvirt,kvm nova
}

install_venv() {
    if [[ ! -x $AIO_VENV/bin/python ]]; then
        install -d -m 0755 "$AIO_HOME"
        "$AIO_PYTHON" -m venv "$AIO_VENV"
        "$AIO_VENV/bin/pip" install -q --upgrade pip
    fi
    progress "installing OpenStack from PyPI into $AIO_VENV (about a minute the first time)"
    # shellcheck disable=SC2086 # the list is word-split on purpose
    "$AIO_VENV/bin/pip" install -q $AIO_OPENSTACK_PACKAGES
    install -m 0644 "$AIO_REPO/tools/aio/gunicorn.conf.py" "$AIO_HOME/gunicorn.conf.py"
    progress "installing YOLO into $AIO_VENV"
    # Not editable: an operator's install, and the wheel carries the nova.virt.yolo module.
    "$AIO_VENV/bin/pip" install -q "${AIO_REPO}[re2]"
}

install_yolofs() {
    progress "building yolofs"
    "$AIO_REPO/tools/build-yolofs.sh" >/dev/null
    install -m 0755 "$AIO_REPO/yolofs/target/release/yolofs" "$AIO_YOLOFS_BIN"
}

# --- secrets -------------------------------------------------------------------------------

secret() {  # NAME: a random password made once and kept in $AIO_SECRETS
    local file=$AIO_SECRETS/$1
    if [[ ! -s $file ]]; then
        install -d -m 0700 "$AIO_SECRETS"
        (umask 077; "$AIO_PYTHON" -c 'import secrets; print(secrets.token_hex(16))' >"$file")
    fi
    cat "$file"
}

load_secrets() {
    ADMIN_PASSWORD=$(secret admin)
}

db_url() { echo "mysql+pymysql://$1:$(secret "db-$1")@$AIO_HOST/$2?charset=utf8"; }
rabbit_url() { echo "rabbit://$1:$(secret "rabbit-$1")@$AIO_HOST:5672/"; }

# --- infrastructure ------------------------------------------------------------------------

start_infrastructure() {
    progress "starting MariaDB, RabbitMQ, memcached, libvirtd"
    service mariadb status >/dev/null 2>&1 || service mariadb start >/dev/null
    service memcached status >/dev/null 2>&1 || service memcached start >/dev/null
    service rabbitmq-server status >/dev/null 2>&1 || service rabbitmq-server start >/dev/null
    wait_for "RabbitMQ" 120 rabbitmqctl -q status
    configure_libvirtd
    # By their pid files: a second host's daemons may run too (add-compute).
    pid_alive /run/virtlogd.pid || virtlogd -d
    pid_alive /run/libvirtd.pid || libvirtd -d
    wait_for "libvirtd" 30 virsh -c qemu:///system version
}

pid_alive() {  # PIDFILE: the process it names runs
    # Not a process given the same pid since: a machine whose processes stopped keeps its pid
    # files, and a new process of the next boot may have the old pid (one took virtlogd's, which
    # then was not started: every guest failed to start). A pid file is written when its process
    # starts, or after it.
    local pid elapsed
    [[ -s $1 ]] || return 1
    pid=$(cat "$1")
    elapsed=$(ps -o etimes= -p "$pid" 2>/dev/null) || return 1
    (($(date +%s) - elapsed <= $(stat -c %Y "$1") + 2))
}

stop_infrastructure() {
    progress "stopping MariaDB, RabbitMQ, memcached"
    service rabbitmq-server stop >/dev/null 2>&1 || true
    service memcached stop >/dev/null 2>&1 || true
    service mariadb stop >/dev/null 2>&1 || true
}

configure_libvirtd() {
    # The libvirt group's members (nova) may use the system daemon, as Debian's packaging intends.
    local conf=/etc/libvirt/libvirtd.conf key value changed=0
    for key in unix_sock_group unix_sock_rw_perms auth_unix_rw; do
        case $key in
            unix_sock_group) value='"libvirt"' ;;
            unix_sock_rw_perms) value='"0770"' ;;
            auth_unix_rw) value='"none"' ;;
        esac
        if ! grep -qx "$key = $value" "$conf"; then
            sed -i "/^#\?$key = /d" "$conf"
            echo "$key = $value" >>"$conf"
            changed=1
        fi
    done
    # The boot benchmark's way into one I/O throttle for Nova's guests (libvirtd reads its hooks
    # when it starts).
    if ! cmp -s "$AIO_REPO/tools/aio/libvirt-qemu-hook" /etc/libvirt/hooks/qemu; then
        install -D -m 0755 "$AIO_REPO/tools/aio/libvirt-qemu-hook" /etc/libvirt/hooks/qemu
        changed=1
    fi
    if ((changed)); then stop_daemon libvirtd /run/libvirtd.pid; fi
}

stop_daemon() {  # NAME PIDFILE: a daemon that went to the background itself (-d), if it runs
    local pid
    pid_alive "$2" || return 0
    pid=$(cat "$2")
    kill "$pid"
    wait_for "$1 to stop" 30 bash -c "! kill -0 $pid 2>/dev/null"
}

create_database() {  # USER DATABASE...
    local user=$1 password db
    password=$(secret "db-$user")
    shift
    for db in "$@"; do
        mysql -e "CREATE DATABASE IF NOT EXISTS $db CHARACTER SET utf8mb4"
        mysql -e "GRANT ALL PRIVILEGES ON $db.* TO '$user'@'localhost' IDENTIFIED BY '$password';
                  GRANT ALL PRIVILEGES ON $db.* TO '$user'@'%' IDENTIFIED BY '$password'"
    done
}

create_rabbit_user() {  # USER
    local password
    password=$(secret "rabbit-$1")
    if rabbitmqctl -q list_users | awk '{print $1}' | grep -qx "$1"; then
        rabbitmqctl -q change_password "$1" "$password" >/dev/null
    else
        rabbitmqctl -q add_user "$1" "$password" >/dev/null
    fi
    rabbitmqctl -q set_permissions "$1" '.*' '.*' '.*' >/dev/null
}

# --- configuration -------------------------------------------------------------------------

config_file() {  # PATH OWNER-GROUP: content from stdin, readable by root and the service
    install -d -m 0755 "$(dirname "$1")"
    install -m 0640 -o root -g "$2" /dev/stdin "$1"
}

authtoken_section() {  # SERVICE-USER
    cat <<EOF
[keystone_authtoken]
www_authenticate_uri = http://$AIO_HOST:$KEYSTONE_PORT
auth_url = http://$AIO_HOST:$KEYSTONE_PORT
memcached_servers = $AIO_HOST:11211
auth_type = password
username = $1
password = $(secret "keystone-$1")
user_domain_name = Default
project_name = service
project_domain_name = Default
service_token_roles_required = true
EOF
}

service_auth_section() {  # SECTION SERVICE-USER
    cat <<EOF
[$1]
auth_type = password
auth_url = http://$AIO_HOST:$KEYSTONE_PORT
username = $2
password = $(secret "keystone-$2")
user_domain_name = Default
project_name = service
project_domain_name = Default
region_name = $AIO_REGION
EOF
}

as_user() {  # USER COMMAND...: a one-off command of a service, as its user
    local user=$1
    shift
    runuser -u "$user" -- env -i HOME="$(service_home "$user")" LANG=C.UTF-8 \
        PATH="$AIO_VENV/bin:/usr/sbin:/usr/bin:/sbin:/bin" OS_NOVA_DISABLE_EVENTLET_PATCHING=1 "$@"
}

# --- keystone ------------------------------------------------------------------------------

setup_keystone() {
    progress "keystone"
    create_database keystone keystone
    config_file /etc/keystone/keystone.conf keystone <<EOF
[DEFAULT]
use_stderr = true
[database]
connection = $(db_url keystone keystone)
[token]
provider = fernet
[cache]
enabled = true
backend = dogpile.cache.pymemcache
memcache_servers = $AIO_HOST:11211
EOF
    as_user keystone keystone-manage db_sync
    if [[ ! -d /etc/keystone/fernet-keys ]]; then
        "$AIO_VENV/bin/keystone-manage" fernet_setup --keystone-user keystone \
            --keystone-group keystone
        "$AIO_VENV/bin/keystone-manage" credential_setup --keystone-user keystone \
            --keystone-group keystone
    fi
    as_user keystone keystone-manage bootstrap --bootstrap-password "$ADMIN_PASSWORD" \
        --bootstrap-admin-url "http://$AIO_HOST:$KEYSTONE_PORT/v3/" \
        --bootstrap-internal-url "http://$AIO_HOST:$KEYSTONE_PORT/v3/" \
        --bootstrap-public-url "http://$AIO_HOST:$KEYSTONE_PORT/v3/" \
        --bootstrap-region-id "$AIO_REGION" >/dev/null
    start_wsgi keystone keystone "$KEYSTONE_PORT" keystone.wsgi.api:application
    local user
    for user in glance placement nova neutron barbican cinder yolo; do
        secret "keystone-$user" >/dev/null
    done
    secret demo >/dev/null
    secret alt >/dev/null
    # Projects, users, roles, services and endpoints (idempotent).
    AIO_SECRETS=$AIO_SECRETS AIO_HOST=$AIO_HOST AIO_REGION=$AIO_REGION \
        "$AIO_VENV/bin/python" "$AIO_REPO/tools/aio/identity.py"
}

# --- placement -----------------------------------------------------------------------------

setup_placement() {
    progress "placement"
    create_database placement placement
    config_file /etc/placement/placement.conf placement <<EOF
[placement_database]
connection = $(db_url placement placement)
[api]
auth_strategy = keystone
$(authtoken_section placement)
EOF
    as_user placement placement-manage db sync
    start_wsgi placement-api placement "$PLACEMENT_PORT" placement.wsgi.api:application
}

# --- glance --------------------------------------------------------------------------------

setup_glance() {
    progress "glance"
    create_database glance glance
    create_rabbit_user glance
    install -d -o glance -g glance -m 0750 "$GLANCE_STATE/images" "$GLANCE_STATE/staging" \
        "$GLANCE_STATE/tasks" "$GLANCE_STATE/locks"
    config_file /etc/glance/glance-api.conf glance <<EOF
[DEFAULT]
enabled_backends = fs:file, ceph:rbd
transport_url = $(rabbit_url glance)
[database]
connection = $(db_url glance glance)
[glance_store]
default_backend = fs
[fs]
filesystem_store_datadir = $GLANCE_STATE/images
[ceph]
rbd_store_pool = $CEPH_POOL
rbd_store_user = glance
rbd_store_ceph_conf = $CEPH_CONF
[os_glance_staging_store]
filesystem_store_datadir = $GLANCE_STATE/staging
[os_glance_tasks_store]
filesystem_store_datadir = $GLANCE_STATE/tasks
[paste_deploy]
flavor = keystone
[oslo_concurrency]
lock_path = $GLANCE_STATE/locks
# No Ceilometer here: the default topic (notifications) would fill a queue nobody reads;
# yolo-configure adds the worker's.
[oslo_messaging_notifications]
topics =
$(authtoken_section glance)
$(key_manager_section)
EOF
    config_file /etc/glance/glance-image-import.conf glance </dev/null
    install -m 0644 "$AIO_VENV/etc/glance/glance-api-paste.ini" /etc/glance/glance-api-paste.ini
    "$AIO_VENV/bin/yolo-configure" glance-api --config-file /etc/glance/glance-api.conf \
        --import-config-file /etc/glance/glance-image-import.conf \
        --property-protection-file /etc/glance/property-protections.conf
    as_user glance glance-manage db_sync >/dev/null
    start_wsgi glance-api glance "$GLANCE_PORT" glance.wsgi.api:application "$AIO_GLANCE_SECOND_ADDRESS"
}

# --- neutron -------------------------------------------------------------------------------

setup_neutron() {
    progress "neutron"
    create_database neutron neutron
    create_rabbit_user neutron
    install -d -o neutron -g neutron -m 0750 /var/lib/neutron/locks
    config_file /etc/neutron/neutron.conf neutron <<EOF
[DEFAULT]
core_plugin = ml2
# get_ports() loads port forwardings, whose model only the port forwarding plugin imports.
service_plugins = router,port_forwarding
auth_strategy = keystone
transport_url = $(rabbit_url neutron)
api_workers = 1
rpc_workers = 0
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false
[database]
connection = $(db_url neutron neutron)
[oslo_concurrency]
lock_path = /var/lib/neutron/locks
$(authtoken_section neutron)
EOF
    config_file /etc/neutron/plugins/ml2/ml2_conf.ini neutron <<EOF
[ml2]
type_drivers = flat
tenant_network_types =
mechanism_drivers =
extension_drivers =
EOF
    install -m 0644 "$AIO_VENV/etc/neutron/api-paste.ini" /etc/neutron/api-paste.ini
    as_user neutron neutron-db-manage --config-file /etc/neutron/neutron.conf \
        --config-file /etc/neutron/plugins/ml2/ml2_conf.ini upgrade heads >/dev/null
    # neutron.wsgi.api reads /etc/neutron/neutron.conf and plugins/ml2/ml2_conf.ini.
    start_wsgi neutron-api neutron "$NEUTRON_PORT" neutron.wsgi.api:application
}

# --- nova ----------------------------------------------------------------------------------

setup_nova() {
    progress "nova"
    create_database nova nova_api nova nova_cell0
    create_rabbit_user nova
    install -d -o nova -g nova -m 0755 "$NOVA_STATE" "$NOVA_INSTANCES"
    echo "$AIO_COMPUTE_DISK" >"$NOVA_STATE/compute-disk"    # checked: check_compute_disk
    if [[ $AIO_COMPUTE_DISK != machine ]]; then
        own_disk "$NOVA_INSTANCES" "$NOVA_STATE/memory" "$AIO_COMPUTE_HOST" /run/libvirt
    fi
    install -d -o nova -g nova -m 0755 "$NOVA_INSTANCES" "$YOLOFS_SOURCE"
    install -d -o nova -g nova -m 0750 "$NOVA_STATE/tmp"
    config_file /etc/nova/nova.conf nova <<EOF
[DEFAULT]
host = $AIO_COMPUTE_HOST
my_ip = $AIO_HOST
state_path = $NOVA_STATE
instances_path = $NOVA_INSTANCES
transport_url = $(rabbit_url nova)
rootwrap_config = /etc/nova/rootwrap.conf
compute_driver = libvirt.LibvirtDriver
allow_resize_to_same_host = true
# Hosts report their load and what they hold every 20 s, not 60: the tests and benchmarks that
# wait for a report after a change wait a third as long.
update_resources_interval = 20
[api]
auth_strategy = keystone
[wsgi]
api_paste_config = /etc/nova/api-paste.ini
[api_database]
connection = $(db_url nova nova_api)
[database]
connection = $(db_url nova nova)
[conductor]
workers = 1
[scheduler]
workers = 1
discover_hosts_in_cells_interval = 60
[libvirt]
virt_type = qemu
# QEMU's default CPU model for TCG guests, as the QEMU-level benchmarks and yolo-calibrate boot
# them (Nova would pick a model from libvirt's host capabilities, which it caches on disk: a
# guest on an Intel machine was given an EPYC with 5-level paging).
cpu_mode = none
connection_uri = qemu:///system
[vnc]
enabled = false
[oslo_concurrency]
lock_path = $NOVA_STATE/tmp
[oslo_messaging_notifications]
driver = noop
$(authtoken_section nova)
$(service_auth_section service_user nova)
send_service_user_token = true
$(service_auth_section placement nova)
$(service_auth_section neutron nova)
[glance]
region_name = $AIO_REGION
$(key_manager_section)
[yolo]
# The test image prints no login prompt: its ready line times each boot (docs/scheduling.md).
boot_ready_pattern = YOLO-GUEST-READY
# Nova's own download on the first host, the first boot before the download on the second
# (docs/first-boot.md; tests/e2e/test_first_boot.py): both paths are tested.
first_boot_before_download = false
# Hosts look for a newer version of an installed boot image (a fleet merge) every 20 s, not
# every 10 minutes: bench/aio/fleet-learning.
boot_image_version_check_interval = 20
$(hdd_capacity)
EOF
    install -m 0644 "$AIO_VENV/etc/nova/api-paste.ini" /etc/nova/api-paste.ini
    install_rootwrap nova
    "$AIO_VENV/bin/yolo-configure" nova-compute --config-file /etc/nova/nova.conf \
        --mount-point "$YOLOFS_MOUNTPOINT" --control-socket "$YOLOFS_CONTROL_SOCKET" \
        --boot-image-signing-key-file "$YOLO_SIGNING_KEY.pub"
    "$AIO_VENV/bin/yolo-configure" nova-scheduler --config-file /etc/nova/nova.conf
    "$AIO_VENV/bin/yolo-configure" nova-api --config-file /etc/nova/nova.conf

    as_user nova nova-manage api_db sync
    as_user nova nova-manage cell_v2 map_cell0 >/dev/null
    as_user nova nova-manage cell_v2 list_cells | grep -q ' cell1 ' ||
        as_user nova nova-manage cell_v2 create_cell --name cell1 >/dev/null
    as_user nova nova-manage db sync
    start_wsgi nova-api nova "$NOVA_API_PORT" nova.wsgi.osapi_compute:application
    start_service nova-conductor nova "$AIO_VENV/bin/nova-conductor" --config-file /etc/nova/nova.conf
    # The scheduler logs its decisions, YoloBootFilter's predictions per host among them.
    [[ -e /etc/nova/nova-scheduler.conf ]] || config_file /etc/nova/nova-scheduler.conf nova <<EOF
[DEFAULT]
debug = true
EOF
    start_scheduler
    start_yolofs
    start_service nova-compute nova "$AIO_VENV/bin/nova-compute" --config-file /etc/nova/nova.conf
    wait_for "nova-compute in placement" 180 compute_registered "$(virsh -c qemu:///system hostname)"
    as_user nova nova-manage cell_v2 discover_hosts >/dev/null
}

start_scheduler() {
    start_service nova-scheduler nova "$AIO_VENV/bin/nova-scheduler" --config-file /etc/nova/nova.conf \
        --config-file /etc/nova/nova-scheduler.conf
}

install_rootwrap() {  # SERVICE: its daemon reaches root through sudo and its rootwrap
    # As in production: rootwrap also starts privsep-helper, found in the venv's bin.
    local service=$1
    install -d -m 0755 "/etc/$service/rootwrap.d"
    install -m 0644 "$AIO_VENV/etc/$service"/rootwrap.d/*.filters "/etc/$service/rootwrap.d/"
    sed -e "s|^filters_path=.*|filters_path=/etc/$service/rootwrap.d|" \
        -e "s|^exec_dirs=.*|exec_dirs=$AIO_VENV/bin,/sbin,/usr/sbin,/bin,/usr/bin,/usr/local/sbin,/usr/local/bin|" \
        "$AIO_VENV/etc/$service/rootwrap.conf" | install -m 0644 /dev/stdin "/etc/$service/rootwrap.conf"
    install -m 0440 /dev/stdin "/etc/sudoers.d/yolo-aio-$service" <<EOF
Defaults:$service !requiretty
Defaults:$service secure_path="$AIO_VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
$service ALL = (root) NOPASSWD: $AIO_VENV/bin/$service-rootwrap /etc/$service/rootwrap.conf *
EOF
    visudo -c -q -f "/etc/sudoers.d/yolo-aio-$service"
}

compute_registered() {  # NODE
    # The compute node's resource provider (named after the node: libvirt's host name) with its
    # inventory: what the scheduler asks placement for.
    local provider
    provider=$(admin_openstack resource provider list --name "$1" -f value -c uuid) || return 1
    [[ -n $provider ]] &&
        admin_openstack resource provider inventory list "$provider" -f value -c resource_class |
        grep -qx VCPU
}

admin_openstack() {
    OS_CLOUD=aio-admin OS_CLIENT_CONFIG_FILE=$AIO_HOME/clouds.yaml "$AIO_VENV/bin/openstack" "$@"
}

# --- yolofs and the worker -----------------------------------------------------------------

start_yolofs() {
    start_yolofs_service yolofs "$YOLOFS_SOURCE" "$YOLOFS_MOUNTPOINT" "$YOLOFS_BOOT_IMAGES" \
        "$YOLOFS_CONTROL_SOCKET" "$YOLOFS_OPTIONS" "$(hdd_cgroup "$AIO_COMPUTE_HOST")"
}

stop_yolofs() {
    stop_yolofs_service yolofs "$YOLOFS_MOUNTPOINT"
}

start_yolofs_service() {  # NAME SOURCE MOUNTPOINT BOOT-IMAGES CONTROL-SOCKET OPTIONS [CGROUP]
    # yolofs mounts a FUSE filesystem and locks memory: it runs as root. nova-compute (group
    # nova) uses its control socket.
    local join=()
    if ! service_running "$1"; then
        # A mount left by a yolofs that was killed answers ENOTCONN: detach it first.
        fusermount3 -uz "$3" 2>/dev/null || true
        install -d -m 0755 "$3"
    fi
    if [[ -n ${7:-} ]]; then
        # Into its host's emulated HDD throttle before it starts (a yolofs the keeper starts
        # again is its child: it stays in).
        # shellcheck disable=SC2016 # expanded by that shell
        join=(/bin/sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$7")
    fi
    # Benchmarks run yolofs as on a kernel without multigrain timestamps
    # (docs/evaluation/benchmarks.md).
    if [[ -n ${YOLOFS_ASSUME_COARSE_TIMESTAMPS:-} ]]; then
        join=(/usr/bin/env YOLOFS_ASSUME_COARSE_TIMESTAMPS=1 "${join[@]}")
    fi
    # shellcheck disable=SC2086 # the options are word-split on purpose
    # The keeper starts yolofs again on the same mount if it dies (docs/operations.md).
    start_service "$1" root "${join[@]}" "$AIO_YOLOFS_BIN" keep -- "$AIO_YOLOFS_BIN" mount --source "$2" \
        --mountpoint "$3" --boot-images "$4" --control-socket "$5" --control-socket-group nova \
        --control-socket-mode 0660 $6
    wait_for "$1" 30 "$AIO_YOLOFS_BIN" ctl --socket "$5" status
}

stop_yolofs_service() {  # NAME MOUNTPOINT
    # yolofs may finish a learning window first (--record-idle-secs 30).
    stop_service "$1" 45
    # Also a mount whose yolofs died (ENOTCONN, which mountpoint(1) does not see as a mount).
    fusermount3 -uz "$2" 2>/dev/null || true
}

setup_yolo_worker() {
    progress "yolo-glance-worker"
    create_rabbit_user yolo
    [[ -e /etc/yolo/yolo-glance-worker.conf ]] || config_file /etc/yolo/yolo-glance-worker.conf yolo </dev/null
    "$AIO_VENV/bin/yolo-configure" worker --config-file /etc/yolo/yolo-glance-worker.conf \
        --transport-url "$(rabbit_url yolo)" --auth-url "http://$AIO_HOST:$KEYSTONE_PORT" \
        --username yolo --password-stdin --region-name "$AIO_REGION" \
        --work-dir "$YOLO_WORKER_DIR" --yolofs-binary "$AIO_YOLOFS_BIN" \
        --signing-key-file "$YOLO_SIGNING_KEY" <<<"$(secret keystone-yolo)"
    chown yolo:yolo "$YOLO_SIGNING_KEY"
    # Glance's notifications are published to the glance exchange with the worker's user.
    start_service yolo-glance-worker yolo "$AIO_VENV/bin/yolo-glance-worker" \
        --config-file /etc/yolo/yolo-glance-worker.conf
}

# --- tenants, flavors, client configuration -------------------------------------------------

setup_tenants() {
    progress "flavors"
    admin_openstack flavor show m1.yolo >/dev/null 2>&1 ||
        admin_openstack flavor create --ram 1024 --disk 4 --vcpus 1 m1.yolo >/dev/null
    admin_openstack flavor show m1.yolo-large >/dev/null 2>&1 ||
        admin_openstack flavor create --ram 1024 --disk 6 --vcpus 1 m1.yolo-large >/dev/null
}

write_clouds_yaml() {
    install -d -m 0755 /etc/openstack
    install -m 0600 "$AIO_HOME/clouds.yaml" /etc/openstack/clouds.yaml
}

libvirt_cleanup_domains() {
    # Guests of the cloud die with it: their disks go with `clean`, and a later `up` starts over.
    local domain uri
    for uri in qemu:///system "$COMPUTE2_LIBVIRT_URI"; do
        virsh -c "$uri" version >/dev/null 2>&1 || continue
        for domain in $(virsh -c "$uri" list --all --name | grep '^instance-' || true); do
            virsh -c "$uri" destroy "$domain" >/dev/null 2>&1 || true
            virsh -c "$uri" undefine --nvram "$domain" >/dev/null 2>&1 || true
        done
    done
    if ! pid_alive /run/libvirtd.pid; then
        # A machine whose processes were stopped: libvirt's persistent definitions remain.
        pkill -f -- '-name guest=instance-' || true
        rm -f /etc/libvirt/qemu/instance-*.xml
    fi
}

unmount_leftovers() {
    # Learning mounts of profiling boots whose worker was killed, a benchmark's emulated HDD over
    # an instances directory whose benchmark was killed, the second host's storage. Loop devices
    # first, while their backing files still have their paths: detaching one that is mounted
    # frees it when it is unmounted. Then the mounts, deepest first.
    local target loop state
    for state in "$NOVA_STATE" "$COMPUTE2_STATE"; do
        for loop in $(losetup --list --noheadings --output NAME,BACK-FILE |
                      awk -v dir="$state/" 'index($2, dir) == 1 {print $1}'); do
            losetup -d "$loop" 2>/dev/null || true
        done
    done
    for target in $(findmnt -rn -o TARGET |
                    grep -E "^($YOLO_WORKER_DIR|$NOVA_STATE|$COMPUTE2_STATE)(/|$)" | sort -r || true); do
        umount -l "$target" 2>/dev/null || true
    done
}

# --- a second compute host on the same machine ----------------------------------------------

add_compute() {
    progress "a second compute host, $AIO_COMPUTE2_HOST"
    install -d -o nova -g nova -m 0755 "$COMPUTE2_STATE"
    # The root mount of a machine without systemd is private: mounts made under the host's state
    # after its libvirtd has started (its yolofs) would not reach libvirtd's namespace.
    mountpoint -q "$COMPUTE2_STATE" || mount --rbind "$COMPUTE2_STATE" "$COMPUTE2_STATE"
    mount --make-rshared "$COMPUTE2_STATE"
    install -d -o nova -g nova -m 0755 "$COMPUTE2_INSTANCES"
    own_disk "$COMPUTE2_INSTANCES" "$COMPUTE2_STATE/memory" "$AIO_COMPUTE2_HOST" "$COMPUTE2_LIBVIRT/run"
    install -d -o nova -g nova -m 0755 "$COMPUTE2_INSTANCES" "$COMPUTE2_INSTANCES/_base"
    install -d -o nova -g nova -m 0750 "$COMPUTE2_STATE/tmp"
    install -d -m 0755 "$(dirname "$COMPUTE2_YOLOFS_BOOT_IMAGES")"
    start_compute2_libvirtd
    # Read after nova.conf, whose every other setting it shares.
    config_file /etc/nova/nova-compute-2.conf nova <<EOF
[DEFAULT]
host = $AIO_COMPUTE2_HOST
state_path = $COMPUTE2_STATE
instances_path = $COMPUTE2_INSTANCES
[libvirt]
connection_uri = $COMPUTE2_LIBVIRT_URI
[oslo_concurrency]
lock_path = $COMPUTE2_STATE/tmp
[yolo]
boot_image_dir = $COMPUTE2_YOLOFS_BOOT_IMAGES
calibration_file = $(dirname "$COMPUTE2_YOLOFS_BOOT_IMAGES")/calibration.json
# Its first boot of an image starts before the download (docs/first-boot.md, the default), which
# nova.conf turns off for the first host: tests/e2e/test_first_boot.py.
first_boot_before_download = true
# It looks for the images warm where it is twice a minute, not every 10 minutes:
# tests/e2e/test_warming.py.
warm_interval = 30
EOF
    "$AIO_VENV/bin/yolo-configure" nova-compute --config-file /etc/nova/nova-compute-2.conf \
        --mount-point "$COMPUTE2_YOLOFS_MOUNTPOINT" --control-socket "$COMPUTE2_YOLOFS_CONTROL_SOCKET" \
        --boot-image-signing-key-file "$YOLO_SIGNING_KEY.pub"
    start_compute2_yolofs
    start_compute2_nova
    wait_for "$AIO_COMPUTE2_HOST in placement" 180 compute_registered \
        "$(virsh -c "$COMPUTE2_LIBVIRT_URI" hostname)"
    as_user nova nova-manage cell_v2 discover_hosts >/dev/null
}

# The second host's nova-compute. A test may add settings of its own in
# /etc/nova/nova-compute-2.conf.d (Nova verifying image signatures, say), then restart it.
start_compute2_nova() {
    install -d -o root -g nova -m 0750 /etc/nova/nova-compute-2.conf.d
    start_service nova-compute-2 nova "$AIO_VENV/bin/nova-compute" \
        --config-file /etc/nova/nova.conf --config-file /etc/nova/nova-compute-2.conf \
        --config-dir /etc/nova/nova-compute-2.conf.d
}

restart_compute2_nova() {
    local restarted
    stop_service nova-compute-2 60
    restarted=$(date +%s)
    start_compute2_nova
    # Its first report comes once its resource tracker has run: it takes builds.
    wait_for "nova-compute-2 reporting" 120 compute_reported_since "$AIO_COMPUTE2_HOST" "$restarted"
}

compute_reported_since() {  # HOST EPOCH: the host's nova-compute has reported since EPOCH
    local updated
    updated=$(admin_openstack compute service list --service nova-compute --host "$1" \
        -f value -c 'Updated At') || return 1
    [[ -n $updated ]] && (($(date -u -d "$updated" +%s) > $2))
}

own_disk() {  # INSTANCES MEMORY HOST LIBVIRT-RUN
    # A host's instances directory on a block device of its own: ext4 on a loop device over a
    # file in memory (a tmpfs at MEMORY), so that none of its I/O reaches the machine's disk.
    # yolofs measures the load of the device under its source directory: two hosts' I/O loads
    # are told apart. 16 GiB: room for the base file of an 8 GiB image as Nova downloads it
    # (raw, not sparse) beside a guest's disk; memory is taken only as it is written.
    # AIO_COMPUTE_DISK=hdd: throttled as an emulated HDD (throttle_disk).
    local instances=$1 memory=$2 loop
    if ! mountpoint -q "$instances"; then
        if [[ -n $(ls -A "$instances" 2>/dev/null) ]]; then
            die "$instances is not empty: clean the cloud first (tools/aio/aio clean)"
        fi
        install -d -m 0700 "$memory"
        mountpoint -q "$memory" || mount -t tmpfs -o size=17G,mode=0700 tmpfs "$memory"
        truncate -s 16G "$memory/disk.img"
        loop=$(losetup --find --show "$memory/disk.img")
        mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$loop"
        # discard: blocks ext4 frees (a deleted base file) give their memory back.
        mount -o discard "$loop" "$instances"
    fi
    if [[ $AIO_COMPUTE_DISK == hdd ]]; then
        throttle_disk "$(findmnt -n -o SOURCE --mountpoint "$instances")" "$3" "$4"
    fi
}

check_compute_disk() {
    # Before anything is set up: a cloud keeps the storage it was set up with.
    local kept
    kept=$(cat "$NOVA_STATE/compute-disk" 2>/dev/null) || kept=$AIO_COMPUTE_DISK
    [[ $kept == "$AIO_COMPUTE_DISK" ]] ||
        die "AIO_COMPUTE_DISK=$AIO_COMPUTE_DISK: the cloud was set up with $kept: clean it first (tools/aio/aio clean)"
    case $AIO_COMPUTE_DISK in
        machine|memory) ;;
        hdd) [[ -e /sys/fs/cgroup/blkio/blkio.throttle.read_iops_device ]] ||
                 die "AIO_COMPUTE_DISK=hdd needs the cgroup-v1 blkio controller at /sys/fs/cgroup/blkio" ;;
        *) die "AIO_COMPUTE_DISK=$AIO_COMPUTE_DISK: machine, memory or hdd" ;;
    esac
}

hdd_cgroup() {  # HOST: the blkio cgroup of the host's emulated HDD (nothing: no such disk)
    [[ $AIO_COMPUTE_DISK == hdd ]] && echo "/sys/fs/cgroup/blkio/yolo-aio-$1"
    return 0
}

throttle_disk() {  # DEVICE HOST LIBVIRT-RUN
    # The boot benchmark's emulated HDD (yolo_testing.storage.ThrottledDisk) as a host's own: a
    # blkio cgroup limits what its processes do on the device, all of them sharing one budget as
    # they would share one disk. The host's libvirtd (whose /run/libvirt is LIBVIRT-RUN) puts its
    # guests' QEMU into it through the hook (tools/aio/libvirt-qemu-hook), yolofs starts in it,
    # and the scheduling benchmark's stressors join it. nova-compute and the qemu-img it runs stay
    # out: its download of a base file is not slowed. Idempotent.
    local cgroup device kind
    cgroup=$(hdd_cgroup "$2")
    install -d "$cgroup"
    device=$(lsblk -dno MAJ:MIN "$1" | tr -d ' ')
    for kind in read write; do
        echo "$device $AIO_HDD_IOPS" >"$cgroup/blkio.throttle.${kind}_iops_device"
        echo "$device $AIO_HDD_BYTES_PER_SECOND" >"$cgroup/blkio.throttle.${kind}_bps_device"
    done
    install -d -m 0755 "$3"
    echo "$cgroup" >"$3/yolo-guests-blkio-cgroup"
}

hdd_capacity() {  # [yolo] options for nova.conf: the emulated HDDs' capacity (none without)
    [[ $AIO_COMPUTE_DISK == hdd ]] || return 0
    # Reads and writes have a limit each: a mix of both saturates the disk at their sum.
    echo "disk_iops = $((2 * AIO_HDD_IOPS))"
    echo "disk_bytes_per_second = $((2 * AIO_HDD_BYTES_PER_SECOND))"
}

remove_hdd_cgroups() {
    # After the hosts' processes have stopped: a cgroup with processes cannot be removed.
    local cgroup pid
    rm -f /run/libvirt/yolo-guests-blkio-cgroup
    for cgroup in /sys/fs/cgroup/blkio/yolo-aio-*; do
        [[ -d $cgroup ]] || continue
        while read -r pid; do
            echo "$pid" >/sys/fs/cgroup/blkio/cgroup.procs 2>/dev/null || true
        done <"$cgroup/cgroup.procs"
        rmdir "$cgroup" || echo "aio: $cgroup not removed" >&2
    done
}

start_compute2_yolofs() {
    start_yolofs_service yolofs-compute-2 "$COMPUTE2_INSTANCES/_base" \
        "$COMPUTE2_YOLOFS_MOUNTPOINT" "$COMPUTE2_YOLOFS_BOOT_IMAGES" \
        "$COMPUTE2_YOLOFS_CONTROL_SOCKET" "${YOLOFS_OPTIONS/127.0.0.1:9466/$COMPUTE2_YOLOFS_METRICS}" \
        "$(hdd_cgroup "$AIO_COMPUTE2_HOST")"
}

start_compute2_libvirtd() {
    # Its own virtlogd and libvirtd, in new mount and UTS namespaces: libvirt's state and its
    # persistent domain definitions are private directories, and its host name (the node's name
    # in Nova and placement, which must differ from the first host's) is the compute host's.
    # Mounts made later under the host's state (its yolofs) propagate into the namespace.
    local dir
    pid_alive "$COMPUTE2_LIBVIRT/libvirtd.pid" && return 0
    for dir in run lib cache etc-qemu; do
        install -d -m 0755 "$COMPUTE2_LIBVIRT/$dir"
    done
    # shellcheck disable=SC2016 # expanded by the shell in the namespaces
    unshare --mount --uts --propagation slave -- bash -euc '
        hostname "$2"
        mount --bind "$1/run" /run/libvirt
        mount --bind "$1/lib" /var/lib/libvirt
        mount --bind "$1/cache" /var/cache/libvirt
        mount --bind "$1/etc-qemu" /etc/libvirt/qemu
        virtlogd -d -p "$1/virtlogd.pid"
        libvirtd -d -p "$1/libvirtd.pid"' - "$COMPUTE2_LIBVIRT" "$AIO_COMPUTE2_HOST"
    wait_for "$AIO_COMPUTE2_HOST's libvirtd" 30 virsh -c "$COMPUTE2_LIBVIRT_URI" version
}

stop_compute2() {
    stop_service nova-compute-2
    stop_yolofs_service yolofs-compute-2 "$COMPUTE2_YOLOFS_MOUNTPOINT"
}

stop_compute2_libvirtd() {
    local daemon
    for daemon in libvirtd virtlogd; do
        stop_daemon "$AIO_COMPUTE2_HOST's $daemon" "$COMPUTE2_LIBVIRT/$daemon.pid"
    done
}
