"""The Glance worker's qemu-img conversions of the tiny test image (built as root by
tools/build-tiny-image.sh): a truncated upload, and the limits conversions run under. The
worker's other tests use small disks (test_worker.py)."""

import os
import struct
import subprocess

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
    reason = glance.images[source][glance_api.REASON]
    assert 'could not be converted to raw: qemu-img: ' in reason, reason
    assert '/work' not in reason      # no path of the worker's
    assert glance.downloads == 1  # not retried


def test_qemu_img_runs_within_its_limits(tmp_path, tiny_image):
    # The limits are really applied: an address space too small for qemu-img fails it.
    too_small = processutils.ProcessLimits(address_space=32 << 20)
    with pytest.raises(processutils.ProcessExecutionError):
        images.convert_to_raw(tiny_image, tmp_path / 'raw', fmt='qcow2', limits=too_small)
    assert worker_mod.QEMU_IMG_LIMITS['address_space'] == 1 << 30


def test_conversions_fit_well_within_the_limits(tmp_path, tiny_image):
    # Without images.CONVERT_ENVIRONMENT, about one conversion in eight failed to create a
    # thread under the worker's 1 GiB, and all of them under 320 MiB; with it and the worker's
    # stack limit, none failed down to 256 MiB. Half the worker's address space, to leave room
    # for a busy machine (more requests in flight, more threads).
    half = processutils.ProcessLimits(**{
        **worker_mod.QEMU_IMG_LIMITS,
        'address_space': worker_mod.QEMU_IMG_LIMITS['address_space'] // 2})
    for attempt in range(3):
        images.convert_to_raw(tiny_image, tmp_path / 'raw', fmt='qcow2', limits=half)
        (tmp_path / 'raw').unlink()


def amplifying_qcow2(path, virtual_size=256 << 20):
    """A qcow2 image of a few hundred KiB whose every cluster is the same 64 KiB of data (its
    one L2 table's entries all point at one data cluster): ``virtual_size`` bytes of data once
    converted, which the format inspectors pass."""
    cluster = 64 << 10
    subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', '-o', 'cluster_size=%d' % cluster,
                    path, str(virtual_size)], check=True)
    subprocess.run(['qemu-io', '-f', 'qcow2', '-c', 'write -q -P 0x5a 0 64k', path], check=True)
    with open(path, 'r+b') as f:
        f.seek(40)
        l1_offset, = struct.unpack('>Q', f.read(8))
        f.seek(l1_offset)
        l2_offset = struct.unpack('>Q', f.read(8))[0] & 0x00fffffffffffe00
        f.seek(l2_offset)
        entry = f.read(8)
        f.seek(l2_offset)
        f.write(entry * (virtual_size // cluster))
    return path


def test_an_upload_that_converts_to_more_than_the_limit_is_skipped(
        glance, make_worker, tmp_path):
    upload = amplifying_qcow2(tmp_path / 'amplifying.qcow2')
    assert upload.stat().st_size < 1 << 20
    # The inspectors pass it, and it is what it claims: 256 MiB of data.
    images.convert_to_raw(upload, tmp_path / 'raw', fmt='qcow2')
    assert os.stat(tmp_path / 'raw').st_blocks * 512 >= 255 << 20
    (tmp_path / 'raw').unlink()
    source = glance.add(upload.read_bytes(), disk_format='qcow2')
    assert make_worker(max_virtual_size=128 << 20).build(source) == 'skipped'
    reason = glance.images[source][glance_api.REASON]
    assert 'virtual size, 0.2 GiB, is over the 0.1 GiB' in reason, reason
    assert not (tmp_path / 'work' / source).exists()


def test_an_upload_the_scratch_space_cannot_hold_is_not_converted(
        glance, make_worker, tmp_path):
    """Fault injection: the worker's scratch space on a 64 MiB tmpfs."""
    work = tmp_path / 'work'
    work.mkdir()
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64m', 'tmpfs', work], check=True)
    try:
        source = glance.add(amplifying_qcow2(tmp_path / 'amplifying.qcow2').read_bytes(),
                            disk_format='qcow2')
        assert make_worker(retries=0).build(source) == 'failed'
        reason = glance.images[source][glance_api.REASON]
        assert "the worker's scratch space has 0.1 GiB free" in reason, reason
        assert list(work.iterdir()) == []
    finally:
        subprocess.run(['umount', work], check=True)


def test_qemu_img_writes_no_file_past_the_virtual_size(tmp_path):
    upload = amplifying_qcow2(tmp_path / 'amplifying.qcow2')
    with pytest.raises(processutils.ProcessExecutionError):
        images.convert_to_raw(upload, tmp_path / 'raw', fmt='qcow2',
                              limits=processutils.ProcessLimits(file_size=128 << 20))
