"""Images YOLO cannot help: a clear boot image status, and servers that fare as without YOLO."""

import subprocess

import pytest

from tests.e2e.conftest import (
    BOOT_IMAGE_TIMEOUT, admin, delete_server, demo, image_property, wait_for_status, wait_until)

CLOUD = 'aio-demo'


def upload(path, name, disk_format, *properties):
    image = admin('image', 'create', '--public', '--disk-format', disk_format,
                  '--container-format', 'bare', '--file', path, *properties, name)
    return image['id']


def boot_image_outcome(image_id):
    def settled():
        image = admin('image', 'show', image_id)
        status = image_property(image, 'yolo_boot_image_status')
        return image if status in ('failed', 'skipped', 'ready') else None
    image = wait_until('boot image status of %s' % image_id, BOOT_IMAGE_TIMEOUT, settled, 5.0)
    return tuple(image_property(image, 'yolo_boot_image_' + name)
                 for name in ('status', 'reason', 'id'))


def create_and_delete_server(image_id, name):
    """A server of the image as the demo user: ACTIVE, or AssertionError."""
    server = demo('server', 'create', '--nic', 'none', '--image', image_id, '--flavor',
                  'm1.yolo', name)
    try:
        wait_for_status(CLOUD, server['id'], 'ACTIVE')
    finally:
        delete_server(CLOUD, server['id'])


def test_corrupt_upload(cloud, tiny_image, tmp_path):
    # Truncated: still a qcow2 header, so Glance accepts it; its data ends half-way.
    corrupt = tmp_path / 'truncated.qcow2'
    corrupt.write_bytes(tiny_image.read_bytes()[:tiny_image.stat().st_size // 2])
    image_id = upload(corrupt, 'e2e-corrupt', 'qcow2')
    try:
        status, reason, boot_image = boot_image_outcome(image_id)
        assert (status, boot_image) == ('failed', None)
        assert 'could not be converted to raw' in reason
        # Nova cannot convert it either: the server fails to build on the compute node, as
        # without YOLO (not for want of a host).
        with pytest.raises(AssertionError, match='went to ERROR') as failed:
            create_and_delete_server(image_id, 'e2e-corrupt')
        assert 'No valid host' not in str(failed.value)
    finally:
        admin('image', 'delete', image_id, parse=False, check=False)


def test_image_that_boots_nothing(cloud, tmp_path):
    blank = tmp_path / 'blank.raw'
    subprocess.run(['truncate', '-s', '64M', str(blank)], check=True)
    image_id = upload(blank, 'e2e-blank', 'raw', '--property', 'yolo_idle_seconds=5',
                      '--property', 'yolo_max_seconds=60')
    try:
        status, reason, boot_image = boot_image_outcome(image_id)
        assert (status, boot_image) == ('failed', None)
        assert 'did not boot' in reason
        # The server is created and runs its BIOS, which finds nothing to boot: as without YOLO.
        create_and_delete_server(image_id, 'e2e-blank')
    finally:
        admin('image', 'delete', image_id, parse=False, check=False)
