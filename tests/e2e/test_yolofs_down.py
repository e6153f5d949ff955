"""yolofs stopped on the compute node: Nova keeps working as without YOLO, and YOLO comes back
for new boots once yolofs is back."""

import subprocess

import pytest

from tests.e2e.conftest import (
    AIO, BASE_DIR, MOUNT_POINT, backing_file, base_file_name, create_server, delete_server, demo,
    wait_for_ready, wait_for_status)

CLOUD = 'aio-demo'


@pytest.fixture
def yolofs_stopped(cloud):
    subprocess.run([str(AIO), 'stop-yolofs'], check=True)
    try:
        yield
    finally:
        subprocess.run([str(AIO), 'start-yolofs'], check=True)


def test_nova_works_with_yolofs_down_and_yolo_returns_with_it(
        published_boot_image, yolofs_stopped):
    source, _ = published_boot_image
    name = base_file_name(source['id'])
    server = create_server(CLOUD, source['id'], 'e2e-yolofs-down')
    try:
        assert backing_file(server['id']) == str(BASE_DIR / name)
        ready = wait_for_ready(CLOUD, server['id'])

        demo('server', 'stop', server['id'], parse=False)
        wait_for_status(CLOUD, server['id'], 'SHUTOFF')
        demo('server', 'start', server['id'], parse=False)
        wait_for_status(CLOUD, server['id'], 'ACTIVE')
        ready = wait_for_ready(CLOUD, server['id'], previous=ready)

        # Rescue and unrescue with yolofs down: test_lifecycle's yolofs test (it stops under a
        # guest on the mount, the harder case).
        assert backing_file(server['id']) == str(BASE_DIR / name)

        subprocess.run([str(AIO), 'start-yolofs'], check=True)
        # The next start of a server puts its disk back on the mount; new boots use it.
        demo('server', 'reboot', '--hard', '--wait', server['id'], parse=False)
        # Read as the guest starts: once its boot is over it leaves the mount.
        assert backing_file(server['id']) == str(MOUNT_POINT / name)
        wait_for_ready(CLOUD, server['id'], previous=ready)
    finally:
        delete_server(CLOUD, server['id'])
