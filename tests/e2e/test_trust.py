"""Who can make a host serve a boot image: tenants cannot set or change YOLO's image properties
(Glance property protections); Nova's own service user, whose password every compute host
holds, can publish in the worker's project, but only what the worker signed is served before a
download; and a served boot image found other than its image stops its guests."""

import configparser
import subprocess

import openstack
import openstack.exceptions
import psutil
import pytest

from tests.e2e.conftest import admin
from tests.e2e.conftest import base_file_name
from tests.e2e.conftest import BOOT_TIMEOUT
from tests.e2e.conftest import boot_until_ready
from tests.e2e.conftest import connection
from tests.e2e.conftest import create_server_on
from tests.e2e.conftest import delete_server
from tests.e2e.conftest import demo
from tests.e2e.conftest import image_property
from tests.e2e.conftest import LogSince
from tests.e2e.conftest import upload_public
from tests.e2e.conftest import wait_for_boot_image
from tests.e2e.conftest import YOLOFS
from yolo_common import contract
from yolo_common import signing
from yolo_nova.virt import first_boot
from yolo_testing.aio import INSTANCES
from yolo_testing.wait import wait as wait_until

WORKER_KEY = '/etc/yolo/boot-image-signing.key'


def test_a_tenant_cannot_set_yolo_properties(cloud):
    # A decoy boot image, through the API (the openstack client offers no yolo container
    # format): Glance refuses the property.
    with pytest.raises(openstack.exceptions.ForbiddenException, match='yolo_source_image_id'):
        connection('aio-demo').image.create_image(
            name='e2e-decoy', container_format='yolo', disk_format='raw',
            yolo_source_image_id='someone-elses')
    image = demo('image', 'create', '--container-format', 'bare', '--disk-format', 'raw',
                 'e2e-own-image')
    try:
        for prop in ('yolo_boot_image_id=x', 'yolo_boot_image_status=ready',
                     'yolo_max_seconds=100000'):
            changed = demo('image', 'set', '--property', prop, image['id'], parse=False,
                           check=False)
            assert changed.returncode != 0 and '403' in changed.stderr, prop
        # Other properties stay the tenant's to set.
        demo('image', 'set', '--property', 'os_distro=debian', image['id'], parse=False)
    finally:
        demo('image', 'delete', image['id'], parse=False, check=False)


def test_a_tenant_uploads_a_volume_made_from_an_image_with_a_boot_image(published_boot_image):
    # Cinder keeps the properties of a volume's image, YOLO's among them, and sends them to
    # Glance as the tenant when the volume is uploaded as an image: Glance's protections of
    # yolo_* would refuse the upload (403) unless cinder-api leaves them out
    # (yolo-configure cinder-api).
    image, boot_image_id = published_boot_image
    volume = demo('volume', 'create', '--image', image['id'], '--size', 2, 'e2e-from-image')
    uploaded_id = None
    try:
        wait_until('volume from the image', 600, lambda: volume_available(volume['id']), 2.0)
        copied = demo('volume', 'show', volume['id'])['volume_image_metadata']
        assert copied['yolo_boot_image_id'] == boot_image_id
        uploaded_id = demo('image', 'create', '--volume', volume['id'], '--disk-format', 'raw',
                           'e2e-uploaded-volume')['image_id']
        uploaded = wait_until('upload of the volume', 600,
                              lambda: image_if_active(uploaded_id), 2.0)
        # The new image is another image: it inherits neither the boot image nor its status
        # (the worker may have begun its own).
        assert image_property(uploaded, 'yolo_boot_image_id') != boot_image_id
        assert image_property(uploaded, 'yolo_source_image_id') is None
    finally:
        if uploaded_id:
            demo('image', 'delete', uploaded_id, parse=False, check=False)
        wait_until('volume settled', 600,
                   lambda: volume_status(volume['id']) not in VOLUME_BUSY, 2.0)
        demo('volume', 'delete', volume['id'], parse=False, check=False)


VOLUME_BUSY = ('creating', 'downloading', 'uploading')


def volume_status(volume_id):
    return connection('aio-demo').block_storage.get_volume(volume_id).status


def volume_available(volume_id):
    status = volume_status(volume_id)
    if status == 'error':
        raise AssertionError('volume %s: error (cinder-volume.log)' % volume_id)
    return status == 'available'


def image_if_active(image_id):
    status = connection('aio-demo').image.get_image(image_id).status
    if status in ('killed', 'deleted'):
        raise AssertionError('upload of the volume: image %s' % status)
    return demo('image', 'show', image_id) if status == 'active' else None


