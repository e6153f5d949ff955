"""What hosts report in their stats, and what the scheduler reads back."""

import time

import pytest

from yolo_nova.model import host_stats
from yolo_nova.model import locality
from yolo_nova.model import parameters
from yolo_nova.model import prediction


def test_host_stats_without_the_optional_keys_give_the_thesis_model():
    state = host_stats.HostBootState(0.5, 0.75, parameters.BootTimeParameters(
        alpha=5.0, beta=20.0, alpha_yolo=0.5, io_exponent=0.0, cpu_contention=0.0,
        beta_growth=0.25, io_pole=0.5, io_pole_yolo=0.25),
        frozenset(), time.time(), runnable=1.0, idlest_cpu_utilisation=0.25, cpu_pressure=0.125)
    stats = state.to_stats()
    parsed = host_stats.from_stats(stats, max_age=60)
    assert (parsed.params.io_exponent, parsed.params.cpu_contention, parsed.params.beta_growth,
            parsed.params.io_pole, parsed.params.io_pole_yolo,
            parsed.runnable, parsed.idlest_cpu_utilisation, parsed.cpu_pressure) == (
        0.0, 0.0, 0.25, 0.5, 0.25, 1.0, 0.25, 0.125)
    old = {k: v for k, v in stats.items()
           if k not in host_stats.OPTIONAL_KEYS}
    parsed = host_stats.from_stats(old, max_age=60)
    assert (parsed.params.io_exponent, parsed.params.cpu_contention, parsed.params.beta_growth,
            parsed.params.io_pole, parsed.params.io_pole_yolo,
            parsed.runnable, parsed.idlest_cpu_utilisation, parsed.cpu_pressure) == (
        1.0, 1.0, 0.0, 1.0, 1.0, None, None, None)
    # A pole out of bounds is no report at all.
    assert host_stats.from_stats(dict(stats, yolo_io_pole_yolo='2.0'), max_age=60) is None


IMAGE = '0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e'
OTHER = '11111111-2222-4333-8444-555566667777'
REQUESTED = prediction.RequestedImage(IMAGE, size=2 << 30, disk_format='qcow2',
                                      boot_image=True)


def state(held=None, boot_images=(), io=0.0, **kwargs):
    return host_stats.HostBootState(io, 0.0, parameters.BootTimeParameters(
        alpha=8.0, beta=23.0, alpha_yolo=0.5), frozenset(boot_images), time.time(),
        held=held, **kwargs)


def test_what_a_host_holds_travels_as_a_bloom_filter():
    held = locality.BloomFilter.of([locality.base_file_entry(locality.base_file_name(IMAGE)),
                                    locality.boot_image_entry(IMAGE)])
    stats = state(held, boot_images=[IMAGE], streams_first_boots=True,
                  boot_image_ratio=0.03).to_stats()
    parsed = host_stats.from_stats(stats, max_age=60)
    assert parsed.holds_base_file(IMAGE) and parsed.holds_boot_image(IMAGE)
    assert not parsed.holds_base_file(OTHER) and not parsed.holds_boot_image(OTHER)
    assert (parsed.streams_first_boots, parsed.boot_image_ratio) == (True, 0.03)
    # The list of boot images is not reported beside it: it grows with the catalogue.
    assert stats['yolo_boot_images'] == ''


def test_a_host_from_before_locality_holds_every_base_file_and_its_listed_boot_images():
    parsed = host_stats.from_stats(state(boot_images=[IMAGE]).to_stats(), max_age=60)
    assert parsed.held is None
    assert parsed.holds_base_file(OTHER)
    assert parsed.holds_boot_image(IMAGE) and not parsed.holds_boot_image(OTHER)
    # Predicted as it was: the boot image serves the boot, nothing is fetched.
    predicted = parsed.predict(REQUESTED, 0)
    assert predicted.fetch == prediction.Fetch(0.0, 'cached', True)
    assert predicted.held == predicted.total == pytest.approx(23.5)


def test_a_host_is_judged_as_if_it_held_the_image_and_weighed_with_its_fetch():
    nothing = host_stats.from_stats(
        state(locality.BloomFilter.of([])).to_stats(), max_age=60).predict(REQUESTED, 0)
    assert nothing.held == pytest.approx(23.5)
    # Nova's download (17.2 s) and conversion (10.7 s), then a normal boot (31 s).
    assert nothing.fetch.path == 'download'
    assert nothing.total == pytest.approx((2 << 30) / 125e6 + (2 << 30) / 200e6 + 31.0)
    # A host that streams first boots fetches the boot image it lacks (5% of the image), then
    # boots from it beside the download: 1.25 times as long as with the base file held.
    streams = host_stats.from_stats(state(locality.BloomFilter.of([]),
                                          streams_first_boots=True).to_stats(), max_age=60)
    streamed = streams.predict(REQUESTED, 0)
    assert streamed.fetch.path == 'streamed' and streamed.held == pytest.approx(23.5)
    assert streamed.total == pytest.approx(0.05 * (2 << 30) / 125e6 + 1.25 * 23.5)


@pytest.mark.parametrize('key, value', [
    ('yolo_held', 'bloom1:3:not base64!'), ('yolo_held', 'a list,of,ids'),
    ('yolo_glance_bytes_per_second', '0'), ('yolo_glance_bytes_per_second', 'nan'),
    ('yolo_streamed_boot_factor', '0.5'), ('yolo_updated_at', 'nan'),
    ('yolo_updated_at', 'inf')])
def test_a_wrong_locality_report_is_no_report(key, value):
    stats = state(locality.BloomFilter.of([])).to_stats()
    assert host_stats.from_stats(dict(stats, **{key: value}), max_age=60) is None


def test_a_boot_image_ratio_out_of_bounds_is_bounded():
    stats = state(locality.BloomFilter.of([])).to_stats()
    for value, expected in (('7', 1.0), ('-1', 0.0), ('nan', 0.05)):
        parsed = host_stats.from_stats(dict(stats, yolo_boot_image_ratio=value), max_age=60)
        assert parsed.boot_image_ratio == expected


def test_a_filter_that_holds_everything_is_no_report():
    full = locality.BloomFilter(4096, 4, bytes([0xff]) * 512)
    stats = dict(state(locality.BloomFilter.of([])).to_stats(), yolo_held=full.encode())
    assert host_stats.from_stats(stats, max_age=60) is None
    # One at its designed load is one.
    designed = locality.BloomFilter.of('boot:%d' % n for n in range(256))
    stats['yolo_held'] = designed.encode()
    parsed = host_stats.from_stats(stats, max_age=60)
    assert parsed.held_false_positives == pytest.approx(designed.false_positive_rate())
    assert parsed.held_false_positives < 0.001
