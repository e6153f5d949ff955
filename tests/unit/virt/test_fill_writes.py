"""A fill writes the image's data but leaves its 4 KiB blocks of zeros as holes, as Nova's
conversion does (qemu-img skips them), and runs behind the guests for the CPU."""

import hashlib
import os
import subprocess
import threading

import pytest

from yolo_common import images
from yolo_nova.virt import first_boot

BLOCK = first_boot.SPARSE_BLOCK
CHUNK = 64 * BLOCK


def data_with_zero_blocks(*zero_blocks, length=CHUNK):
    data = bytearray(os.urandom(length))
    for block in zero_blocks:
        data[block * BLOCK:(block + 1) * BLOCK] = bytes(BLOCK)
    return bytes(data)


def allocated_blocks(path):
    """The 4 KiB blocks of ``path`` that hold data (SEEK_DATA/SEEK_HOLE)."""
    blocks = set()
    with open(path, 'rb') as f:
        fd, size, offset = f.fileno(), os.fstat(f.fileno()).st_size, 0
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:   # ENXIO: only a hole is left
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            blocks.update(range(start // BLOCK, -(-end // BLOCK)))
            offset = end
    return blocks


@pytest.mark.parametrize('chunk, zero_blocks', [
    (data_with_zero_blocks(), ()),
    (data_with_zero_blocks(0, 5, 6, 63), (0, 5, 6, 63)),
    (bytes(CHUNK), tuple(range(64))),
    # A block of zeros that does not start on a block boundary is data.
    (os.urandom(100) + bytes(BLOCK) + os.urandom(CHUNK - BLOCK - 100), ()),
    # A short last block of zeros is a hole too; a short one of data is written.
    (data_with_zero_blocks(length=CHUNK - 100) + bytes(100), (64,)),
    (data_with_zero_blocks(3, length=CHUNK + 100), (3,)),
], ids=['data', 'some zero blocks', 'zeros', 'unaligned zeros', 'zero tail', 'data tail'])
def test_blocks_of_zeros_stay_holes_and_the_rest_is_written(tmp_path, chunk, zero_blocks):
    path = tmp_path / 'fill'
    offset = 2 * CHUNK
    with open(path, 'wb') as f:
        f.truncate(offset + len(chunk) + CHUNK)
        first_boot.write_data(f.fileno(), memoryview(chunk), offset)
    with open(path, 'rb') as f:
        f.seek(offset)
        assert f.read(len(chunk)) == chunk
    written = {offset // BLOCK + b for b in range(-(-len(chunk) // BLOCK))} \
        - {offset // BLOCK + b for b in zero_blocks}
    assert allocated_blocks(path) == written


def test_the_fill_runs_behind_the_guests_for_the_cpu():
    seen = {}

    def fill():
        thread = threading.get_native_id()
        seen['lowered'] = first_boot.in_background()
        seen['niceness'] = os.getpriority(os.PRIO_PROCESS, thread)
        # What the fill starts (Nova's qemu-img convert) inherits it.
        seen['child'] = int(subprocess.run(['nice'], capture_output=True, text=True,
                                           check=True).stdout)
    worker = threading.Thread(target=fill)
    worker.start()
    worker.join()
    assert seen == {'lowered': True, 'niceness': first_boot.FILL_NICENESS,
                    'child': first_boot.FILL_NICENESS}
    # On the main thread (nova-compute's only one under eventlet) it changes nothing.
    before = os.getpriority(os.PRIO_PROCESS, 0)
    assert first_boot.in_background() is False
    assert os.getpriority(os.PRIO_PROCESS, 0) == before


def test_a_write_the_kernel_takes_short_is_carried_on(tmp_path, monkeypatch):
    """os.pwrite may write less than asked (a disk filling up): the rest is written, or the
    error that stopped it is raised."""
    real_pwrite = os.pwrite
    calls = []

    def short_pwrite(fd, data, offset):
        calls.append(len(data))
        if len(calls) == 1:
            return real_pwrite(fd, bytes(data)[:1000], offset)
        if len(calls) == 2:
            raise OSError(28, 'No space left on device')
        return real_pwrite(fd, data, offset)
    monkeypatch.setattr(first_boot.os, 'pwrite', short_pwrite)
    chunk = os.urandom(CHUNK)
    path = tmp_path / 'fill'
    with open(path, 'wb') as f:
        with pytest.raises(OSError, match='No space left'):
            first_boot.write_data(f.fileno(), chunk, 0)
        # Every write short: 4 KiB at a time.
        calls.clear()
        monkeypatch.setattr(first_boot.os, 'pwrite', lambda fd, data, offset: (
            calls.append(len(data)) or real_pwrite(fd, bytes(data)[:4096], offset)))
        first_boot.write_data(f.fileno(), chunk, 0)
    assert path.read_bytes() == chunk and len(calls) == CHUNK // 4096


def test_a_write_that_writes_nothing_fails():
    read, write = os.pipe()
    os.close(read)
    with pytest.raises(OSError):
        first_boot.pwrite_all(write, b'data', 0)
    os.close(write)


def test_the_file_digest_reads_holes_as_zeros(tmp_path):
    path = tmp_path / 'sparse'
    data = os.urandom(5000)
    with open(path, 'wb') as f:
        f.truncate(3 * first_boot.CHUNK_BYTES)
        f.seek(first_boot.CHUNK_BYTES + 7)
        f.write(data)
    expected = bytearray(3 * first_boot.CHUNK_BYTES)
    expected[first_boot.CHUNK_BYTES + 7:first_boot.CHUNK_BYTES + 7 + len(data)] = data
    fd = os.open(path, os.O_RDONLY)
    try:
        assert images.file_digest(fd, 'sha512') == hashlib.sha512(expected).hexdigest()
    finally:
        os.close(fd)
