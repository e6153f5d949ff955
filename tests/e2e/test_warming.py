"""A host warmed before the first request (docs/operations.md, "Warming hosts before the first
request"): ``openstack yolo image warm --aggregate`` has the second host, alone in an aggregate,
hold a new image's boot image without its base file (it looks every 30 s here, ``[yolo]
warm_interval``); ``openstack yolo image list`` counts it, and the host's first boot of the image
takes it from its warm store, with nothing to fetch before the guest starts."""

import os

import pytest

from tests.e2e.conftest import admin
from tests.e2e.conftest import base_file_name
from tests.e2e.conftest import boot_until_ready
from tests.e2e.conftest import LogSince
from tests.e2e.conftest import upload_public
from tests.e2e.conftest import wait_for_boot_image
from tests.e2e.conftest import wait_until
from yolo_testing.aio import FIRST_HOST
from yolo_testing.aio import INSTANCES
from yolo_testing.aio import SECOND_HOST

pytestmark = pytest.mark.two_hosts


def warm_store(host):
    return INSTANCES[host] / 'yolo-incoming' / 'warm'


def held_warm(host, image_id):
    store = warm_store(host)
    return store.exists() and any(p.name.startswith(image_id + '.') for p in store.iterdir())


def hosts_holding(image_id):
    [row] = [r for r in admin('yolo', 'image', 'list') if r['ID'] == image_id]
    return row['Warm'], row['Hosts Holding']


def test_a_warm_images_first_boot_takes_its_boot_image_from_the_store(second_host, tiny_image):
    image = upload_public('e2e-warm-%d' % os.getpid(), tiny_image)
    aggregate = admin('aggregate', 'create', 'e2e-warm-%d' % os.getpid())
    try:
        wait_for_boot_image(image)
        admin('aggregate', 'add', 'host', aggregate['id'], SECOND_HOST)
        [warmed] = admin('yolo', 'image', 'warm', image['id'], '--aggregate', aggregate['name'])
        scope = warmed['Warm']
        assert warmed['ID'] == image['id'] and scope.startswith('aggregate:'), warmed
        wait_until('%s holding %s warm' % (SECOND_HOST, image['id']), 300,
                   lambda: held_warm(SECOND_HOST, image['id']), 5.0)
        # Its boot image only; and not on the host outside the aggregate.
        assert not (INSTANCES[SECOND_HOST] / '_base' / base_file_name(image['id'])).exists()
        assert not held_warm(FIRST_HOST, image['id'])
        # Counted from the host's trait in placement, at its next resource update.
        wait_until('one host holding %s' % image['id'], 300,
                   lambda: hosts_holding(image['id']) == (scope, 1), 10.0)

        compute = LogSince('nova-compute-2.log')
        boot_until_ready(SECOND_HOST, image['id'], 'e2e-warm')
        log = compute.read()
        assert 'for base file %s: from the warm store' % base_file_name(image['id']) in log, \
            log[-3000:]
        assert 'Downloading boot image' not in log
        # Still held, for a first boot after the image cache manager removes the base file.
        assert held_warm(SECOND_HOST, image['id'])

        admin('yolo', 'image', 'unwarm', image['id'])
        assert hosts_holding(image['id'])[0] is None
    finally:
        admin('aggregate', 'remove', 'host', aggregate['id'], SECOND_HOST, check=False)
        admin('aggregate', 'delete', aggregate['id'], parse=False, check=False)
        admin('image', 'delete', image['id'], parse=False, check=False)
