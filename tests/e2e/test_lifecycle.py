"""A server's life through Nova with YOLO on, as a non-admin user: every path that restarts the
guest ends with the guest ready again. The tests run in order on one server of the tiny image
(seconds a boot under TCG); the last runs commands in its guest, on a Debian server of its own
(a minute or two a boot). A path whose YOLO logic the driver's functional tests cover with
Nova's fixtures (soft reboot, rescue with yolofs up) is booted here only once, hard reboots in
the yolofs test below."""

import subprocess
import xml.etree.ElementTree as ET

import pytest

from tests import guest_disk
from tests.e2e.conftest import (
    AIO, BASE_DIR, INSTANCES, MOUNT_POINT, RESIZE_FLAVOR, admin, backing_file, base_file_name,
    console_log, create_server, delete_server, demo, kill_yolofs, wait_for_ready, wait_for_status,
    wait_until)

CLOUD = 'aio-demo'


class Guest:
    def __init__(self, server_id):
        self.id = server_id
        self.console = ''
        # Read as the guest starts: once its boot is over it leaves the mount.
        self.backing_at_start = backing_file(server_id)

    def wait_ready(self):
        self.console = wait_for_ready(CLOUD, self.id, previous=self.console)

    def act(self, action, status):
        """openstack server ACTION, then wait for the server's STATUS."""
        demo('server', action, self.id, parse=False)
        wait_for_status(CLOUD, self.id, status)


@pytest.fixture(scope='module')
def guest(published_boot_image):
    source, _ = published_boot_image
    server = create_server(CLOUD, source['id'], 'e2e-lifecycle')
    guest = Guest(server['id'])
    guest.wait_ready()
    yield guest
    delete_server(CLOUD, guest.id)


def test_disk_is_backed_by_the_mount(guest, published_boot_image):
    source, _ = published_boot_image
    assert guest.backing_at_start == str(MOUNT_POINT / base_file_name(source['id']))


def take_snapshot(guest, name, status):
    """The guest's snapshot image, once the server is back to ``status``: the image is active
    before Nova ends the server's snapshot task (image_uploading), and Nova refuses the next
    action until then."""
    snapshot = demo('server', 'image', 'create', '--wait', '--name', name, guest.id)
    wait_for_status(CLOUD, guest.id, status)
    return snapshot


def snapshot_boots(guest, name):
    snapshot = take_snapshot(guest, name, 'ACTIVE')
    try:
        server = create_server(CLOUD, snapshot['id'], name + '-server')
        try:
            wait_for_ready(CLOUD, server['id'])
        finally:
            delete_server(CLOUD, server['id'])
    finally:
        demo('image', 'delete', snapshot['id'], parse=False, check=False)


def test_live_snapshot_boots(guest):
    snapshot_boots(guest, 'e2e-live-snapshot')


def test_stop_cold_snapshot_and_start(guest, tmp_path):
    # One stop and start for both (each guest boot is one to two minutes of CI's time). The live
    # snapshot's server boots; the cold snapshot holds what the stopped disk holds.
    guest.act('stop', 'SHUTOFF')
    snapshot = take_snapshot(guest, 'e2e-cold-snapshot', 'SHUTOFF')
    try:
        saved = tmp_path / 'cold-snapshot'
        demo('image', 'save', '--file', saved, snapshot['id'], parse=False)
        subprocess.run(['qemu-img', 'compare', '-U', str(INSTANCES / guest.id / 'disk'),
                        str(saved)], check=True, capture_output=True)
    finally:
        demo('image', 'delete', snapshot['id'], parse=False, check=False)
    guest.act('start', 'ACTIVE')
    guest.wait_ready()


def test_shelve_offload_and_unshelve(guest):
    guest.act('shelve', 'SHELVED_OFFLOADED')
    guest.act('unshelve', 'ACTIVE')
    guest.wait_ready()


def test_resize_to_the_same_host(guest):
    host = admin('server', 'show', guest.id)['OS-EXT-SRV-ATTR:host']
    demo('server', 'resize', '--flavor', RESIZE_FLAVOR, guest.id, parse=False)
    wait_for_status(CLOUD, guest.id, 'VERIFY_RESIZE')
    demo('server', 'resize', 'confirm', guest.id, parse=False)
    wait_for_status(CLOUD, guest.id, 'ACTIVE')
    assert admin('server', 'show', guest.id)['OS-EXT-SRV-ATTR:host'] == host
    guest.wait_ready()


