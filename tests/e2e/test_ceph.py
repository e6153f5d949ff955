"""Glance on Ceph, the most common production store: its rbd store serves no ranges, so a
host's first boot of an image stored there takes Nova's own path (docs/first-boot.md). The
all-in-one's Glance has two stores, ``fs`` (file, the default) and ``ceph`` (rbd, on the
cloud's single-node Ceph cluster: tools/aio/ceph.sh); the second compute host boots images
before their download where it can."""

import os
import subprocess

import pytest

from tests.e2e.conftest import admin
from tests.e2e.conftest import AIO_LOG_DIR
from tests.e2e.conftest import base_file_name
from tests.e2e.conftest import connection
from tests.e2e.conftest import console_log
from tests.e2e.conftest import delete_server
from tests.e2e.conftest import FLAVOR
from tests.e2e.conftest import wait_for_boot_image
from tests.e2e.conftest import wait_for_ready
from tests.e2e.conftest import wait_for_status
from tests import guest_disk
from yolo_testing.aio import INSTANCES


def upload_to_store(image_file, name, store):
    """A public qcow2 image uploaded by the admin into Glance's store ``store`` (the upload's
    ``X-Image-Meta-Store`` header: the ``openstack`` client has no option for it)."""
    images = connection('aio-admin').image
    image = images.post('/images', json={
        'name': name, 'disk_format': 'qcow2', 'container_format': 'bare',
        'visibility': 'public'}).json()
    with open(image_file, 'rb') as data:
        images.put('/images/%s/file' % image['id'], data=data, headers={
            'Content-Type': 'application/octet-stream', 'X-Image-Meta-Store': store})
    return images.get('/images/%s' % image['id']).json()


@pytest.mark.two_hosts
def test_an_image_in_ceph_boots_first_on_novas_path_byte_for_byte(second_host, tiny_image):
    image = upload_to_store(tiny_image, 'e2e-ceph-%d' % os.getpid(), 'ceph')
    try:
        assert image['stores'] == 'ceph', image
        # The worker builds its boot image from Glance's download, which rbd serves in order.
        wait_for_boot_image(image)
        name = base_file_name(image['id'])
        base_dir = INSTANCES[second_host] / '_base'
        assert not (base_dir / name).exists()
        compute_log = AIO_LOG_DIR / 'nova-compute-2.log'
        since = compute_log.stat().st_size
        server = admin('server', 'create', '--nic', 'none', '--image', image['id'], '--flavor',
                       FLAVOR, '--availability-zone', 'nova:%s' % second_host, 'e2e-ceph')
        try:
            wait_for_status('aio-admin', server['id'], 'ACTIVE')
            wait_for_ready('aio-admin', server['id'])
            assert guest_disk.GUEST_IO_ERROR.findall(
                console_log('aio-admin', server['id']).encode()) == []
        finally:
            delete_server('aio-admin', server['id'])
        with open(compute_log) as log:
            log.seek(since)
            logged = log.read()
        # Known before any promise: a range of one byte, refused.
        assert 'Glance does not serve image %s by range' % image['id'] in logged
        assert 'Filled base file %s' % name not in logged
        # The base file is Nova's own download and conversion of the image, byte for byte.
        subprocess.run(['qemu-img', 'compare', '-f', 'raw', '-F', 'qcow2', base_dir / name,
                        tiny_image], check=True)
        assert not [entry for entry in os.listdir(base_dir) if '.yolo-fill' in entry]
    finally:
        admin('image', 'delete', image['id'], parse=False, check=False)
