#!/bin/bash
# A minimal stand-in for the devstack functions and variables the YOLO plugin uses (devstack
# itself needs systemd, root and a network). Functions that act record their call in
# $STANDIN_LOG, one line per call: the name and the arguments, tab-separated. The queries
# (is_service_enabled, trueorfalse, ...) behave as devstack's do and record nothing.
#
# Set before sourcing: STANDIN_ROOT (a scratch directory standing for the host's /opt/stack)
# and STANDIN_LOG; ENABLED_SERVICES and any local.conf variable may be set too.
# shellcheck disable=SC2034  # the variables are read by the plugin

function _standin_record {
    local IFS=$'\t'
    printf '%s\n' "$*" >>"$STANDIN_LOG"
}

# --- the variables of stackrc and devstack's lib/* that the plugin reads ---------------------
declare -A -g GITDIR
DEST=${DEST:-$STANDIN_ROOT/opt/stack}
DATA_DIR=${DATA_DIR:-$DEST/data}
GITDIR[yolo]=$DEST/yolo
STACK_USER=${STACK_USER:-$(id -un)}
ENABLED_SERVICES=${ENABLED_SERVICES:-}
DISABLED_SERVICES=${DISABLED_SERVICES:-}
GLOBAL_VENV=${GLOBAL_VENV:-True}
DEVSTACK_VENV=${DEVSTACK_VENV:-$DATA_DIR/venv}
LIBVIRT_GROUP=${LIBVIRT_GROUP-libvirt}
NOVA_CONF=${NOVA_CONF:-/etc/nova/nova.conf}
CINDER_CONF=${CINDER_CONF:-/etc/cinder/cinder.conf}
NOVA_INSTANCES_PATH=${NOVA_INSTANCES_PATH:-$DATA_DIR/nova/instances}
GLANCE_CONF_DIR=${GLANCE_CONF_DIR:-/etc/glance}
GLANCE_API_CONF=${GLANCE_API_CONF:-$GLANCE_CONF_DIR/glance-api.conf}
GLANCE_IMAGE_IMPORT_CONF=${GLANCE_IMAGE_IMPORT_CONF:-$GLANCE_CONF_DIR/glance-image-import.conf}
SERVICE_PASSWORD=${SERVICE_PASSWORD:-service-secret}
ADMIN_PASSWORD=${ADMIN_PASSWORD:-admin-secret}
SERVICE_PROJECT_NAME=${SERVICE_PROJECT_NAME:-service}
KEYSTONE_SERVICE_URI=${KEYSTONE_SERVICE_URI:-http://controller/identity}
REGION_NAME=${REGION_NAME:-RegionOne}
RABBIT_URL=${RABBIT_URL:-rabbit://stackrabbit:rabbit-secret@controller:5672/}

# --- queries ---------------------------------------------------------------------------------
# Any of the services enabled (of devstack's catch-all names, only nova's: any n-* service).
function is_service_enabled {
    local service
    for service in "$@"; do
        [[ ,$ENABLED_SERVICES, == *,$service,* ]] && return 0
        [[ $service == nova && ,$ENABLED_SERVICES, == *,n-* ]] && return 0
    done
    return 1
}

function trueorfalse {
    local default=$1 value=${!2:-}
    case "$value" in
        1 | [yY]es | YES | [tT]rue | TRUE) echo True ;;
        0 | [nN]o | NO | [fF]alse | FALSE) echo False ;;
        *) echo "$default" ;;
    esac
}

function is_ubuntu {
    [[ "${STANDIN_PACKAGES:-deb}" == deb ]]
}

function get_python_exec_prefix {
    if [[ "$GLOBAL_VENV" == True ]]; then
        echo "$DEVSTACK_VENV/bin"
    else
        echo /usr/local/bin
    fi
}

function get_notification_url {
    echo "$RABBIT_URL"
}

# --- actions ---------------------------------------------------------------------------------
function define_plugin {
    _standin_record define_plugin "$@"
}

function enable_service {
    _standin_record enable_service "$@"
    local service
    for service in "$@"; do
        if [[ ,$DISABLED_SERVICES, == *,$service,* ]]; then
            continue
        fi
        is_service_enabled "$service" || ENABLED_SERVICES+=",$service"
    done
}

# As in local.conf, before the plugin's settings are read.
function disable_service {
    local service
    for service in "$@"; do
        DISABLED_SERVICES+=",$service"
        ENABLED_SERVICES=$(tr , '\n' <<<"$ENABLED_SERVICES" | grep -vx -- "$service" | paste -sd, -)
    done
}

function echo_summary {
    _standin_record echo_summary "$@"
}

# stack.sh's background jobs (inc/async): configure_neutron_nova edits nova.conf meanwhile.
function async_wait {
    _standin_record async_wait "$@"
}

function die {
    _standin_record die "$@"
    exit 1
}

# run_process name command [group] [user]: devstack starts only an enabled service.
function run_process {
    _standin_record run_process "$@"
    if is_service_enabled "$1"; then
        _standin_record started "$1"
    fi
}

function stop_process {
    _standin_record stop_process "$@"
}

function install_package {
    _standin_record install_package "$@"
}

function pip_install {
    _standin_record pip_install "$@"
}

function pip_uninstall {
    _standin_record pip_uninstall "$@"
}

function get_or_create_user {
    _standin_record get_or_create_user "$@"
    echo "id-of-$1"
}

function get_or_add_user_project_role {
    _standin_record get_or_add_user_project_role "$@"
    echo "id-of-$1"
}
