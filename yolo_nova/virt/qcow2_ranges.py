"""A qcow2 image's virtual disk read by ranges of its file, for the reads a first boot waits for
while the image is downloaded and converted (docs/first-boot.md, "Ranges of qcow2 images").

A cluster of a qcow2 image is found without its whole file: the header (the first bytes), then
the L1 table, then the L2 table of the cluster, then the cluster itself (inflated if
compressed), each a single range request. The image is a tenant's, untrusted: every offset is
checked against the file's size, every table against its limits, an inflated cluster must be
exactly one cluster; the variants this reader does not follow the way qemu-img does (a backing
file, encryption, an external data file, extended L2 entries, zstd compression, a corrupt image,
unknown features) are refused, and their reads wait for the conversion. Whatever it serves is
compared with Nova's converted data before the base file is complete (``Fill``): a reader that
disagreed with qemu-img would fail the fill, never leave a wrong base file.
"""

import collections
import struct
import zlib

MAGIC = b'QFI\xfb'
HEADER_BYTES = 4096
# version, backing file offset, its size, cluster bits, virtual size, encryption, L1 entries,
# L1 offset (struct at offset 4; refcounts and snapshots are not needed to read).
HEADER = struct.Struct('>IQIIQIIQ')
# Version 3: incompatible, compatible and autoclear features, refcount order, header length.
HEADER_V3 = struct.Struct('>QQQII')
HEADER_V3_OFFSET = 72
COMPRESSION_TYPE_OFFSET = 104
INCOMPATIBLE_DIRTY = 1 << 0       # refcounts may leak: the tables to read are sound
INCOMPATIBLE_COMPRESSION_TYPE = 1 << 3
MAX_L1_BYTES = 32 << 20           # qemu's own limit
OFFSET_MASK = 0x00fffffffffffe00
L2_COMPRESSED = 1 << 62
L2_ZERO = 1 << 0                  # version 3
SECTOR = 512
L2_CACHE_TABLES = 32
# Host ranges closer than this are fetched in one request (compressed clusters are packed).
MERGE_GAP = 64 << 10


class Unsupported(Exception):
    """The image is not one whose clusters this reader finds as qemu-img does."""


