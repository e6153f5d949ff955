from yolo_bench import variant_catalogue as vc


def test_intervals_bytes_counts_overlaps_once():
    assert vc.intervals_bytes([]) == 0
    assert vc.intervals_bytes([(0, 10), (5, 15), (20, 30)]) == 25
    assert vc.intervals_bytes([(20, 30), (0, 100)]) == 100


def test_covered_counts_each_read_byte_once():
    extents = [(0, 4096), (8192, 12288)]
    # A read inside, one across an extent's end, one outside, one read twice.
    reads = [(0, 100), (4000, 8292), (20000, 21000), (50, 60)]
    assert vc.covered(reads, extents) == 100 + 96 + 100
    assert vc.covered(reads, []) == 0
    assert vc.covered([(0, 12288)], extents) == 8192


def test_every_variant_is_made_from_one_listed_before_it():
    seen = set()
    for variant in vc.CATALOGUE:
        assert variant.how in ('build', 'derive', 'snapshot')
        assert (variant.parent is None) == (variant.how == 'build')
        assert variant.parent is None or variant.parent in seen
        seen.add(variant.name)
    assert len(vc.CATALOGUE) >= 20


def test_groups_are_releases_and_families():
    catalogue = (vc.Variant('bookworm-a', 'build'), vc.Variant('bookworm-b', 'build'),
                 vc.Variant('bookworm-a-x', 'derive', 'bookworm-a', ('x',)),
                 vc.Variant('bookworm-a-x-snap', 'snapshot', 'bookworm-a-x'),
                 vc.Variant('bullseye-a', 'build'))
    assert vc.family('bookworm-a-x-snap', catalogue) == 'bookworm-a'
    assert dict(vc.groups(catalogue)) == {
        'all': [v.name for v in catalogue],
        'bookworm (one release)': ['bookworm-a', 'bookworm-b', 'bookworm-a-x',
                                   'bookworm-a-x-snap'],
        'bullseye (one release)': ['bullseye-a'],
        'debootstrapped apart': ['bookworm-a', 'bookworm-b', 'bullseye-a'],
        'bookworm-a and its derivatives': ['bookworm-a', 'bookworm-a-x', 'bookworm-a-x-snap'],
    }
