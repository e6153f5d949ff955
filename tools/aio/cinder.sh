# shellcheck shell=bash
# Cinder, for the tests of what tenants do with volumes made from images (sourced by
# tools/aio/aio): cinder-api from PyPI under gunicorn as the other APIs, cinder-scheduler, and
# cinder-volume with one backend, RBD, on the all-in-one's Ceph (pool "volumes", client.cinder,
# which may read Glance's pool as Ceph's documentation sets it up). cinder-volume runs as its own
# user and reaches root through sudo and rootwrap, as devstack runs it. No cinder-backup and no
# attachments: the cloud's Nova boots from images only.

CINDER_PORT=8776
CINDER_POOL=volumes
CINDER_STATE=/var/lib/cinder
CINDER_KEYRING=/etc/ceph/ceph.client.cinder.keyring

setup_cinder() {
    progress "cinder (api, scheduler and an RBD volume backend)"
    create_database cinder cinder
    create_rabbit_user cinder
    create_cinder_pool
    install -d -o cinder -g cinder -m 0750 "$CINDER_STATE" "$CINDER_STATE/locks" \
        "$CINDER_STATE/conversion"
    config_file /etc/cinder/cinder.conf cinder <<EOF2
[DEFAULT]
transport_url = $(rabbit_url cinder)
state_path = $CINDER_STATE
api_paste_config = /etc/cinder/api-paste.ini
auth_strategy = keystone
enabled_backends = ceph
image_conversion_dir = $CINDER_STATE/conversion
[database]
connection = $(db_url cinder cinder)
[oslo_concurrency]
lock_path = $CINDER_STATE/locks
[ceph]
volume_driver = cinder.volume.drivers.rbd.RBDDriver
volume_backend_name = ceph
rbd_pool = $CINDER_POOL
rbd_user = cinder
rbd_ceph_conf = $CEPH_CONF
$(authtoken_section cinder)
EOF2
    install -m 0644 "$AIO_VENV/etc/cinder/api-paste.ini" /etc/cinder/api-paste.ini
    install -m 0644 "$AIO_VENV/etc/cinder/resource_filters.json" /etc/cinder/resource_filters.json
    install_rootwrap cinder
    "$AIO_VENV/bin/yolo-configure" cinder-api --config-file /etc/cinder/cinder.conf
    as_user cinder cinder-manage db sync >/dev/null
    start_wsgi cinder-api cinder "$CINDER_PORT" cinder.wsgi.api:application
    start_service cinder-scheduler cinder "$AIO_VENV/bin/cinder-scheduler" \
        --config-file /etc/cinder/cinder.conf
    start_service cinder-volume cinder "$AIO_VENV/bin/cinder-volume" \
        --config-file /etc/cinder/cinder.conf
    wait_for "cinder-volume's RBD backend" 120 cinder_volume_up
}

create_cinder_pool() {
    if ! ceph_admin osd pool ls | grep -qx "$CINDER_POOL"; then
        ceph_admin osd pool create "$CINDER_POOL" 8 >/dev/null
        ceph_admin osd pool set "$CINDER_POOL" size 1 --yes-i-really-mean-it >/dev/null
        timeout 60 rbd --conf "$CEPH_CONF" pool init "$CINDER_POOL"
    fi
    ceph_admin auth get-or-create client.cinder mon 'profile rbd' \
        osd "profile rbd pool=$CINDER_POOL, profile rbd-read-only pool=$CEPH_POOL" \
        mgr "profile rbd pool=$CINDER_POOL" -o "$CINDER_KEYRING"
    chown cinder:cinder "$CINDER_KEYRING"
    chmod 0600 "$CINDER_KEYRING"
}

cinder_volume_up() {
    admin_openstack volume service list --service cinder-volume -f value -c State | grep -qx up
}

clean_cinder() {
    rm -rf /etc/cinder "$CINDER_STATE" "$CINDER_KEYRING" /etc/sudoers.d/yolo-aio-cinder
}
