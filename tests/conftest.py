"""Fixtures shared by YOLO's tests: the yolofs binary, the bootable test images, mounts.

Nova's test environment is loaded only where Nova's tests are (tests/nova_env.py).
"""

import importlib.abc
import os
import pathlib
import subprocess
import sys
import uuid

import pytest

from yolo_common import yolofs

try:
    from oslo_service import backend as oslo_service_backend
except ImportError:
    # The kernel matrix's guests (tools/kernel-matrix) run tests/yolofs alone, without
    # OpenStack's libraries: nothing there imports eventlet either.
    oslo_service_backend = None

REPO = pathlib.Path(__file__).resolve().parent.parent
# The checkout's build (tools/build-yolofs.sh), unless the caller names another yolofs.
if (REPO / 'yolofs' / 'target' / 'release' / 'yolofs').exists():
    os.environ.setdefault('YOLOFS_BIN', str(REPO / 'yolofs' / 'target' / 'release' / 'yolofs'))


class NoEventlet(importlib.abc.MetaPathFinder):
    """Refuses to import eventlet, as Nova's native-threads test environment does."""

    def find_spec(self, fullname, path, target=None):
        if fullname.partition('.')[0] == 'eventlet':
            raise ImportError('the tests run on native threads, without eventlet')


# Every test process runs on native threads, as Nova's test environment sets them up: Nova's
# refuses to load once eventlet is imported, and oslo.messaging imports it (through oslo.service's
# default backend) whenever it can. So tests collected before Nova's, the Glance worker's say,
# must not import it either.
sys.meta_path.insert(0, NoEventlet())
if oslo_service_backend:
    oslo_service_backend.init_backend(oslo_service_backend.BackendType.THREADING)


@pytest.fixture(scope='session')
def yolofs_bin():
    # Fails loudly (YolofsError) rather than skipping: tests/run builds it first.
    return yolofs.binary()


def built_image(variable, builder):
    """The image named by environment ``variable`` (tools/run-tests builds them meanwhile), or
    the one ``builder`` (a script in tools/, cached) builds now."""
    path = os.environ.get(variable)
    if not path:
        build = subprocess.run([str(REPO / 'tools' / builder)], capture_output=True, text=True)
        if build.returncode != 0:
            pytest.fail('tools/%s failed (exit %d):\n%s'
                        % (builder, build.returncode, build.stderr[-4000:]))
        path = build.stdout.strip().splitlines()[-1]
    assert pathlib.Path(path).is_file(), path
    return pathlib.Path(path)


@pytest.fixture(scope='session')
def tiny_image():
    """The tiny bootable qcow2 (Debian's kernel, busybox), ready in seconds under TCG: for tests
    of a Nova, Glance or driver path (tools/build-tiny-image.sh)."""
    return built_image('YOLO_TINY_IMAGE', 'build-tiny-image.sh')


@pytest.fixture(scope='session')
def debian_image():
    """The bootable Debian 12 qcow2, for tests that need a real distribution's boot: commands
    in the guest through its agent, boot times to learn from (tools/build-test-image.sh)."""
    return built_image('YOLO_TEST_IMAGE', 'build-test-image.sh')


@pytest.fixture(scope='session')
def debian_image_tree_digest(debian_image):
    """The digest of the Debian image's files (tests.guest_disk.TREE_DIGEST)."""
    from tests import guest_disk
    return guest_disk.source_tree_digest(debian_image)


@pytest.fixture(scope='session')
def image_cache(tmp_path_factory, tiny_image):
    """An image cache directory holding the tiny image as Nova stores it: ``_base/<sha1>``, raw."""
    from yolo_common import images
    instances = tmp_path_factory.mktemp('instances')
    base_dir = instances / '_base'
    base_dir.mkdir()
    image_id = str(uuid.uuid5(uuid.NAMESPACE_URL, 'yolo-test-image'))
    base = base_dir / images.base_file_name(image_id)
    images.convert_to_raw(tiny_image, base)
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


# In the kernel matrix (tools/kernel-matrix/guest-run sets YOLO_KERNEL_MATRIX) a skip fails the
# run: where a kernel lacks a feature, the tests assert the documented fallback. The one skip
# allowed is the NFS test's, outside the NFS lane.
MATRIX_ALLOWED_SKIPS = ('needs _base on NFS',)
matrix_skips = []


def pytest_runtest_logreport(report):
    if report.skipped and os.environ.get('YOLO_KERNEL_MATRIX'):
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple)
                     else report.longrepr)
        if not any(allowed in reason for allowed in MATRIX_ALLOWED_SKIPS):
            matrix_skips.append('%s: %s' % (report.nodeid, reason))


def pytest_sessionfinish(session, exitstatus):
    if matrix_skips:
        print('\nkernel matrix: skipped, which fails the matrix:\n  ' + '\n  '.join(matrix_skips))
        session.exitstatus = 1