class Qcow2Data:
    """The virtual disk of the qcow2 image whose file ``source.read(offset, length)`` reads
    (a ``first_boot.GlanceData``), ``file_size`` bytes long. ``read`` raises
    :class:`Unsupported` for an image it refuses (the header is read at the first read)."""

    def __init__(self, source, file_size):
        self.source = source
        self.file_size = file_size
        self._l1 = None             # read with the header, at the first read
        self._l2_tables = collections.OrderedDict()

    def read(self, offset, length):
        """Exactly ``length`` bytes of the virtual disk at ``offset``."""
        self._read_header()
        if offset < 0 or length < 0 or offset + length > self.virtual_size:
            raise Unsupported('a read of %d bytes at %d is outside the disk' % (length, offset))
        first = offset // self.cluster_size
        last = (offset + length - 1) // self.cluster_size if length else first - 1
        clusters = self._inflate(self._fetch([self._locate(i) for i in range(first, last + 1)]))
        skip = offset - first * self.cluster_size
        return b''.join(clusters)[skip:skip + length]

    def _read_header(self):
        if self._l1 is not None:
            return
        head = self.source.read(0, min(HEADER_BYTES, self.file_size))
        if head[:4] != MAGIC or len(head) < HEADER_V3_OFFSET:
            raise Unsupported('not a qcow2 image')
        (version, backing_offset, _, cluster_bits, virtual_size, encryption, l1_entries,
         l1_offset) = HEADER.unpack_from(head, 4)
        if version not in (2, 3):
            raise Unsupported('qcow2 version %d' % version)
        if backing_offset:
            raise Unsupported('a backing file')
        if encryption:
            raise Unsupported('encrypted')
        if not 9 <= cluster_bits <= 21:
            raise Unsupported('clusters of 2^%d bytes' % cluster_bits)
        self.version = version
        if version == 3:
            incompatible, _, _, _, header_length = HEADER_V3.unpack_from(head, HEADER_V3_OFFSET)
            if incompatible & INCOMPATIBLE_COMPRESSION_TYPE:
                if header_length <= COMPRESSION_TYPE_OFFSET or head[COMPRESSION_TYPE_OFFSET]:
                    raise Unsupported('compression other than zlib')
                incompatible &= ~INCOMPATIBLE_COMPRESSION_TYPE
            if incompatible & ~INCOMPATIBLE_DIRTY:
                # Corrupt, an external data file, extended L2 entries, or unknown to this reader.
                raise Unsupported('incompatible features %#x' % incompatible)
        self.cluster_size = 1 << cluster_bits
        self.virtual_size = virtual_size
        self._l2_entries = self.cluster_size // 8
        # Compressed clusters: their offset in the low bits, additional sectors above it.
        self._csize_shift = 62 - (cluster_bits - 8)
        self._csize_mask = (1 << (cluster_bits - 8)) - 1
        needed = -(-virtual_size // (self.cluster_size * self._l2_entries))
        if not needed <= l1_entries <= MAX_L1_BYTES // 8:
            raise Unsupported('an L1 table of %d entries for %d bytes' % (l1_entries,
                                                                          virtual_size))
        # Only the entries the disk needs are read: a larger table's others map nothing.
        self._l1 = struct.unpack('>%dQ' % needed, self._file_range(l1_offset, needed * 8))

    def _file_range(self, offset, length):
        if offset < 0 or offset + length > self.file_size:
            raise Unsupported('%d bytes at %d are outside the image file' % (length, offset))
        return self.source.read(offset, length)

    def _l2_table(self, l1_index):
        table = self._l2_tables.get(l1_index)
        if table is None:
            l2_offset = self._l1[l1_index] & OFFSET_MASK
            if not l2_offset:
                return None
            if l2_offset % self.cluster_size:
                raise Unsupported('an L2 table at %d, not a cluster' % l2_offset)
            table = struct.unpack('>%dQ' % self._l2_entries,
                                  self._file_range(l2_offset, self.cluster_size))
            self._l2_tables[l1_index] = table
            if len(self._l2_tables) > L2_CACHE_TABLES:
                self._l2_tables.popitem(last=False)
        self._l2_tables.move_to_end(l1_index)
        return table

    def _locate(self, cluster):
        """Where cluster number ``cluster`` of the disk is: (host offset, length, compressed),
        or None for a cluster of zeros."""
        table = self._l2_table(cluster // self._l2_entries)
        entry = table[cluster % self._l2_entries] if table is not None else 0
        if entry & L2_COMPRESSED:
            offset = entry & ((1 << self._csize_shift) - 1)
            sectors = ((entry >> self._csize_shift) & self._csize_mask) + 1
            length = sectors * SECTOR - offset % SECTOR
            compressed = True
        elif self.version == 3 and entry & L2_ZERO:
            return None
        else:
            offset, length, compressed = entry & OFFSET_MASK, self.cluster_size, False
            if not offset:
                return None    # unallocated, and no backing file: zeros
            if offset % self.cluster_size:
                raise Unsupported('a cluster at %d, not cluster-aligned' % offset)
        if offset >= self.file_size:
            raise Unsupported('a cluster at %d, past the image file' % offset)
        # The file may end inside its last cluster (qemu reads the rest as zeros), and inside
        # the sectors a compressed cluster's descriptor names.
        return offset, min(length, self.file_size - offset), compressed

    def _fetch(self, places):
        """The bytes of each place (None for zeros), neighbours in the file fetched together."""
        groups = []      # [start, end, [indexes of places]]
        for index, place in enumerate(places):
            if place is None:
                continue
            start, end = place[0], place[0] + place[1]
            group = groups[-1] if groups else None
            if group is not None and group[0] <= start <= group[1] + MERGE_GAP:
                group[1] = max(group[1], end)
                group[2].append(index)
            else:
                groups.append([start, end, [index]])
        fetched = [None] * len(places)
        for start, end, indexes in groups:
            data = self._file_range(start, end - start)
            for index in indexes:
                offset, length, compressed = places[index]
                fetched[index] = (data[offset - start:offset - start + length], compressed)
        return fetched

    def _inflate(self, fetched):
        clusters = []
        for piece in fetched:
            if piece is None:
                clusters.append(bytes(self.cluster_size))
                continue
            data, compressed = piece
            if compressed:
                # qemu's zlib clusters: raw deflate, a 4 KiB window; the sectors described may
                # hold the next cluster's bytes after the end of the stream.
                try:
                    data = zlib.decompressobj(-12).decompress(data, self.cluster_size)
                except zlib.error as e:
                    raise Unsupported('a compressed cluster does not inflate: %s' % e)
                if len(data) != self.cluster_size:
                    raise Unsupported('a compressed cluster inflates to %d bytes' % len(data))
            clusters.append(data.ljust(self.cluster_size, b'\0'))
        return clusters
