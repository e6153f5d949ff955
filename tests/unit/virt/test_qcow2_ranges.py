"""The qcow2 reader of first boots (yolo_nova/virt/qcow2_ranges.py) against images qemu-img
made, byte for byte with qemu-img's own conversion, and against the variants it must refuse."""

import random
import struct
import subprocess

import pytest

from yolo_nova.virt import qcow2_ranges

SIZE = 6 << 20


class FileSource:
    """An image file read by ranges, as Glance's download serves them; counts the requests."""

    def __init__(self, path):
        self.data = path.read_bytes()
        self.requests = 0

    def read(self, offset, length):
        self.requests += 1
        assert 0 <= offset and offset + length <= len(self.data)
        return self.data[offset:offset + length]


def qemu_img(*args):
    subprocess.run(('qemu-img',) + args, check=True, capture_output=True)


@pytest.fixture
def raw(tmp_path):
    """Random data, compressible text, and zeros, as a disk has them."""
    rng = random.Random(5)
    content = bytearray(SIZE)
    content[0:1 << 20] = rng.randbytes(1 << 20)
    content[(2 << 20) + 4096:(3 << 20)] = (b'root file system metadata\n' * 50000)[
        :(1 << 20) - 4096]
    content[SIZE - 70000:SIZE - 1000] = rng.randbytes(69000)
    path = tmp_path / 'disk.raw'
    path.write_bytes(bytes(content))
    return path


def convert(raw, tmp_path, *options):
    path = tmp_path / 'disk.qcow2'
    qemu_img('convert', '-f', 'raw', '-O', 'qcow2', *options, str(raw), str(path))
    return path


def reads():
    rng = random.Random(7)
    edges = [(0, 512), (0, SIZE), (SIZE - 1, 1), ((1 << 20) - 100, 200), (2 << 20, 1 << 20)]
    return edges + [(o, rng.randrange(1, min(3 << 20, SIZE - o) + 1))
                    for o in (rng.randrange(SIZE) for _ in range(40))]


@pytest.mark.parametrize('options', [
    (),
    ('-c',),                                   # the test image's: every cluster compressed
    ('-o', 'compat=0.10'),                     # version 2
    ('-c', '-o', 'cluster_size=4096'),
    ('-o', 'cluster_size=2M'),
    ('-c', '-o', 'cluster_size=512'),
], ids=['plain', 'compressed', 'v2', 'compressed-4k', '2M-clusters', 'compressed-512'])
def test_reads_equal_qemu_imgs_conversion(raw, tmp_path, options):
    disk = convert(raw, tmp_path, *options)
    reader = qcow2_ranges.Qcow2Data(FileSource(disk), disk.stat().st_size)
    content = raw.read_bytes()
    for offset, length in reads():
        assert reader.read(offset, length) == content[offset:offset + length], (offset, length)
    assert reader.virtual_size == SIZE


def test_zero_clusters_and_rewritten_clusters_read_as_qemu_reads_them(raw, tmp_path):
    disk = convert(raw, tmp_path, '-c')
    # Zero clusters (the L2 flag), and a compressed cluster rewritten in place, uncompressed.
    subprocess.run(['qemu-io', '-f', 'qcow2', '-c', 'write -z 65536 131072',
                    '-c', 'write -P 0x5a 300000 4096', str(disk)], check=True,
                   capture_output=True)
    qemu_img('convert', '-f', 'qcow2', '-O', 'raw', str(disk), str(tmp_path / 'back.raw'))
    content = (tmp_path / 'back.raw').read_bytes()
    assert content[65536:196608] == bytes(131072)
    reader = qcow2_ranges.Qcow2Data(FileSource(disk), disk.stat().st_size)
    for offset, length in reads():
        assert reader.read(offset, length) == content[offset:offset + length], (offset, length)


def test_a_read_takes_few_requests(raw, tmp_path):
    disk = convert(raw, tmp_path, '-c')
    source = FileSource(disk)
    reader = qcow2_ranges.Qcow2Data(source, disk.stat().st_size)
    reader.read(0, 4096)
    assert source.requests == 4     # header, L1, L2, cluster
    # A whole MiB of compressed clusters, packed in the file: one request more.
    reader.read(0, 1 << 20)
    assert source.requests == 5


@pytest.mark.parametrize('options, refused', [
    (('-o', 'extended_l2=on'), 'incompatible features'),
    (('-o', 'compression_type=zstd'), 'compression other than zlib'),
])
def test_variants_read_otherwise_are_refused(raw, tmp_path, options, refused):
    disk = convert(raw, tmp_path, *options)
    reader = qcow2_ranges.Qcow2Data(FileSource(disk), disk.stat().st_size)
    with pytest.raises(qcow2_ranges.Unsupported, match=refused):
        reader.read(0, 4096)


def test_backing_files_external_data_and_other_formats_are_refused(raw, tmp_path):
    overlay = tmp_path / 'overlay.qcow2'
    qemu_img('create', '-f', 'qcow2', '-b', str(raw), '-F', 'raw', str(overlay))
    data_file = tmp_path / 'external.qcow2'
    qemu_img('create', '-f', 'qcow2', '-o', 'data_file=%s' % (tmp_path / 'data'),
             str(data_file), '1M')
    for path, refused in ((overlay, 'a backing file'), (data_file, 'incompatible features'),
                          (raw, 'not a qcow2 image')):
        reader = qcow2_ranges.Qcow2Data(FileSource(path), path.stat().st_size)
        with pytest.raises(qcow2_ranges.Unsupported, match=refused):
            reader.read(0, 512)


def l2_entry_offset(path):
    """Where the first L2 entry of a plain qcow2 file is."""
    head = path.read_bytes()[:4096]
    l1_offset = struct.unpack_from('>Q', head, 40)[0]
    l1_entry = struct.unpack_from('>Q', path.read_bytes(), l1_offset)[0]
    return l1_entry & qcow2_ranges.OFFSET_MASK


@pytest.mark.parametrize('entry, refused', [
    (1 << 63 | (1 << 40), 'past the image file'),
    (1 << 63 | 4096 * 3 + 512, 'not cluster-aligned'),
    (1 << 62 | 65536 * 2, 'does not inflate'),
], ids=['past-the-file', 'unaligned', 'garbage-compressed'])
def test_hostile_tables_are_refused(raw, tmp_path, entry, refused):
    disk = convert(raw, tmp_path)
    data = bytearray(disk.read_bytes())
    struct.pack_into('>Q', data, l2_entry_offset(disk), entry)
    disk.write_bytes(bytes(data))
    reader = qcow2_ranges.Qcow2Data(FileSource(disk), disk.stat().st_size)
    with pytest.raises(qcow2_ranges.Unsupported, match=refused):
        reader.read(0, 512)


def test_reads_outside_the_disk_and_huge_tables_are_refused(raw, tmp_path):
    disk = convert(raw, tmp_path)
    reader = qcow2_ranges.Qcow2Data(FileSource(disk), disk.stat().st_size)
    with pytest.raises(qcow2_ranges.Unsupported, match='outside the disk'):
        reader.read(SIZE - 10, 11)
    data = bytearray(disk.read_bytes())
    struct.pack_into('>I', data, 36, 1 << 30)     # L1 entries
    disk.write_bytes(bytes(data))
    reader = qcow2_ranges.Qcow2Data(FileSource(disk), disk.stat().st_size)
    with pytest.raises(qcow2_ranges.Unsupported, match='L1 table'):
        reader.read(0, 512)
