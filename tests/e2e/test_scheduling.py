"""Two compute hosts, and YoloBootFilter with its weigher choosing the one that holds the image,
then the one without I/O contention.

``aio add-compute`` starts a second compute host on the machine (its own libvirtd, instances
directory on a block device of its own, yolofs and boot image store). Nova's image pre-caching
(``openstack aggregate cache image``, the driver's ``cache_image``) puts an image's base file
and boot image on one host: a new server of it must land there, not on the host that would
download it first. Then both hosts hold another image; two fio stressors load one host's
instance storage, and once both hosts have reported their load (nova-compute's resource update,
every 20 s here), a new server must land on the other host, and the scheduler's log must show why:
YoloBootFilter's prediction for each host. The contention then moves to the other host, and the
next server follows it. The tiny image serves: hosts predict a boot by their parameters and load,
not by the image. Both hosts forget the boots they timed before (those of the tests before
these, some under loads of their own): they report the same parameters and differ only in what
they hold and their load. These tests run after those that expect one compute host.
"""

import json
import os
import subprocess
import time

import pytest

from tests.e2e.conftest import admin
from tests.e2e.conftest import base_file_name
from tests.e2e.conftest import create_server
from tests.e2e.conftest import delete_server
from tests.e2e.conftest import on_its_mount
from tests.e2e.conftest import upload_public
from tests.e2e.conftest import wait_for_boot_image
from tests.e2e.conftest import wait_until
from yolo_nova.model import host_stats
from yolo_testing.aio import contention
from yolo_testing.aio import CONTROL_SOCKETS
from yolo_testing.aio import FIRST_HOST
from yolo_testing.aio import HOSTS
from yolo_testing.aio import INSTANCES
from yolo_testing.aio import LOAD_SETTLE_SECONDS
from yolo_testing.aio import log_position
from yolo_testing.aio import OBSERVED_BOOTS
from yolo_testing.aio import predictions
from yolo_testing.aio import reported_stats
from yolo_testing.aio import SECOND_HOST
from yolo_testing.aio import wait_for_reports
from yolo_testing.aio import YOLOFS_BIN

# They read the hosts' load: no other tests beside them.
pytestmark = [pytest.mark.two_hosts, pytest.mark.usefixtures('machine_to_itself')]


def serves_boot_image(host, image_id):
    """Whether ``host``'s yolofs serves a verified boot image of ``image_id``."""
    proc = subprocess.run([str(YOLOFS_BIN), 'ctl', '--socket', str(CONTROL_SOCKETS[host]),
                           'status'], capture_output=True, text=True, timeout=30, check=True)
    return any(b['image_id'] == image_id and b['verified'] and not b['rejected']
               for b in json.loads(proc.stdout)['boot_images'])


def holds(host, image_id):
    return ((INSTANCES[host] / '_base' / base_file_name(image_id)).exists()
            and serves_boot_image(host, image_id))


def cache_image(hosts, image_id):
    """Nova's image pre-caching of ``image_id`` on ``hosts`` (an aggregate of them); returns
    once each holds its base file and its boot image."""
    aggregate = admin('aggregate', 'create', 'e2e-cache-%d-%d' % (os.getpid(), len(hosts)))
    try:
        for host in hosts:
            admin('aggregate', 'add', 'host', aggregate['id'], host)
        admin('--os-compute-api-version', '2.81', 'aggregate', 'cache', 'image',
              aggregate['id'], image_id, parse=False)
        for host in hosts:
            wait_until('%s holding image %s' % (host, image_id), 300,
                       lambda: holds(host, image_id), 3.0)
    finally:
        for host in hosts:
            admin('aggregate', 'remove', 'host', aggregate['id'], host, check=False)
        admin('aggregate', 'delete', aggregate['id'], parse=False, check=False)


def forget_timed_boots():
    for host in HOSTS:
        OBSERVED_BOOTS[host].unlink(missing_ok=True)