def test_yolofs_stopped_under_a_guest_on_the_mount(guest, published_boot_image):
    """yolofs stops while the guest runs from the mount (just booted: it leaves the mount once
    its boot is over, and at once when yolofs stops): Nova's paths that read the disk's chain or
    redefine the guest from its saved live XML work from _base."""
    source, _ = published_boot_image
    name = base_file_name(source['id'])
    demo('server', 'reboot', '--hard', '--wait', guest.id, parse=False)
    assert backing_file(guest.id) == str(MOUNT_POINT / name)
    guest.wait_ready()
    subprocess.run([str(AIO), 'stop-yolofs'], check=True)
    try:
        # A live snapshot's delta and its extraction read the chain: from _base.
        snapshot = take_snapshot(guest, 'e2e-snapshot-down', 'ACTIVE')
        try:
            assert demo('image', 'show', snapshot['id'])['status'] == 'active'
        finally:
            demo('image', 'delete', snapshot['id'], parse=False, check=False)
        # Rescue saves the live XML, whose backingStore names the mount; unrescue defines it again.
        guest.act('rescue', 'RESCUE')
        guest.wait_ready()
        guest.act('unrescue', 'ACTIVE')
        guest.wait_ready()
        assert backing_file(guest.id) == str(BASE_DIR / name)
    finally:
        subprocess.run([str(AIO), 'start-yolofs'], check=True)
    demo('server', 'reboot', '--hard', '--wait', guest.id, parse=False)
    assert backing_file(guest.id) == str(MOUNT_POINT / name)
    guest.wait_ready()


def libvirt_domain(server_id):
    """The server's running guest, as libvirt's domain."""
    import libvirt
    name = admin('server', 'show', server_id)['OS-EXT-SRV-ATTR:instance_name']
    return libvirt.open('qemu:///system').lookupByName(name)


def domain_disk(domain):
    """(source, backing store source) of the running guest's disk in libvirt's live XML."""
    disk = ET.fromstring(domain.XMLDesc()).find('./devices/disk')
    return disk.find('source').get('file'), disk.find('backingStore/source').get('file')


def test_delete(guest):
    demo('server', 'delete', '--wait', guest.id, parse=False)
    wait_until('server %s gone' % guest.id, 120,
               lambda: demo('server', 'show', guest.id, parse=False, check=False).returncode)
    assert not (INSTANCES / guest.id).exists()


def test_the_guest_leaves_the_mount_once_its_boot_is_over(published_debian_boot_image,
                                                          debian_image_tree_digest):
    """A Debian guest, booted from the mount, moves to _base once its boot is over, and then
    runs on without yolofs: yolofs and its keeper are killed (SIGKILL), and inside the guest
    (through its agent, which the tiny image has not) every block of its disk reads without an
    I/O error and its files are the source's."""
    source, _ = published_debian_boot_image
    server = create_server(CLOUD, source['id'], 'e2e-leaves-the-mount')
    try:
        guest = Guest(server['id'])
        assert guest.backing_at_start == str(MOUNT_POINT / base_file_name(source['id']))
        guest.wait_ready()
        base = str(BASE_DIR / base_file_name(source['id']))
        # The boot window ends 30 s after the boot's last read (--record-idle-secs).
        wait_until('guest of %s off the mount' % guest.id, 300,
                   lambda: backing_file(guest.id) == base)
        domain = libvirt_domain(guest.id)
        assert domain_disk(domain) == (str(INSTANCES / guest.id / 'disk'), base)
        kill_yolofs()
        try:
            guest_disk.check_guest_reads_its_disk(domain, debian_image_tree_digest)
        finally:
            subprocess.run([str(AIO), 'start-yolofs'], check=True)
        assert guest_disk.GUEST_IO_ERROR.findall(console_log(CLOUD, guest.id).encode()) == []
    finally:
        delete_server(CLOUD, server['id'])
