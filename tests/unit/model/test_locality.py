"""The bounded report of what a host holds: a Bloom filter, its format, size and error rate."""

import base64
import hashlib
import uuid

import pytest

from yolo_nova.model import locality


def image_ids(count, seed):
    return [str(uuid.UUID(bytes=hashlib.md5(b'%s-%d' % (seed, n)).digest()))
            for n in range(count)]


def held_entries(count):
    """A host's ``count`` base files and as many boot images."""
    ids = image_ids(count, b'held')
    return ([locality.base_file_entry(locality.base_file_name(i)) for i in ids]
            + [locality.boot_image_entry(i) for i in ids])


@pytest.mark.parametrize('count', [0, 1, 50, 500, 5000])
def test_every_entry_added_is_found(count):
    entries = held_entries(count)
    bloom = locality.BloomFilter.decode(locality.BloomFilter.of(entries).encode())
    assert all(entry in bloom for entry in entries)


@pytest.mark.parametrize('count', [0, 500, 5000, 100000])
def test_the_report_is_a_few_kilobytes_whatever_the_catalogue(count):
    encoded = locality.BloomFilter.of(held_entries(count)).encode()
    assert len(encoded) <= len('bloom1:16:') + 4 * (locality.MAX_BITS // 8 + 2) // 3


@pytest.mark.parametrize('count, stated', [(50, 1e-4), (500, 1e-3), (2500, 0.1)])
def test_false_positives_are_as_stated(count, stated):
    # 500 images held (1,000 entries): 16 bits each, 11 hashes, 0.05%; 2,500 (5,000 entries):
    # the 4 KiB bound, 5 hashes, 4.3%.
    bloom = locality.BloomFilter.of(held_entries(count))
    expected = locality.false_positive_rate(bloom.bits, bloom.hashes, 2 * count)
    assert expected < stated
    others = [locality.boot_image_entry(i) for i in image_ids(40000, b'other')]
    measured = sum(entry in bloom for entry in others) / len(others)
    # The rate is an expectation; 40,000 trials put the measured one well within 2x (+ 3
    # trials' worth) of it.
    assert measured <= 2 * expected + 3 / len(others)


def test_the_format_is_the_documented_one():
    # Whatever its version, a scheduler reads a host's filter: the positions are the
    # documented words of the entry's SHA-256.
    entry = locality.boot_image_entry('0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e')
    bloom = locality.BloomFilter(512, 3)
    bloom.add(entry)
    digest = hashlib.sha256(entry.encode()).digest()
    expected = bytearray(64)
    for i in range(3):
        position = (digest[2 * i] | digest[2 * i + 1] << 8) % 512
        expected[position // 8] |= 1 << (position % 8)
    assert bloom.encode() == 'bloom1:3:' + base64.b64encode(bytes(expected)).decode()


def test_a_base_file_is_named_as_novas_image_cache_names_it():
    from nova.virt.libvirt import imagecache
    image_id = '0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e'
    assert locality.base_file_name(image_id) == imagecache.get_cache_fname(image_id)


@pytest.mark.parametrize('text', [
    'bloom2:3:' + 'A' * 88,                                  # another version
    'bloom1:3',                                              # no bits
    'bloom1:3:' + 'A' * 64,                                  # 384 bits: not a power of two
    'bloom1:0:' + 'A' * 88,                                  # no hash
    'bloom1:17:' + 'A' * 88,                                 # too many hashes
    'bloom1:3:not base64!',
    'bloom1:3:' + base64.b64encode(bytes(locality.MAX_BITS // 8 + 3)).decode(),  # too large
    'bloom1:x:' + 'A' * 88,
])
def test_a_report_that_is_not_a_filter_is_refused(text):
    with pytest.raises(ValueError):
        locality.BloomFilter.decode(text)
