"""The Glance worker's qemu-img conversions of the tiny test image (built as root by
tools/build-tiny-image.sh): a truncated upload, and the limits conversions run under. The
worker's other tests use small disks (test_worker.py)."""

from oslo_concurrency import processutils
import pytest

from yolo_common import images
from yolo_glance import glance as glance_api
from yolo_glance import worker as worker_mod


def test_truncated_qcow2_fails_with_a_reason(glance, make_worker, tiny_image):
    # The test image cut in half: still qcow2 to every inspector, but qemu-img cannot read it.
    data = tiny_image.read_bytes()
    source = glance.add(data[:len(data) // 2], disk_format='qcow2')
    assert make_worker().build(source) == 'failed'
    assert 'could not be converted to raw' in glance.images[source][glance_api.REASON]
    assert glance.downloads == 1  # not retried


def test_qemu_img_runs_within_its_limits(tmp_path, tiny_image):
    # The limits are really applied: an address space too small for qemu-img fails it.
    too_small = processutils.ProcessLimits(address_space=32 << 20)
    with pytest.raises(processutils.ProcessExecutionError):
        images.convert_to_raw(tiny_image, tmp_path / 'raw', fmt='qcow2', limits=too_small)
    assert worker_mod.QEMU_IMG_LIMITS.address_space == 1 << 30


def test_conversions_fit_well_within_the_limits(tmp_path, tiny_image):
    # Without images.CONVERT_ENVIRONMENT, about one conversion in eight failed to create a
    # thread under the worker's 1 GiB, and all of them under 320 MiB; with it and the worker's
    # stack limit, none failed down to 256 MiB. Half the worker's address space, to leave room
    # for a busy machine (more requests in flight, more threads).
    half = processutils.ProcessLimits(**{
        **worker_mod.QEMU_IMG_LIMITS.__dict__,
        'address_space': worker_mod.QEMU_IMG_LIMITS.address_space // 2})
    for attempt in range(3):
        images.convert_to_raw(tiny_image, tmp_path / 'raw', fmt='qcow2', limits=half)
        (tmp_path / 'raw').unlink()
