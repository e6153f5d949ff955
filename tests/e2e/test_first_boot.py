"""The first boot of an image on a compute host, before its download (docs/first-boot.md), on
the all-in-one cloud: the second compute host runs with ``first_boot_before_download`` and has
never booted the public image."""

import configparser
import datetime
import os
import subprocess

from keystoneauth1 import exceptions as ks_exceptions
from keystoneauth1.identity import v3
from keystoneauth1 import service_token
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint
import pytest

from tests.e2e.conftest import admin
from tests.e2e.conftest import base_file_name
from tests.e2e.conftest import connection
from tests.e2e.conftest import delete_server
from tests.e2e.conftest import FLAVOR
from tests.e2e.conftest import on_its_mount
from tests.e2e.conftest import wait_for_ready
from tests.e2e.conftest import wait_for_status
from yolo_nova.virt import first_boot
from yolo_testing.aio import INSTANCES
from yolo_testing.wait import wait as wait_until

LOG_DIR = '/var/log/yolo-aio'


def test_glance_serves_the_ranges_a_fill_asks_for(public_image, tiny_image):
    """What a fill of a raw image asks of Glance, through a user's keystone session: single
    ranges (a read waiting for them) and the rest of the data from an offset (a resumed
    download)."""
    demo = connection('aio-demo')
    data = first_boot.GlanceData(demo.session, demo.image.get_endpoint(), public_image['id'])
    with open(tiny_image, 'rb') as image:
        for offset, length in ((0, 4096), (5 << 20, 1 << 20),
                               (os.path.getsize(tiny_image) - 1000, 1000)):
            assert data.read(offset, length) == os.pread(image.fileno(), length, offset)
        start = (7 << 20) + 12345
        first = next(data.chunks(start, chunk_bytes=1 << 20))
        assert first == os.pread(image.fileno(), len(first), start) and first


def test_a_fills_ranges_outlive_the_users_token_beside_novas_service_token(
        public_image, tiny_image):
    """A long fill's ranges go on after the booting user's token has expired: Nova sends its
    service token beside it (``[service_user] send_service_user_token``, on here), and Glance's
    keystonemiddleware accepts an expired user token with a valid service token. The user's
    token here is one keystone issued for an application credential that expires 15 s later
    (keystone ends its tokens with their credential)."""
    demo = connection('aio-demo')
    expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=15)
    credential = demo.identity.create_application_credential(
        demo.current_user_id, name='e2e-expiring-%d' % os.getpid(),
        expires_at=expires.strftime('%Y-%m-%dT%H:%M:%S'))
    auth_url = demo.config.config['auth']['auth_url']
    user = v3.ApplicationCredential(auth_url=auth_url,
                                    application_credential_id=credential.id,
                                    application_credential_secret=credential.secret)
    # As Nova's request context carries it: the token alone.
    token = token_endpoint.Token(None, ks_session.Session(auth=user).get_token())
    nova = configparser.ConfigParser(strict=False, interpolation=None)
    nova.read('/etc/nova/nova.conf')
    service = v3.Password(**{key: nova['service_user'][key] for key in (
        'auth_url', 'username', 'password', 'project_name', 'user_domain_name',
        'project_domain_name')})
    endpoint = demo.image.get_endpoint()
    with_service_token = first_boot.GlanceData(
        ks_session.Session(), endpoint, public_image['id'],
        auth=service_token.ServiceTokenAuthWrapper(user_auth=token, service_auth=service))
    user_only = first_boot.GlanceData(ks_session.Session(), endpoint, public_image['id'],
                                      auth=token)
    with open(tiny_image, 'rb') as image:
        expected = os.pread(image.fileno(), 4096, 1 << 20)
    assert user_only.read(1 << 20, 4096) == expected
    wait_until('the token expired', 60, lambda: datetime.datetime.now(
        datetime.timezone.utc) > expires + datetime.timedelta(seconds=2))
    with pytest.raises(ks_exceptions.Unauthorized):
        user_only.read(1 << 20, 4096)
    assert with_service_token.read(1 << 20, 4096) == expected


@pytest.mark.two_hosts
def test_a_hosts_first_boot_of_a_public_image_runs_before_its_download(
        second_host, published_boot_image, tiny_image):
    image, _ = published_boot_image
    name = base_file_name(image['id'])
    base = INSTANCES[second_host] / '_base' / name
    assert not base.exists()
    compute_log = os.path.join(LOG_DIR, 'nova-compute-2.log')
    yolofs_log = os.path.join(LOG_DIR, 'yolofs-compute-2.log')
    since = {path: os.path.getsize(path) for path in (compute_log, yolofs_log)}

    def logged(path):
        with open(path) as log:
            log.seek(since[path])
            return log.read()

    server = admin('server', 'create', '--nic', 'none', '--image', image['id'], '--flavor',
                   FLAVOR, '--availability-zone', 'nova:%s' % second_host, 'e2e-first-boot')
    try:
        wait_for_status('aio-admin', server['id'], 'ACTIVE')
        on_its_mount(second_host, server['id'])
        wait_for_ready('aio-admin', server['id'])

        # Complete, the fill is renamed to the base file and its boot image installed.
        wait_until('base file %s filled' % name, 600,
                   lambda: 'Installed verified boot image' in logged(compute_log))
    finally:
        delete_server('aio-admin', server['id'])
    # The disk was made over the base file as yolofs served it from the boot image, before the
    # download: the fill's registration, and its end, compared with the boot image.
    assert '%s%s: serving a fill' % (name, first_boot.FILL_SUFFIX) in logged(yolofs_log)
    compute = logged(compute_log)
    assert 'Filled base file %s' % name in compute
    # Nothing on the way to the guest's start waited for the fill (a spawn step that rebased
    # the disk onto _base did, and the first boot then took as long as Nova's).
    assert 'Waiting for base file %s to be filled' % name not in compute
    assert 'ALARM' not in compute
    # The base file holds the image's disk as Nova's download and conversion make it (qemu-img
    # compares them byte for byte), and the boot image is the host's own, verified against it.
    subprocess.run(['qemu-img', 'compare', '-f', 'raw', '-F', 'qcow2', base, tiny_image],
                   check=True)
    assert not [entry for entry in os.listdir(base.parent)
                if entry.endswith(first_boot.FILL_SUFFIX)]
