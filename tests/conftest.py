"""Fixtures shared by YOLO's tests: the yolofs binary, the bootable test image, mounts."""

import os
import pathlib

import subprocess
import uuid

import pytest

from yolo_common import images
from yolo_common import yolofs

REPO = pathlib.Path(__file__).resolve().parent.parent

# Nova 34 runs on native threads; its test fixtures must not patch eventlet in. Importing
# nova.tests.unit first (as Nova's own test discovery does) selects that backend before anything
# else can import eventlet.
os.environ.setdefault('OS_NOVA_DISABLE_EVENTLET_PATCHING', '1')
import nova.tests.unit  # noqa: E402,F401,I100


@pytest.fixture(scope='session')
def yolofs_bin():
    # Fails loudly (YolofsError) rather than skipping: tests/run builds it first.
    return yolofs.binary()


@pytest.fixture(scope='session')
def test_image():
    """The bootable Debian 12 qcow2 built (and cached) by tools/build-test-image.sh."""
    path = os.environ.get('YOLO_TEST_IMAGE')
    if not path:
        path = subprocess.run([str(REPO / 'tools' / 'build-test-image.sh')],
                              check=True, capture_output=True,
                              text=True).stdout.strip().splitlines()[-1]
    assert pathlib.Path(path).is_file(), path
    return pathlib.Path(path)


@pytest.fixture(scope='session')
def image_cache(tmp_path_factory, test_image):
    """An image cache directory holding the test image as Nova stores it: ``_base/<sha1>``, raw."""
    instances = tmp_path_factory.mktemp('instances')
    base_dir = instances / '_base'
    base_dir.mkdir()
    image_id = str(uuid.uuid5(uuid.NAMESPACE_URL, 'yolo-test-image'))
    base = base_dir / images.base_file_name(image_id)
    images.convert_to_raw(test_image, base)
    return base


@pytest.fixture
def mount_factory(tmp_path):
    """Starts yolofs mounts of a source directory; all are stopped at teardown."""
    mounts = []

    def start(source, **options):
        n = len(mounts)
        mount = yolofs.Mount(
            source=source,
            mountpoint=tmp_path / ('mnt%d' % n),
            boot_images=options.pop('boot_images', tmp_path / 'boot-images'),
            control_socket=tmp_path / ('control%d.sock' % n),
            log_path=tmp_path / ('yolofs%d.log' % n),
            **options)
        mounts.append(mount)
        return mount.start()

    yield start
    for mount in mounts:
        mount.stop()
