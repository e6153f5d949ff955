"""A running guest reads its whole disk, from inside, and its files are compared with the
source image's: the check that a guest no longer depends on yolofs (tests of the detach).

The guest's commands run through the QEMU guest agent (``yolo_testing.guest_agent``); the source's
files are read on the host from a read-only loop mount of the image's root partition.
"""

import re
import struct
import subprocess
import tempfile

from yolo_common import images
from yolo_testing import guest_agent

# What a failed read looks like in a Linux guest's kernel log.
GUEST_IO_ERROR = re.compile(
    rb'[^\n]*(?:I/O error|blk_update_request|critical medium error|EXT4-fs error'
    rb'|Remounting filesystem read-only)[^\n]*')
# One digest of every file under usr and boot of a root file system (the guest writes elsewhere:
# logs, state), in a fixed order. Run as root by the host and by the guest.
TREE_DIGEST = ('export LC_ALL=C; cd %s && find usr boot -xdev -type f -print0 | sort -z'
               ' | xargs -0 sha256sum | sha256sum')


def first_partition_offset(raw):
    """Byte offset of the first partition of an MBR disk (loop devices here get no partition
    nodes: the partition is attached by its offset)."""
    with open(raw, 'rb') as disk:
        mbr = disk.read(512)
    assert mbr[510:512] == b'\x55\xaa', '%s has no MBR' % raw
    (first_sector,) = struct.unpack_from('<I', mbr, 446 + 8)
    return first_sector * 512


def source_tree_digest(image):
    """TREE_DIGEST of the root file system of ``image`` (any format qemu-img reads)."""
    with tempfile.TemporaryDirectory(prefix='yolo-tree-', dir='/var/tmp') as work:
        raw = work + '/disk.raw'
        images.convert_to_raw(image, raw)
        root = work + '/root'
        subprocess.run(['mkdir', root], check=True)
        # noload: no journal replay, nothing written to the image.
        subprocess.run(['mount', '-o', 'ro,noload,loop,offset=%d' % first_partition_offset(raw),
                        raw, root], check=True)
        try:
            return _digest(subprocess.run(['sh', '-c', TREE_DIGEST % root], check=True,
                                          capture_output=True, text=True))
        finally:
            subprocess.run(['umount', root], check=True)


def _digest(completed):
    assert completed.stderr == '', completed.stderr
    return completed.stdout.split()[0]


def check_guest_reads_its_disk(domain, source_digest, device='/dev/vda'):
    """Inside the guest (a libvirt domain): the page cache dropped, every block of ``device``
    read (O_DIRECT) and the files compared with the source; no I/O error in its kernel log."""
    guest_agent.shell(domain, 'sync; echo 3 > /proc/sys/vm/drop_caches')
    guest_agent.shell(domain, 'dd if=%s of=/dev/null bs=4M iflag=direct' % device, timeout=1800)
    assert _digest(guest_agent.shell(domain, TREE_DIGEST % '/', timeout=1800)) == source_digest
    kernel_log = guest_agent.run(domain, ['dmesg']).check().stdout.encode()
    assert GUEST_IO_ERROR.findall(kernel_log) == []
