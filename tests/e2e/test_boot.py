"""A public image, its boot image, and a non-admin user of another project booting from it."""

import configparser
import subprocess
import time

import pytest

from tests import prometheus
from tests.e2e.conftest import (
    MOUNT_POINT, admin, backing_file, base_file_name, create_server, delete_server, demo,
    image_property, wait_for_ready, wait_until, yolofs_ctl)
from yolo_testing.aio import observed_boots


def test_plain_upload_publishes_a_hidden_linked_boot_image(published_boot_image):
    source, boot_image_id = published_boot_image
    assert image_property(source, 'yolo_boot_image_status') == 'ready'
    boot_image = admin('image', 'show', boot_image_id)
    assert boot_image['container_format'] == 'yolo'
    assert image_property(boot_image, 'os_hidden') is True
    assert image_property(boot_image, 'yolo_source_image_id') == source['id']
    # Published by the worker's service identity, not by the image's owner.
    service = admin('project', 'show', 'service')
    assert boot_image['owner'] == service['id'] != source['owner']
    # The tenants who boot the public image see neither the boot image nor its data.
    assert demo('image', 'show', boot_image_id, parse=False, check=False).returncode != 0
    # Compute nodes read it with Nova's service identity (nova.conf's [service_user]), of a
    # project that does not own the source image.
    nova_conf = configparser.ConfigParser(strict=False, interpolation=None)
    nova_conf.read('/etc/nova/nova.conf')
    import openstack
    nova_service = openstack.connect(**{
        key: nova_conf['service_user'][key]
        for key in ('auth_url', 'username', 'password', 'project_name', 'user_domain_name',
                    'project_domain_name')})
    data = nova_service.image.download_image(boot_image_id, stream=True)
    assert next(data.iter_content(8)) == b'YOLOBOOT'


def test_non_admin_boot_of_a_public_image_is_served_from_its_boot_image(published_boot_image):
    source, boot_image_id = published_boot_image
    started = time.time()
    server = create_server('aio-demo', source['id'], 'e2e-boot')
    try:
        name = base_file_name(source['id'])
        assert backing_file(server['id']) == str(MOUNT_POINT / name)
        wait_for_ready('aio-demo', server['id'])
        status = yolofs_ctl('status')
        served = {b['file']: b for b in status['boot_images']}
        assert served[name]['image_id'] == source['id']
        assert served[name]['verified'] is True
        stats = yolofs_ctl('stats', name)['files'][name]
        assert stats['bytes_memory'] > 0, stats
        # What Prometheus sees of it (tools/aio/settings: --metrics-address 127.0.0.1:9466).
        metrics = prometheus.scrape('http://127.0.0.1:9466/metrics')
        # Labelled with the Glance image Nova named for the base file.
        assert metrics[('yolofs_read_bytes_total',
                        (('file', name), ('from', 'boot_image'), ('image', source['id'])))] \
            >= stats['bytes_memory']
        assert metrics[('yolofs_boot_image_loads_total', ())] >= 1
        # nova-compute timed the boot to its ready line, for the host's boot-time parameters.
        boots = wait_until('the boot timed by nova-compute', 60,
                           lambda: observed_boots('aio-compute', since=started))
        assert boots[0].boot_image is True and boots[0].accel == 'tcg', boots
        assert 0 < boots[0].cpu_seconds <= boots[0].seconds + 5, boots
        # The compute node fetched the published boot image and installed it through yolofs.
        log = subprocess.run(['grep', '-c', 'Installed verified boot image %s' % boot_image_id,
                              '/var/log/yolo-aio/nova-compute.log'],
                             capture_output=True, text=True).stdout.strip()
        assert int(log or 0) >= 1
        # What an operator sees of it: the server runs from an image with a boot image.
        row = {r['ID']: r for r in admin('yolo', 'server', 'list')}[server['id']]
        assert row['yolofs'] == 'boot image' and row['Image'] == source['id'], row
        on_host = admin('yolo', 'server', 'list', '--host', row['Host'])
        assert server['id'] in {r['ID'] for r in on_host}
    finally:
        delete_server('aio-demo', server['id'])


@pytest.mark.last
def test_deleting_the_image_deletes_its_boot_image(published_boot_image):
    source, boot_image_id = published_boot_image
    admin('image', 'delete', source['id'], parse=False)
    wait_until('boot image %s deleted' % boot_image_id, 300,
               lambda: admin('image', 'show', boot_image_id, parse=False,
                             check=False).returncode != 0)
