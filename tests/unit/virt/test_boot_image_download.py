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