def reports_holding(host, image_id, after):
    """Waits until ``host`` has reported, after Unix time ``after``, that it holds the image's
    base file and boot image."""
    def held():
        stats = reported_stats(host)
        state = host_stats.from_stats(stats, max_age=3600)
        return (state is not None and state.updated_at >= after
                and state.holds_base_file(image_id) and state.holds_boot_image(image_id))
    wait_until('%s reporting that it holds %s' % (host, image_id), 300, held, 5.0)


def test_a_server_lands_on_the_host_that_holds_its_image(second_host, tiny_image):
    """Scenario 1 of docs/evaluation/benchmarks.md, "Where the bytes are": the second host
    holds the image (cached by request), the first nothing: the first would download it and
    boot it without a boot image."""
    image = upload_public('e2e-locality-%d' % os.getpid(), tiny_image)
    try:
        wait_for_boot_image(image)
        forget_timed_boots()
        started = time.time()
        cache_image([SECOND_HOST], image['id'])
        assert not (INSTANCES[FIRST_HOST] / '_base' / base_file_name(image['id'])).exists()
        reports_holding(SECOND_HOST, image['id'], started)
        # Reports measured once the caching's download and conversion have left the CPU load
        # (LOAD_SETTLE_SECONDS): the hosts then differ only in what they hold.
        wait_for_reports(HOSTS, time.time() + LOAD_SETTLE_SECONDS)
        since = log_position()
        server = create_server('aio-demo', image['id'], 'e2e-locality')
        try:
            landed = admin('server', 'show', server['id'])['OS-EXT-SRV-ATTR:host']
            verdicts = predictions(since)
            assert landed == SECOND_HOST, verdicts
            # Both passed the filter; the first was weighed with its download first.
            assert {h: v[2] for h, v in verdicts.items()} == {
                FIRST_HOST: 'passes', SECOND_HOST: 'passes'}, verdicts
            assert verdicts[SECOND_HOST][5] == 'cached', verdicts
            assert verdicts[FIRST_HOST][5] == 'download', verdicts
            assert verdicts[FIRST_HOST][6] > 0 and verdicts[SECOND_HOST][6] == 0, verdicts
            assert verdicts[FIRST_HOST][4] > verdicts[SECOND_HOST][4], verdicts
            on_its_mount(SECOND_HOST, server['id'])
        finally:
            delete_server('aio-demo', server['id'])
    finally:
        admin('image', 'delete', image['id'], parse=False, check=False)


@pytest.fixture(scope='module')
def warm_hosts(second_host, published_boot_image):
    """Both compute hosts with the tiny image cached and its boot image installed (by Nova's
    image pre-caching on the second), reporting the same parameters: they then differ only in
    their load."""
    image, _ = published_boot_image
    forget_timed_boots()
    cache_image([FIRST_HOST, SECOND_HOST], image['id'])


def test_servers_land_on_the_host_without_contention(warm_hosts, published_boot_image):
    image, _ = published_boot_image
    for busy, idle in ((FIRST_HOST, SECOND_HOST), (SECOND_HOST, FIRST_HOST)):
        # As many stressors as the scheduling benchmark, whose placements with YOLO on were 4 of 4
        # in every run as built.
        with contention(busy, 2) as settled:
            # Both hosts' reports measured under this load (the CPU load, which both measure on
            # the same machine, from the same moments: an older report could carry a boot's).
            loads = wait_for_reports((busy, idle), settled,
                                     lambda loads: loads[busy] >= 0.8 and loads[idle] < 0.3)
            since = log_position()
            server = create_server('aio-demo', image['id'], 'e2e-sched-%s' % idle)
            try:
                landed = admin('server', 'show', server['id'])['OS-EXT-SRV-ATTR:host']
                verdicts = predictions(since)
                assert landed == idle, (
                    'loads %s, predictions %s: landed on %s' % (loads, verdicts, landed))
                # Both hosts were predicted, the busy one slower.
                assert set(verdicts) == {FIRST_HOST, SECOND_HOST}, verdicts
                assert verdicts[busy][0] > verdicts[idle][0], verdicts
                assert verdicts[idle][2] == 'passes', verdicts
                on_its_mount(idle, server['id'])
            finally:
                delete_server('aio-demo', server['id'])
