"""While guests boot over a base file being filled, its in-order download is paced (Pacer), on a
clock of the test's: the sleeps it asks for are exact."""

import pytest

from yolo_nova.virt import first_boot

MIB = 1 << 20


class Clock:
    def __init__(self):
        self.now = 1000.0
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds

    def download(self, pacer, chunks, chunk_bytes=4 * MIB, seconds_per_chunk=0.0):
        """``chunks`` chunks arriving ``seconds_per_chunk`` apart (the link), each reported."""
        for _ in range(chunks):
            self.now += seconds_per_chunk
            pacer.took(chunk_bytes)


def pacer(clock, rate=16 * MIB, seconds=60.0):
    return first_boot.Pacer(rate, seconds, clock=clock, sleep=clock.sleep)


def test_no_guest_no_pacing():
    clock = Clock()
    clock.download(pacer(clock), 100)
    assert clock.slept == []


def test_while_a_guest_boots_the_download_goes_at_the_rate_then_at_the_links():
    clock = Clock()
    paced = pacer(clock)
    paced.guest_started()
    started = clock.now
    # 60 s at 16 MiB/s: 240 chunks of 4 MiB, each a quarter of a second.
    clock.download(paced, 240)
    assert clock.slept == [0.25] * 240
    assert clock.now == started + 60.0
    assert not paced.pacing
    clock.download(paced, 100, seconds_per_chunk=0.03)
    assert len(clock.slept) == 240


def test_a_slow_link_is_not_slowed_further():
    clock = Clock()
    paced = pacer(clock)
    paced.guest_started()
    # 4 MiB every 0.5 s is 8 MiB/s, under the rate.
    clock.download(paced, 10, seconds_per_chunk=0.5)
    assert clock.slept == []


def test_a_sleep_ends_with_the_window():
    clock = Clock()
    paced = pacer(clock, rate=1 * MIB, seconds=10.0)
    paced.guest_started()
    clock.download(paced, 3)             # 4 s each: 4, 4, then the last 2 s of the window
    assert clock.slept == [4.0, 4.0, 2.0]
    clock.download(paced, 3)
    assert clock.slept == [4.0, 4.0, 2.0]


def test_each_guest_started_paces_for_its_own_boot():
    clock = Clock()
    paced = pacer(clock, rate=4 * MIB, seconds=10.0)
    paced.guest_started()
    clock.download(paced, 5)             # 5 s
    paced.guest_started()                # the window now ends 10 s from here
    clock.download(paced, 20)
    assert sum(clock.slept) == 15.0
    assert not paced.pacing


def test_rate_zero_never_paces():
    clock = Clock()
    paced = pacer(clock, rate=0)
    paced.guest_started()
    clock.download(paced, 100)
    assert clock.slept == [] and not paced.pacing


def test_a_fill_paces_from_its_first_disk(tmp_path):
    clock = Clock()
    fill = first_boot.Fill(str(tmp_path), 'base', 1 << 30, client=None, image_id='image',
                           boot_image_id='boot-image', boot_image_path='unused',
                           pacer=pacer(clock))
    assert not fill.pacer.pacing
    fill.add_disk('/instances/one/disk')
    assert fill.pacer.pacing and fill.disks == {'/instances/one/disk'}


def test_only_the_bytes_that_arrived_unpaced_measure_the_link():
    # The link: 4 MiB every 0.04 s (100 MiB/s). 60 s paced at 16 MiB/s, then unpaced.
    clock = Clock()
    paced = pacer(clock)
    paced.guest_started()
    clock.download(paced, 240, seconds_per_chunk=0.04)
    assert paced.unpaced_bytes == 0
    clock.download(paced, 100, seconds_per_chunk=0.04)
    # Each chunk's time runs from the end of the previous one's pacing.
    assert paced.unpaced_bytes == 100 * 4 * MIB
    assert paced.unpaced_bytes / paced.unpaced_seconds == pytest.approx(100 * MIB)


def test_a_pause_of_the_download_is_not_the_links_time():
    clock = Clock()
    paced = pacer(clock)
    clock.download(paced, 10, seconds_per_chunk=0.04)
    # Ranges a guest waits for take the link for 5 s: the chunk after is not counted.
    paced.interrupted()
    clock.now += 5.0
    clock.download(paced, 10, seconds_per_chunk=0.04)
    assert paced.unpaced_bytes == 18 * 4 * MIB
    assert paced.unpaced_bytes / paced.unpaced_seconds == pytest.approx(100 * MIB)
