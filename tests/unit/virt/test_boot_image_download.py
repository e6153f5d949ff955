"""A boot image's download from Glance is bounded: a stalled or crawling stream ends it."""

import time
from unittest import mock

import pytest

from yolo_nova.virt import boot_images


def service_glance(chunks):
    glance = boot_images.ServiceGlance.__new__(boot_images.ServiceGlance)
    glance.client = mock.Mock()
    glance.client.images.data.return_value = chunks
    return glance


def test_a_download_is_written_whole(tmp_path):
    service_glance([b'ab', b'cd']).download(None, 'id', tmp_path / 'out')
    assert (tmp_path / 'out').read_bytes() == b'abcd'


def test_a_download_that_takes_too_long_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(boot_images, 'DOWNLOAD_SECONDS', 0.05)

    def crawling():
        for _ in range(100):
            time.sleep(0.01)
            yield b'x'
    with pytest.raises(TimeoutError, match='not downloaded within'):
        service_glance(crawling()).download(None, 'id', tmp_path / 'out')


def test_glance_is_found_by_its_public_endpoint_alone(monkeypatch):
    # devstack's catalogue lists Glance's public endpoint only; Nova's [glance] valid_interfaces
    # (internal, public by default) is tried in order, as Nova's own image API does.
    from keystoneauth1 import access
    from keystoneauth1 import fixture
    from keystoneauth1.identity import access as access_plugin
    from keystoneauth1 import loading as ks_loading
    import nova.conf

    token = fixture.V3Token()
    token.add_service('image').add_endpoint('public', 'http://glance.example:9292',
                                            region='RegionOne')
    auth = access_plugin.AccessInfoPlugin(access.create(body=token))
    monkeypatch.setattr(ks_loading, 'load_auth_from_conf_options', lambda conf, group: auth)
    glance = boot_images.ServiceGlance(nova.conf.CONF)
    assert glance.client.http_client.get_endpoint() == 'http://glance.example:9292'
