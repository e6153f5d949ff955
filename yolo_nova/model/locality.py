"""What a host holds of the catalogue, in a report whose size is bounded: a Bloom filter.

A host holds base files (Nova's ``_base``, named after their image) and boot images. It reports
them to every scheduler through its compute node's ``stats``, which Nova stores per compute node
and reads at every refresh: a list of image ids grows with the catalogue (500 images on each of
1,000 hosts: 18 MB per refresh), a Bloom filter does not. The filter answers "maybe held" for
every entry added and, for an entry not added, with the false-positive rate of
:func:`false_positive_rate`. A false positive only makes the scheduler expect a host to hold an
image it lacks: that host's weight is too high, and its boot then downloads the image as any
other would (docs/scheduling.md, "What hosts hold").

No Bloom filter library is in OpenStack's global requirements, and the format must be the same
on every host and scheduler whatever their versions: it is this module's, stated here.

Format: ``bloom1:K:BITS``, with ``K`` hash functions and ``BITS`` the filter's bits in
base64, a power of two of them (m); an entry's K bit positions are its SHA-256's first K 16-bit
little-endian words, modulo m. Independent positions keep the false-positive rate the formula's
at every size (double hashing, ``h1 + i h2``, had 7 times it in a filter of 2,048 bits).
"""

import base64
import binascii
import functools
import hashlib
import math
import struct

VERSION = 'bloom1'
# 4 KiB of bits at most (5,464 characters in base64), whatever the catalogue; 16 bits per entry
# below that (a false-positive rate under 0.05%). A position is 16 bits of the entry's SHA-256:
# at most 65,536 bits and 16 hashes.
MAX_BITS = 32768
MIN_BITS = 512
BITS_PER_ENTRY = 16
MAX_HASHES = 16


def base_file_entry(name):
    """The entry of a base file, by its name in ``_base``."""
    return 'base:' + name


def boot_image_entry(image_id):
    """The entry of an image's boot image, by the image's id."""
    return 'boot:' + image_id


@functools.lru_cache(maxsize=1024)
def base_file_name(image_id):
    """The name Nova's image cache gives the base file of an image (nova.virt.imagecache)."""
    return hashlib.sha1(image_id.encode()).hexdigest()


class BloomFilter:
    """A Bloom filter of ``bits`` bits (a multiple of 8) and ``hashes`` hash functions."""

    def __init__(self, bits, hashes, data=None):
        if not 8 <= bits <= 1 << 16 or bits & (bits - 1) or not 1 <= hashes <= MAX_HASHES:
            raise ValueError('a Bloom filter of %d bits and %d hashes' % (bits, hashes))
        self.bits = bits
        self.hashes = hashes
        self.data = bytearray(data) if data is not None else bytearray(bits // 8)
        if len(self.data) * 8 != bits:
            raise ValueError('%d bytes for a Bloom filter of %d bits' % (len(self.data), bits))

    @classmethod
    def sized_for(cls, entries):
        """A filter for ``entries`` entries: BITS_PER_ENTRY bits each, a power of two from
        MIN_BITS to MAX_BITS, and the number of hashes that makes its false-positive rate
        lowest at that size."""
        bits = MIN_BITS
        while bits < min(MAX_BITS, entries * BITS_PER_ENTRY):
            bits *= 2
        hashes = round(bits / max(1, entries) * math.log(2))
        return cls(bits, min(MAX_HASHES, max(1, hashes)))

    @classmethod
    def of(cls, entries):
        entries = list(entries)
        bloom = cls.sized_for(len(entries))
        for entry in entries:
            bloom.add(entry)
        return bloom

    def add(self, entry):
        mask = self.bits - 1        # a power of two: modulo m
        for word in _words(entry)[:self.hashes]:
            position = word & mask
            self.data[position >> 3] |= 1 << (position & 7)

    def __contains__(self, entry):
        # A loop, not all() over a generator: the scheduler asks every host at every request.
        data, mask = self.data, self.bits - 1
        for word in _words(entry)[:self.hashes]:
            position = word & mask
            if not data[position >> 3] >> (position & 7) & 1:
                return False
        return True

    def encode(self):
        return '%s:%d:%s' % (VERSION, self.hashes, base64.b64encode(bytes(self.data)).decode())

    @classmethod
    def decode(cls, text):
        """The filter ``encode`` made; ValueError for anything else, or one over MAX_BITS."""
        version, hashes, bits = text.split(':')
        if version != VERSION:
            raise ValueError('not a %s Bloom filter: %r' % (VERSION, version))
        # The size is checked before decoding: a report is a host's, and a host may be wrong.
        if len(bits) > 4 * MAX_BITS // 8 // 3 + 4:
            raise ValueError('a Bloom filter of over %d bits' % MAX_BITS)
        try:
            data = base64.b64decode(bits, validate=True)
        except binascii.Error as e:
            raise ValueError('a Bloom filter that is not base64: %s' % e) from None
        return cls(len(data) * 8, int(hashes), data)

    def fill_ratio(self):
        """The share of its bits that are set."""
        return int.from_bytes(self.data, 'little').bit_count() / self.bits

    def false_positive_rate(self):
        """The rate at which it answers "maybe" for an entry not added: every one of an entry's
        positions set, ``fill^k``."""
        return self.fill_ratio() ** self.hashes


# A filter that answers "maybe" to more than this share of what it does not hold says little
# and would bias every prediction (one of all ones, a host's error or a lie): no report.
MAX_FALSE_POSITIVE_RATE = 0.1


# The scheduler asks every host's filter for the same few entries at a request: each entry's
# hash once.
@functools.lru_cache(maxsize=4096)
def _words(entry):
    """The 16 little-endian 16-bit words of the entry's SHA-256."""
    return struct.unpack('<16H', hashlib.sha256(entry.encode()).digest())


def false_positive_rate(bits, hashes, entries):
    """The expected false-positive rate of a filter of ``bits`` bits and ``hashes`` hashes that
    holds ``entries`` entries: ``(1 - e^(-k n / m))^k``."""
    return (1 - math.exp(-hashes * entries / bits)) ** hashes