def nova_service_user():
    """Glance as Nova's service user (nova.conf's [service_user], on every compute host)."""
    conf = configparser.ConfigParser(strict=False, interpolation=None)
    conf.read('/etc/nova/nova.conf')
    section = conf['service_user']
    return openstack.connect(
        auth_url=section['auth_url'], username=section['username'],
        password=section['password'], project_name=section['project_name'],
        user_domain_name=section.get('user_domain_name', 'Default'),
        project_domain_name=section.get('project_domain_name', 'Default'),
        region_name=conf['placement'].get('region_name'))


def plant(image, tiny_image, tmp_path, signer=None, disk_signature=None):
    """A boot image of ``image`` covering its first 4 KiB, built from its data (with the MBR's
    disk signature changed to ``disk_signature``: the guest still boots), uploaded by Nova's
    service user in the worker's project (signed with ``signer``'s key if given) and linked from
    ``image``. Returns its id."""
    raw = tmp_path / 'image.raw'
    subprocess.run(['qemu-img', 'convert', '-O', 'raw', tiny_image, raw], check=True)
    if disk_signature is not None:
        with open(raw, 'r+b') as disk:
            disk.seek(440)
            disk.write(disk_signature)
    trace = tmp_path / 'trace'
    trace.write_text('0 4096\n')
    planted = tmp_path / 'planted.yolo'
    subprocess.run([YOLOFS, 'build', '--trace', trace, '--source', raw, '--output', planted,
                    '--image-id', image['id']], check=True, capture_output=True)
    raw.unlink()
    properties = {contract.SOURCE_IMAGE_ID: image['id']}
    if signer is not None:
        properties[contract.SIGNATURE] = signer.sign(
            image['id'], 'sha512', signing.file_digest(planted, 'sha512'))
    nova = nova_service_user()
    with open(planted, 'rb') as data:
        boot_image = nova.image.create_image(
            name='e2e-planted', container_format='yolo', disk_format='raw', data=data,
            visibility='private', validate_checksum=False, **properties)
    nova.image.update_image(image['id'], **{contract.BOOT_IMAGE_ID: boot_image.id})
    return boot_image.id


@pytest.mark.two_hosts
def test_a_boot_image_nova_could_publish_is_never_served_before_a_download(
        second_host, tiny_image, tmp_path):
    image, _ = wait_for_boot_image(upload_public('e2e-planted-on', tiny_image))
    try:
        planted = plant(image, tiny_image, tmp_path)
        compute, yolofs = LogSince('nova-compute-2.log'), LogSince('yolofs-compute-2.log')
        boot_until_ready(second_host, image['id'], 'e2e-planted')
        # Refused before a byte of it was downloaded; the image took Nova's path.
        assert "Not using boot image %s of image %s: not signed with the worker's key" % (
            planted, image['id']) in compute.read()
        assert 'serving a fill' not in yolofs.read()
    finally:
        admin('image', 'delete', image['id'], parse=False, check=False)


@pytest.mark.two_hosts
def test_a_served_boot_image_other_than_its_image_stops_its_guest_and_is_rejected(
        second_host, tiny_image, tmp_path):
    """A boot image the worker's key signed (a worker gone wrong: the test signs it with the
    worker's key) whose bytes are not the image's: the guest boots from them before the download,
    and once the download is verified the host stops it, puts the server in ERROR and records
    the rejection in Glance, where no host uses it again."""
    image, _ = wait_for_boot_image(upload_public('e2e-mismatch', tiny_image))
    try:
        planted = plant(image, tiny_image, tmp_path, signer=signing.Signer.from_file(WORKER_KEY),
                        disk_signature=b'YOLO')
        compute, yolofs = LogSince('nova-compute-2.log'), LogSince('yolofs-compute-2.log')
        server = create_server_on(second_host, image['id'], 'e2e-mismatch')
        try:
            def stopped_in_error():
                found = connection('aio-admin').compute.get_server(server['id'])
                return found if found.status == 'ERROR' else None
            found = wait_until('server in ERROR', BOOT_TIMEOUT, stopped_in_error, 3.0)
            assert 'does not hold' in found.fault['message'], found.fault
            # Its guest is stopped: no QEMU runs it.
            assert not [p for p in psutil.process_iter(['cmdline'])
                        if server['id'] in ' '.join(p.info['cmdline'] or ())]
        finally:
            delete_server('aio-admin', server['id'])
        name = base_file_name(image['id'])
        assert '%s%s: serving a fill' % (name, first_boot.FILL_SUFFIX) in yolofs.read()
        assert 'ALARM' in compute.read()
        rejected = admin('image', 'show', planted)
        assert 'did not match' in str(rejected.get(contract.REJECTED) or rejected.get(
            'properties', {}).get(contract.REJECTED))
        # The base file is Glance's data, verified.
        base = INSTANCES[second_host] / '_base' / name
        subprocess.run(['qemu-img', 'compare', '-f', 'raw', '-F', 'qcow2', base, tiny_image],
                       check=True)
    finally:
        admin('image', 'delete', image['id'], parse=False, check=False)
