# shellcheck shell=bash
# A single-node Ceph cluster for the all-in-one cloud's Glance (sourced by tools/aio/aio): one
# monitor, one manager and one OSD from Debian 12's packages (16.2), the OSD's BlueStore on a
# sparse file as Ceph's own vstart.sh lays it out, every pool of one replica. Glance stores
# images in its pool "images" as client.glance (its "ceph" store, beside the file store "fs").
# Debian's packages install the daemons and their user, ceph; they run here like the cloud's
# other services, in the foreground under start-stop-daemon (their output in $AIO_LOG_DIR, their
# logs in /var/log/ceph).

# shellcheck disable=SC2034 # read by lib.sh's install_packages
CEPH_PACKAGES=(ceph-mon ceph-mgr ceph-osd ceph-common python3-rados python3-rbd)
CEPH_CONF=/etc/ceph/ceph.conf
CEPH_STATE=/var/lib/ceph/aio
CEPH_OSD_SIZE=${CEPH_OSD_SIZE:-8G}
CEPH_POOL=images

ceph_admin() { timeout 60 ceph --conf "$CEPH_CONF" "$@"; }

setup_ceph() {
    progress "ceph (a monitor, a manager and an OSD)"
    [[ -f $CEPH_STATE/bootstrapped ]] || bootstrap_ceph
    start_service ceph-mon ceph ceph-mon -f --conf "$CEPH_CONF" -i a
    wait_for "the Ceph monitor" 60 ceph_admin mon stat
    start_service ceph-mgr ceph ceph-mgr -f --conf "$CEPH_CONF" -i a
    start_service ceph-osd ceph ceph-osd -f --conf "$CEPH_CONF" -i 0
    wait_for "the Ceph OSD" 120 bash -c "timeout 10 ceph --conf $CEPH_CONF osd stat -f json |
        grep -q '\"num_up_osds\":1'"
    if ! ceph_admin osd pool ls | grep -qx "$CEPH_POOL"; then
        ceph_admin osd pool create "$CEPH_POOL" 8 >/dev/null
        ceph_admin osd pool set "$CEPH_POOL" size 1 --yes-i-really-mean-it >/dev/null
        timeout 60 rbd --conf "$CEPH_CONF" pool init "$CEPH_POOL"
    fi
    # Glance's key, readable by glance alone, with the capabilities glance_store's documentation
    # gives its user.
    ceph_admin auth get-or-create client.glance mon 'profile rbd' \
        osd "profile rbd pool=$CEPH_POOL" mgr "profile rbd pool=$CEPH_POOL" \
        -o /etc/ceph/ceph.client.glance.keyring
    chown glance:glance /etc/ceph/ceph.client.glance.keyring
    chmod 0600 /etc/ceph/ceph.client.glance.keyring
    link_ceph_bindings
}

bootstrap_ceph() {
    local fsid tmp osd_uuid osd_secret osd_id
    progress "bootstrapping Ceph in $CEPH_STATE"
    fsid=$(cat /proc/sys/kernel/random/uuid)
    rm -rf "$CEPH_STATE"
    install -d -o ceph -g ceph -m 0750 "$CEPH_STATE" "$CEPH_STATE/mon-a" "$CEPH_STATE/mgr-a" \
        "$CEPH_STATE/osd-0" /run/ceph
    install -d -m 0755 /etc/ceph
    cat >"$CEPH_CONF" <<EOF
[global]
fsid = $fsid
mon host = [v2:$AIO_HOST:3300,v1:$AIO_HOST:6789]
public network = $AIO_HOST/32
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = /run/ceph
osd pool default size = 1
osd pool default min size = 1
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 2
[mon]
mon data = $CEPH_STATE/mon-\$id
[mgr]
mgr data = $CEPH_STATE/mgr-\$id
[osd]
osd data = $CEPH_STATE/osd-\$id
osd objectstore = bluestore
bluestore block create = true
bluestore block size = $(numfmt --from=iec "$CEPH_OSD_SIZE")
osd memory target = 939524096
EOF
    tmp=$(mktemp -d)
    ceph-authtool --create-keyring "$tmp/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool --create-keyring /etc/ceph/ceph.client.admin.keyring --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
    chmod 0600 /etc/ceph/ceph.client.admin.keyring
    ceph-authtool "$tmp/mon.keyring" --import-keyring /etc/ceph/ceph.client.admin.keyring >/dev/null
    monmaptool --create --addv a "[v2:$AIO_HOST:3300,v1:$AIO_HOST:6789]" --fsid "$fsid" \
        "$tmp/monmap" >/dev/null
    chown -R ceph:ceph "$tmp"
    runuser -u ceph -- ceph-mon --conf "$CEPH_CONF" --mkfs -i a --monmap "$tmp/monmap" \
        --keyring "$tmp/mon.keyring"
    rm -rf "$tmp"
    start_service ceph-mon ceph ceph-mon -f --conf "$CEPH_CONF" -i a
    wait_for "the Ceph monitor" 60 ceph_admin mon stat
    ceph_admin auth get-or-create mgr.a mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
        -o "$CEPH_STATE/mgr-a/keyring"
    osd_uuid=$(cat /proc/sys/kernel/random/uuid)
    osd_secret=$(ceph-authtool --gen-print-key)
    osd_id=$(echo "{\"cephx_secret\": \"$osd_secret\"}" |
        ceph_admin osd new "$osd_uuid" -i - -n client.admin)
    [[ $osd_id == 0 ]] || die "the Ceph OSD got id $osd_id, not 0"
    ceph-authtool --create-keyring "$CEPH_STATE/osd-0/keyring" --name osd.0 \
        --add-key "$osd_secret" >/dev/null
    chown -R ceph:ceph "$CEPH_STATE"
    # Its first look for a label it is about to write is logged as an error: kept out of sight.
    runuser -u ceph -- ceph-osd --conf "$CEPH_CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" \
        >"$CEPH_STATE/osd-mkfs.log" 2>&1 || { cat "$CEPH_STATE/osd-mkfs.log" >&2; die "the Ceph OSD's mkfs failed"; }
    rm -f "$CEPH_STATE/osd-mkfs.log"
    touch "$CEPH_STATE/bootstrapped"
}

link_ceph_bindings() {
    # glance_store's rbd driver imports rados and rbd: Debian's bindings, built for the Python
    # the cloud's venv runs on, made visible to it alone (not the rest of dist-packages).
    local site bindings=$AIO_VENV/lib/ceph-bindings module
    site=$("$AIO_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    install -d "$bindings"
    for module in /usr/lib/python3/dist-packages/rados.cpython-*.so \
                  /usr/lib/python3/dist-packages/rbd.cpython-*.so; do
        ln -sf "$module" "$bindings/"
    done
    echo "$bindings" >"$site/ceph-bindings.pth"
}

stop_ceph() {
    local name
    for name in ceph-osd ceph-mgr ceph-mon; do
        stop_service "$name" 30
    done
}

clean_ceph() {
    stop_ceph
    rm -rf "$CEPH_STATE" /etc/ceph/ceph.conf /etc/ceph/ceph.client.admin.keyring \
        /etc/ceph/ceph.client.glance.keyring
}
