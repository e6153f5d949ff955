"""The first boot of an image before its download (docs/first-boot.md): the driver's fills of
base files, through a real yolofs mount and socket, from an HTTP server that serves an image's
data as Glance's image download does (yolo_testing.image_server: single ranges honoured), over a
throttled link or failing at will.
Nova's image API and Glance's metadata are not involved here (the e2e tests boot through them):
a fill is started as FirstBoots.begin starts it once it has a trusted boot image."""

import concurrent.futures
import errno
import fcntl
import filecmp
import hashlib
import os
import random
import signal
import subprocess
import threading
import time
from unittest import mock

from keystoneauth1 import session as ks_session
from oslo_concurrency import lockutils
import pytest
import tenacity

from tests.functional.test_nova_driver_fakelibvirt import downloads_left
from tests.functional.test_nova_driver_fakelibvirt import FakeImageAPI
from tests.yolofs.test_mount import boot_image_extents
from tests.yolofs.test_mount import holes_between
from yolo_common import yolofs
from yolo_nova.virt import backing
from yolo_nova.virt import boot_images
from yolo_nova.virt import first_boot
from yolo_nova.virt import qcow2_ranges
from yolo_testing.image_server import ImageServer
from yolo_testing.wait import wait as wait_until

SIZE = 24 << 20
NAME = '3f786850e387550fdab836ed7e6dc881de23001b'
IMAGE_ID = 'b8b7d7bd-5c39-4b5e-9d0b-5d9f0e2b1a37'


@pytest.fixture
def content():
    return random.Random(3).randbytes(SIZE)


@pytest.fixture
def image_server(content, tmp_path):
    (tmp_path / 'glance-store').write_bytes(content)
    with ImageServer({IMAGE_ID: tmp_path / 'glance-store'}) as server:
        yield server


@pytest.fixture
def dirs(tmp_path):
    for name in ('_base', 'locks', 'incoming', 'boot-images', 'mnt'):
        (tmp_path / name).mkdir()
    return tmp_path


def build_boot_image(tmp_path, content, name='offered.yolo'):
    """A boot image of ``content`` for IMAGE_ID, of scattered ranges as a boot reads them."""
    source = tmp_path / ('source-of-' + name)
    source.write_bytes(content)
    rng = random.Random(9)
    trace = tmp_path / 'trace'
    trace.write_text(''.join('%d %d\n' % (rng.randrange(SIZE // 2), rng.randrange(1, 65536))
                             for _ in range(60)))
    path = tmp_path / 'incoming' / name
    yolofs.run('build', '--trace', trace, '--source', source, '--output', path,
               '--image-id', IMAGE_ID)
    source.unlink()
    return path


class Host:
    """One compute host's yolofs mount and the driver's objects over it."""

    def __init__(self, dirs, **yolofs_options):
        self.dirs = dirs
        self.base_dir = dirs / '_base'
        self.mount = yolofs.Mount(
            source=self.base_dir, mountpoint=dirs / 'mnt', boot_images=dirs / 'boot-images',
            control_socket=dirs / 'control.sock', log_path=dirs / 'yolofs.log',
            **yolofs_options)
        self.yolofs_options = yolofs_options
        self.mount.start()
        self.backing = backing.BackingFiles(self.base_dir, dirs / 'mnt', dirs / 'control.sock',
                                            10.0)
        self.glance = FakeImageAPI()
        self.boot_images = boot_images.BootImages(self.backing, dirs / 'incoming',
                                                  image_api=self.glance,
                                                  boot_image_api=self.glance)
        self.first_boots = first_boot.FirstBoots(self.backing, self.boot_images,
                                                 str(dirs / 'locks'))

    def restart_yolofs(self):
        self.mount.stop()
        self.mount.start()

    def fill_raw(self, server, boot_image, checksum=None):
        data = first_boot.GlanceData(ks_session.Session(), server.endpoint, IMAGE_ID)
        return self.first_boots.start(
            NAME, SIZE, IMAGE_ID, 'boot-image-id', str(boot_image),
            lambda fill: fill.run_raw(data, checksum))

    def served(self, name=NAME):
        return self.dirs / 'mnt' / name


@pytest.fixture
def host(dirs):
    host = Host(dirs, fill_read_timeout_secs=60)
    yield host
    host.mount.stop()


def sha256(content):
    return ('sha256', hashlib.sha256(content).hexdigest())


def test_a_raw_image_is_read_before_its_download_and_ends_as_an_ordinary_base_file(
        host, dirs, image_server, content):
    image_server.rate = 4 << 20   # 6 s for the whole
    image_server.throttle_ranges = False
    boot_image = build_boot_image(dirs, content)
    extents = boot_image_extents(boot_image)
    failed_fills = []
    host.first_boots.on_failed = failed_fills.append
    fill = host.fill_raw(image_server, boot_image, sha256(content))
    assert fill is not None and fill.running
    fill.disks.add('instances/a-guest/disk')
    # Concurrent first boots share the fill.
    assert host.fill_raw(image_server, boot_image, sha256(content)) is fill

    # The base file is on the mount under its own name at once, at its final size, though
    # _base has only the fill file.
    assert not (host.base_dir / NAME).exists()
    assert os.path.getsize(host.served()) == SIZE
    fd = os.open(host.served(), os.O_RDONLY)
    try:
        extent = extents[0]
        start, length = extent['source_offset'], extent['length']
        assert os.pread(fd, length, start) == content[start:start + length]

        # A read near the end is fetched by range before the download gets there.
        start = SIZE - (3 << 20)
        assert os.pread(fd, 8192, start) == content[start:start + 8192]
        assert fill.running and fill._cursor < start
        assert any(s <= start < e for s, e in image_server.ranges)

        assert fill.wait(60)
        assert fill.outcome == 'complete' and fill.boot_image_matches is True
        assert os.pread(fd, SIZE, 0) == content
    finally:
        os.close(fd)
    assert (host.base_dir / NAME).read_bytes() == content
    assert os.listdir(host.base_dir) == [NAME]
    assert os.stat(host.base_dir / NAME).st_mode & 0o777 == 0o644
    # The boot image is now the base file's, installed and verified as any other.
    assert host.boot_images.has_boot_image(NAME, host.backing.status())
    assert host.served().read_bytes() == content
    assert downloads_left(dirs / 'incoming') == []
    assert host.first_boots.running(NAME) is None
    assert failed_fills == []


@pytest.mark.parametrize('guest', [True, False], ids=['a guest booting', 'no guest'])
def test_the_download_is_paced_while_a_guest_boots_over_the_file(
        host, dirs, image_server, content, monkeypatch, guest):
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        time.sleep(seconds)
    pacer = first_boot.Pacer
    monkeypatch.setattr(first_boot, 'Pacer', lambda *args: pacer(*args, sleep=sleep))
    # 16 MiB/s for an hour after a guest starts; the link (unthrottled) is faster.
    host.first_boots.paced_rate, host.first_boots.paced_seconds = 16 << 20, 3600.0
    data = first_boot.GlanceData(ks_session.Session(), image_server.endpoint, IMAGE_ID)
    disk_made = threading.Event()

    def run(fill):
        disk_made.wait(30)
        fill.run_raw(data, sha256(content))
    fill = host.first_boots.start(NAME, SIZE, IMAGE_ID, 'boot-image-id',
                                  str(build_boot_image(dirs, content)), run)
    if guest:
        fill.add_disk('instances/a-guest/disk')
    disk_made.set()
    assert fill.wait(60) and fill.outcome == 'complete', fill.reason
    assert (host.base_dir / NAME).read_bytes() == content
    # Each 4 MiB chunk is due a quarter of a second after the one before: the download slept
    # (unless every chunk came late), and never without a guest.
    if guest:
        assert slept and all(0 < seconds <= 0.25 + 1e-6 for seconds in slept)
    else:
        assert slept == []


def test_a_broken_download_resumes_where_it_broke(host, dirs, image_server, content):
    image_server.break_after = 10 << 20
    fill = host.fill_raw(image_server, build_boot_image(dirs, content), sha256(content))
    assert fill.wait(120) and fill.outcome == 'complete', fill.reason
    # Resumed by one range from the last whole chunk written (a chunk cut short is not kept).
    [(resumed, end)] = image_server.ranges
    assert 0 < resumed <= 10 << 20 and end == SIZE
    assert (host.base_dir / NAME).read_bytes() == content


def test_glance_unreachable_mid_fill_fails_it_and_leaves_nothing(
        host, dirs, image_server, content, monkeypatch):
    monkeypatch.setattr(first_boot.Fill._download.retry, 'wait', tenacity.wait_none())
    image_server.rate = 4 << 20
    boot_image = build_boot_image(dirs, content)
    hole = holes_between(boot_image_extents(boot_image), SIZE)[-1]
    failed_fills = []
    host.first_boots.on_failed = failed_fills.append
    fill = host.fill_raw(image_server, boot_image, sha256(content))
    fill.disks.add('instances/a-guest/disk')
    fd = os.open(host.served(), os.O_RDONLY)
    try:
        wait_until('the download under way', 30, lambda: fill._cursor > 0, interval=0.05)
        image_server.down = True
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reading = pool.submit(os.pread, fd, hole[1], hole[0])
            assert fill.wait(60) and fill.outcome == 'failed'
            with pytest.raises(OSError) as failed:
                reading.result(30)
            assert failed.value.errno == errno.EIO
    finally:
        os.close(fd)
    # The driver fails the guests over it (tests/functional/test_nova_driver_fakelibvirt.py).
    wait_until('the failed fill reported', 10, lambda: failed_fills == [fill])
    assert os.listdir(host.base_dir) == []
    assert downloads_left(dirs / 'incoming') == []
    assert not host.served().exists()


def test_data_that_is_not_the_images_is_never_a_base_file(host, dirs, image_server, content):
    fill = host.fill_raw(image_server, build_boot_image(dirs, content),
                         ('sha256', hashlib.sha256(b'another image').hexdigest()))
    assert fill.wait(60) and fill.outcome == 'failed' and 'checksum' in fill.reason
    assert os.listdir(host.base_dir) == []


def test_an_image_with_only_the_legacy_md5_is_verified_by_it(host, dirs, image_server, content):
    md5 = first_boot.image_checksum({'checksum': hashlib.md5(content).hexdigest()})
    fill = host.fill_raw(image_server, build_boot_image(dirs, content), md5)
    assert fill.wait(60) and fill.outcome == 'complete', fill.reason
    (host.base_dir / NAME).unlink()
    fill = host.fill_raw(image_server, build_boot_image(dirs, content),
                         ('md5', hashlib.md5(b'another image').hexdigest()))
    assert fill.wait(60) and fill.outcome == 'failed' and 'md5 checksum' in fill.reason


def test_an_image_whose_store_serves_no_ranges_takes_novas_path(dirs, image_server):
    """Glance on Ceph (rbd), Swift, S3 or HTTP answers a range with 400: known from a range of
    one byte before any promise, remembered per image, counted for the host's stats."""
    data = first_boot.GlanceData(ks_session.Session(), image_server.endpoint, IMAGE_ID)
    first_boots = first_boot.FirstBoots(mock.Mock(base_dir=str(dirs / '_base')), None, '')
    image_server.ranges_refused = True
    assert first_boots._serves_ranges(IMAGE_ID, data) is False
    image_server.ranges_refused = False
    assert first_boots._serves_ranges(IMAGE_ID, data) is False
    assert first_boots.images_without_ranges == [IMAGE_ID]
    other_host = first_boot.FirstBoots(mock.Mock(base_dir=str(dirs / '_base')), None, '')
    assert other_host._serves_ranges(IMAGE_ID, data) is True
    assert other_host.images_without_ranges == []
    assert image_server.ranges == [(0, 1)]


def test_a_token_that_expires_mid_fill_stops_its_ranges_not_its_reads(
        host, dirs, image_server, content, caplog):
    """Glance refuses new requests once the booting user's token has expired (no service
    token beside it): the ranges stop, said once in the log and counted; the download in order
    goes on over its open connection, and the reads that wait get its bytes."""
    image_server.rate = 4 << 20   # 6 s for the whole
    fill = host.fill_raw(image_server, build_boot_image(dirs, content), sha256(content))
    wait_until('the download under way', 30, lambda: fill._cursor > 0, interval=0.05)
    image_server.token_expired = True
    start = SIZE - (2 << 20)
    fd = os.open(host.served(), os.O_RDONLY)
    try:
        assert os.pread(fd, 8192, start) == content[start:start + 8192]
    finally:
        os.close(fd)
    assert fill.wait(60) and fill.outcome == 'complete', fill.reason
    assert (host.base_dir / NAME).read_bytes() == content
    # Counted by the fill's thread once the fill has ended.
    assert fill.ranges_unauthorized
    wait_until('the fill counted', 10,
               lambda: host.first_boots.fills_with_expired_tokens == 1, interval=0.05)
    assert caplog.text.count("the booting user's token has expired") == 1


def test_bytes_the_file_does_not_hold_as_received_are_never_kept(
        host, dirs, image_server, content, monkeypatch):
    """A write lost on its way to the disk (the kernel took it, the file does not hold it):
    the file, read back before the rename, is not the data received; the fill fails."""
    real_write_data = first_boot.write_data
    lost = []

    def losing_write_data(fd, chunk, offset):
        if offset == 8 << 20 and not lost:
            lost.append(offset)     # the chunk at 8 MiB never reaches the file
            return
        real_write_data(fd, chunk, offset)
    monkeypatch.setattr(first_boot, 'write_data', losing_write_data)
    fill = host.fill_raw(image_server, build_boot_image(dirs, content), sha256(content))
    assert fill.wait(60) and fill.outcome == 'failed', fill.reason
    assert lost and fill.reason == 'the file as written is not the data received'
    assert os.listdir(host.base_dir) == []


def test_an_error_before_the_fill_runs_ends_it(host, dirs, content):
    """Whatever fails before the fill runs (Glance's endpoint not found, an unknown hash
    algorithm) ends it: no fill is left running for later boots to join or wait for."""
    def run(fill):
        raise ValueError('unsupported hash type whirlpool')
    fill = host.first_boots.start(NAME, SIZE, IMAGE_ID, 'boot-image-id',
                                  str(build_boot_image(dirs, content)), run)
    assert fill is None or fill.wait(10)
    assert host.first_boots.running(NAME) is None
    assert os.listdir(host.base_dir) == [] and downloads_left(dirs / 'incoming') == []


def test_a_base_file_nova_is_downloading_takes_novas_path_alone(
        host, dirs, image_server, content, monkeypatch):
    """Nova holds its lock of the base file (its own download): the fill gives up after a
    bounded wait, and meanwhile another image's first boot starts at once."""
    monkeypatch.setattr(first_boot, 'NOVA_LOCK_WAIT_SECONDS', 3)
    held, release = threading.Event(), threading.Event()

    def novas_download():
        with lockutils.lock(NAME, lock_file_prefix='nova-', external=True,
                            lock_path=str(dirs / 'locks')):
            held.set()
            release.wait(60)
    nova = threading.Thread(target=novas_download)
    nova.start()
    try:
        held.wait(10)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            waiting = pool.submit(host.fill_raw, image_server, build_boot_image(dirs, content))
            time.sleep(0.5)
            other_name = 'a' * 40
            other = host.first_boots.start(
                other_name, SIZE, IMAGE_ID, 'boot-image-id',
                str(build_boot_image(dirs, content, name='other.yolo')),
                lambda fill: fill.run_raw(first_boot.GlanceData(
                    ks_session.Session(), image_server.endpoint, IMAGE_ID)))
            assert other is not None and not waiting.done()
            assert waiting.result(30) is None
            assert 2.5 < time.monotonic() - started < 30
            assert other.wait(60) and other.outcome == 'complete', other.reason
    finally:
        release.set()
        nova.join()
    assert sorted(os.listdir(host.base_dir)) == [other_name]


def test_a_fill_under_way_on_another_host_sharing_base_is_left_alone(host, dirs, content):
    """A ``_base`` on NFS shared by hosts: a nova-compute that starts deletes the fills left
    by its own predecessor, not another host's fill under way (its fill file is locked)."""
    fill_path = host.base_dir / first_boot.fill_name(NAME)
    download = host.base_dir / (fill_path.name + '.download.part')
    with open(fill_path, 'wb') as f:
        f.truncate(SIZE)
    download.write_bytes(b'qcow2 data')
    fd = os.open(fill_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)     # as Fill.begin on the other host
        first_boot.FirstBoots(host.backing, host.boot_images,
                              str(dirs / 'locks')).abandon_leftovers()
        assert sorted(os.listdir(host.base_dir)) == sorted([fill_path.name, download.name])
    finally:
        os.close(fd)
    first_boot.FirstBoots(host.backing, host.boot_images, str(dirs / 'locks')).abandon_leftovers()
    assert os.listdir(host.base_dir) == []


def test_a_first_boot_that_would_fill_the_disk_takes_novas_path(dirs):
    """A converted first boot holds Nova's download and conversion beside the fill file: where
    ``_base`` has room for Nova's path only, Nova's path is taken."""
    small = dirs / '_base'
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=40m', 'tmpfs', small], check=True)
    try:
        host = Host(dirs)
        try:
            room_for = host.first_boots._room_for
            assert room_for({'size': 4 << 20}, 30 << 20, raw=True)
            assert room_for({'size': 4 << 20}, 16 << 20, raw=False)
            # Nova's own path: 4 + 30 MiB, which fit; the fill's: 4 + 2 x 30 MiB.
            assert not room_for({'size': 4 << 20}, 30 << 20, raw=False)
        finally:
            host.mount.stop()
    finally:
        subprocess.run(['umount', '--lazy', small], check=True)


def test_a_range_the_download_contradicts_fails_the_fill(
        host, dirs, image_server, content, tmp_path):
    image_server.rate = 4 << 20
    image_server.throttle_ranges = False
    fill = host.fill_raw(image_server, build_boot_image(dirs, content))
    start = SIZE - (3 << 20)
    fd = os.open(host.served(), os.O_RDONLY)
    try:
        assert os.pread(fd, 8192, start) == content[start:start + 8192]
    finally:
        os.close(fd)
    # The store's bytes change after the range was served (no checksum to catch it).
    with open(tmp_path / 'glance-store', 'r+b') as store:
        store.seek(start)
        store.write(bytes(8192))
    assert fill.wait(60) and fill.outcome == 'failed'
    assert 'fetched by range for a read are not the image' in fill.reason
    assert os.listdir(host.base_dir) == []


def test_a_boot_image_of_other_data_is_an_alarm_rejected_and_its_guests_stopped(
        host, dirs, image_server, content):
    other = bytes(b ^ 0x5a for b in content[:SIZE // 2]) + content[SIZE // 2:]
    host.glance.images['boot-image-id'] = {'properties': {}}
    mismatched = []
    host.first_boots.on_mismatch = mismatched.append
    fill = host.fill_raw(image_server, build_boot_image(dirs, other), sha256(content))
    fill.add_disk('instances/a-guest/disk')
    assert fill.wait(60) and fill.outcome == 'complete'
    assert fill.boot_image_matches is False
    # The data is Glance's, verified: the base file stands; the boot image is never used,
    # here or (recorded in Glance) on any host.
    assert (host.base_dir / NAME).read_bytes() == content
    assert not host.boot_images.has_boot_image(NAME, host.backing.status())
    assert host.boot_images.trusted_boot_image(
        None, IMAGE_ID, {'properties': {boot_images.BOOT_IMAGE_PROPERTY: 'boot-image-id'}}) \
        is None
    assert 'did not match' in host.glance.images['boot-image-id']['properties'][
        'yolo_boot_image_rejected']
    assert 'ALARM' in (dirs / 'yolofs.log').read_text()
    # Its guests read bytes the image does not hold: the driver stops them (on_mismatch).
    wait_until('the guests stopped', 10, lambda: mismatched, interval=0.1)
    assert mismatched == [fill] and 'did not match' in fill.reason


def test_yolofs_restarted_mid_fill_serves_it_again(host, dirs, image_server, content):
    image_server.rate = 3 << 20
    boot_image = build_boot_image(dirs, content)
    extent = boot_image_extents(boot_image)[0]
    fill = host.fill_raw(image_server, boot_image, sha256(content))
    wait_until('the download under way', 30, lambda: fill._cursor > 0, interval=0.05)
    # Held while yolofs restarts, however long that takes: the fill cannot end meanwhile.
    image_server.pause()
    host.restart_yolofs()
    image_server.resume()
    # The new yolofs keeps no fill: the fill's next report of a range registers it again.
    deadline = time.monotonic() + 30
    while True:
        try:
            host.backing.client.fill_wants(fill.file, 0)
            break
        except yolofs.YolofsError:
            assert fill.running and time.monotonic() < deadline
            time.sleep(0.2)
    start, length = extent['source_offset'], extent['length']
    with open(host.served(), 'rb') as served:
        served.seek(start)
        assert served.read(length) == content[start:start + length]
        served.seek(SIZE - 4096)
        assert served.read(4096) == content[-4096:]
    assert fill.wait(60) and fill.outcome == 'complete'
    assert (host.base_dir / NAME).read_bytes() == content


def test_a_boot_image_file_changed_before_yolofs_restarts_is_never_served_again(
        host, dirs, image_server, content, caplog):
    """The file yolofs is asked to serve again is the one verified, or the fill fails (its
    guests are then stopped, as after any failed fill) with an alarm."""
    image_server.rate = 3 << 20
    boot_image = build_boot_image(dirs, content)
    fill = host.fill_raw(image_server, boot_image, sha256(content))
    # The fill has verified the file (begin), and cannot end before yolofs restarts.
    wait_until('the download under way', 30, lambda: fill._cursor > 0, interval=0.05)
    image_server.pause()
    with open(boot_image, 'r+b') as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xff]))
    host.restart_yolofs()
    assert fill.wait(60) and fill.outcome == 'failed'
    image_server.resume()
    assert 'boot image file changed' in fill.reason
    assert 'ALARM' in caplog.text
    with pytest.raises(yolofs.YolofsError):
        host.backing.client.fill_wants(fill.file, 0)
    assert os.listdir(host.base_dir) == []


def test_a_fill_whose_thread_cannot_start_takes_novas_path(host, dirs, content, monkeypatch):
    start = threading.Thread.start

    def no_fill_thread(thread):
        if thread.name.startswith('yolo-fill-'):
            raise RuntimeError("can't start new thread")
        start(thread)
    monkeypatch.setattr(threading.Thread, 'start', no_fill_thread)
    boot_image = build_boot_image(dirs, content)
    assert host.first_boots.start(NAME, SIZE, IMAGE_ID, 'boot-image-id', str(boot_image),
                                  lambda fill: None) is None
    # Nothing is left for a later boot to join or wait for; the boot image file went.
    assert host.first_boots.running(NAME) is None
    assert not boot_image.exists() and os.listdir(host.base_dir) == []


def test_yolofs_killed_mid_conversion_keeps_the_guests_reads_waiting_not_failing(
        dirs, content):
    """yolofs SIGKILLed under a converted fill (its keeper starts another on the mount): the
    new one waits for the driver to tell it the fill again, which it does at once, rather than
    failing the open file's reads before the copy phase; the fill then ends as usual."""
    host = Host(dirs, fill_read_timeout_secs=60, kept=True)
    try:
        conversion = Conversion(content)
        boot_image = build_boot_image(dirs, content)
        extent = boot_image_extents(boot_image)[0]
        fill = host.first_boots.start(NAME, SIZE, IMAGE_ID, 'boot-image-id', str(boot_image),
                                      lambda fill: fill.run_converted(conversion))
        fd = os.open(host.served(), os.O_RDONLY)
        try:
            pid = host.mount.client.status().answer['pid']
            os.kill(pid, signal.SIGKILL)
            start, length = extent['source_offset'], extent['length']
            assert os.pread(fd, length, start) == content[start:start + length]
            assert host.mount.client.status().answer['pid'] != pid
            conversion.released.set()
            assert fill.wait(60) and fill.outcome == 'complete', fill.reason
            assert os.pread(fd, 4096, SIZE - 4096) == content[-4096:]
        finally:
            os.close(fd)
    finally:
        host.mount.stop()
    assert (host.base_dir / NAME).read_bytes() == content


def test_a_fill_left_by_a_stopped_compute_service_is_deleted(host, dirs, content):
    fill_path = host.base_dir / first_boot.fill_name(NAME)
    with open(fill_path, 'wb') as f:
        f.truncate(SIZE)
    # A converted download under way, too.
    (host.base_dir / (fill_path.name + '.download.part')).write_bytes(b'qcow2 data')
    host.backing.client.fill_begin(fill_path.name, build_boot_image(dirs, content), IMAGE_ID)
    fd = os.open(host.served(), os.O_RDONLY)
    try:
        # A new nova-compute: its FirstBoots knows no fill.
        first_boot.FirstBoots(host.backing, host.boot_images,
                              str(dirs / 'locks')).abandon_leftovers()
        with pytest.raises(OSError) as failed:
            os.pread(fd, 4096, SIZE - 4096)
        assert failed.value.errno == errno.EIO
    finally:
        os.close(fd)
    assert os.listdir(host.base_dir) == []


def test_a_full_disk_fails_the_fill_and_leaves_nothing(dirs, image_server, content):
    small = dirs / '_base'
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=12m', 'tmpfs', small], check=True)
    try:
        host = Host(dirs, fill_read_timeout_secs=60)
        try:
            fill = host.fill_raw(image_server, build_boot_image(dirs, content), sha256(content))
            assert fill.wait(60) and fill.outcome == 'failed'
            assert 'No space left' in fill.reason
            assert os.listdir(small) == []
        finally:
            host.mount.stop()
    finally:
        # Lazily: the stopped yolofs may not have let go of the directory yet.
        subprocess.run(['umount', '--lazy', small], check=True)


class Conversion:
    """Nova's ``fetch_to_raw`` as a fill calls it: writes ``data`` once ``released``."""

    def __init__(self, data):
        self.data = data
        self.released = threading.Event()

    def __call__(self, path):
        self.released.wait(30)
        with open(path, 'wb') as f:
            f.write(self.data)


def assert_read_waits_for(conversion, host, hole):
    """A read of ``hole`` of the served file returns only once ``conversion`` has run."""
    fd = os.open(host.served(), os.O_RDONLY)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reading = pool.submit(os.pread, fd, hole[1], hole[0])
            time.sleep(2)
            assert not reading.done()
            conversion.released.set()
            assert reading.result(30) == conversion.data[hole[0]:hole[0] + hole[1]]
    finally:
        os.close(fd)


def test_other_formats_are_served_once_converted(host, dirs, content):
    # Converted, the image is twice the size of its random data: its second half is zeros.
    converted = content + bytes(SIZE)
    boot_image = build_boot_image(dirs, converted)
    hole = holes_between(boot_image_extents(boot_image), SIZE)[0]
    conversion = Conversion(converted)
    fill = host.first_boots.start(NAME, 2 * SIZE, IMAGE_ID, 'boot-image-id', str(boot_image),
                                  lambda fill: fill.run_converted(conversion))
    assert_read_waits_for(conversion, host, hole)
    assert fill.wait(30) and fill.outcome == 'complete'
    assert os.listdir(host.base_dir) == [NAME]
    assert (host.base_dir / NAME).read_bytes() == converted
    # Its zeros are holes, as the converted file's are.
    assert os.stat(host.base_dir / NAME).st_blocks * 512 <= SIZE + (1 << 20)


def qcow2_of(tmp_path, converted):
    """A compressed qcow2 image of ``converted`` (as the test image is made)."""
    raw, qcow2 = tmp_path / 'qcow2-source.raw', tmp_path / 'glance-store.qcow2'
    raw.write_bytes(converted)
    subprocess.run(['qemu-img', 'convert', '-c', '-f', 'raw', '-O', 'qcow2', raw, qcow2],
                   check=True)
    raw.unlink()
    return qcow2


def fill_qcow2(host, dirs, converted, produce):
    """A fill of the qcow2 image of ``converted`` from an image server, its conversion written
    by ``produce(path)``; returns the fill, the hole of its boot image read and the server."""
    qcow2 = qcow2_of(dirs, converted)
    boot_image = build_boot_image(dirs, converted)
    # A hole past the first MiB (whose clusters the header's range request may bring along).
    hole = [h for h in holes_between(boot_image_extents(boot_image), len(converted))
            if h[0] > 1 << 20 and h[0] + h[1] < SIZE][0]
    server = ImageServer({IMAGE_ID: qcow2})
    server.__enter__()
    ranges = qcow2_ranges.Qcow2Data(
        first_boot.GlanceData(ks_session.Session(), server.endpoint, IMAGE_ID),
        qcow2.stat().st_size)
    fill = host.first_boots.start(
        NAME, len(converted), IMAGE_ID, 'boot-image-id', str(boot_image),
        lambda fill: fill.run_converted(produce, ranges=ranges))
    return fill, hole, server


def test_reads_of_a_qcow2_image_are_served_by_range_before_its_conversion(
        host, dirs, content):
    converted = content + bytes(SIZE)
    conversion = Conversion(converted)
    fill, hole, server = fill_qcow2(host, dirs, converted, conversion)
    try:
        fd = os.open(host.served(), os.O_RDONLY)
        try:
            # Its clusters found by range (header, L1, L2, the compressed clusters) while the
            # conversion has not even begun.
            assert os.pread(fd, hole[1], hole[0]) == converted[hole[0]:hole[0] + hole[1]]
            assert fill.running and fill.fetched_ranges >= 1 and len(server.ranges) >= 4
            conversion.released.set()
            assert fill.wait(30) and fill.outcome == 'complete', fill.reason
            assert os.pread(fd, 2 * SIZE, 0) == converted
        finally:
            os.close(fd)
    finally:
        server.__exit__()
    assert os.listdir(host.base_dir) == [NAME]
    assert (host.base_dir / NAME).read_bytes() == converted


def test_a_range_that_is_not_the_converted_data_fails_the_fill(host, dirs, content):
    converted = content + bytes(SIZE)
    failed_fills = []
    host.first_boots.on_failed = failed_fills.append
    # What Nova's verified download converts to differs from what the ranges said (a reader
    # that disagreed with qemu-img, or a store that changed its bytes).
    conversion = Conversion(bytes(2 * SIZE))
    fill, hole, server = fill_qcow2(host, dirs, converted, conversion)
    fill.disks.add('instances/a-guest/disk')
    try:
        fd = os.open(host.served(), os.O_RDONLY)
        try:
            assert os.pread(fd, hole[1], hole[0]) == converted[hole[0]:hole[0] + hole[1]]
        finally:
            os.close(fd)
        conversion.released.set()
        assert fill.wait(30) and fill.outcome == 'failed'
        assert 'fetched by range for a read are not the image' in fill.reason
    finally:
        server.__exit__()
    wait_until('the failed fill reported', 10, lambda: failed_fills == [fill])
    assert os.listdir(host.base_dir) == []


def test_a_qcow2_image_read_otherwise_waits_for_its_conversion(host, dirs, content):
    converted = content + bytes(SIZE)
    conversion = Conversion(converted)
    fill, hole, server = fill_qcow2(host, dirs, converted, conversion)
    server.down = True      # what the ranges cannot serve, the conversion does
    try:
        assert_read_waits_for(conversion, host, hole)
        assert fill.wait(30) and fill.outcome == 'complete', fill.reason
    finally:
        server.__exit__()
    assert (host.base_dir / NAME).read_bytes() == converted


def test_a_first_boot_reaches_ready_before_the_download_ends_and_leaves_the_usual_base_file(
        image_cache, mount_factory, tmp_path):
    """YoloLibvirtDriver with ``first_boot_before_download``, an empty ``_base`` and Glance's
    data throttled to 1 MiB/s: Nova's root disk is created over the base file being filled,
    the test image boots from it (its boot image covers its first MiBs only: every other read
    is a range fetched on demand), and the fill then leaves the base file a normal download
    would have."""
    import fixtures
    import nova.conf
    from nova import context as nova_context
    from nova.tests import fixtures as nova_fixtures
    from oslo_config import fixture as config_fixture

    from tests.functional import test_nova_driver as driver_tests
    from tests.functional.test_nova_driver_fakelibvirt import FakeImageAPI
    from yolo_common import contract
    from yolo_common import images
    from yolo_common import qemu
    from yolo_common import signing

    image_id = 'c2a7f9e4-0b1d-4f51-8d7e-3a2b1c0d9e8f'
    name = images.base_file_name(image_id)
    base_dir = tmp_path / 'instances' / '_base'
    base_dir.mkdir(parents=True)
    trace = tmp_path / 'trace'
    trace.write_text('0 %d\n' % (4 << 20))
    boot_image = tmp_path / 'boot.yolo'
    yolofs.run('build', '--trace', trace, '--source', image_cache, '--output', boot_image,
               '--image-id', image_id)
    glance = FakeImageAPI()
    glance.images[image_id] = {
        'owner': 'a-tenant', 'container_format': 'bare', 'disk_format': 'raw',
        'size': os.path.getsize(image_cache), 'os_hash_algo': 'sha256',
        'os_hash_value': hashlib.sha256(image_cache.read_bytes()).hexdigest(),
        'properties': {boot_images.BOOT_IMAGE_PROPERTY: 'boot-image-id'}}
    # Signed by the worker, whose public key the host has.
    worker_key = signing.Signer.generate()
    digest = signing.file_digest(boot_image, 'sha512')
    glance.images['boot-image-id'] = {
        'size': os.path.getsize(boot_image), 'file': boot_image, 'os_hash_algo': 'sha512',
        'os_hash_value': digest,
        'properties': {boot_images.SOURCE_IMAGE_PROPERTY: image_id,
                       contract.SIGNATURE: worker_key.sign(image_id, 'sha512', digest)}}

    with fixtures.Fixture() as scope, \
            ImageServer({image_id: image_cache}, rate=1 << 20) as server:
        # The in-order download is throttled, the ranges the guest waits for are not: the boot
        # image covers little here (docs/evaluation/benchmarks.md measures boots over a shared
        # link).
        server.throttle_ranges = False
        conf = scope.useFixture(config_fixture.Config(nova.conf.CONF))
        scope.useFixture(nova_fixtures.PrivsepFixture())
        conf.config(instances_path=str(base_dir.parent), use_cow_images=True,
                    force_raw_images=True)
        conf.config(images_type='qcow2', virt_type='qemu', group='libvirt')
        conf.config(mount_point=str(tmp_path / 'mnt0'),
                    control_socket=str(tmp_path / 'control0.sock'),
                    download_dir=str(tmp_path / 'downloads'), first_boot_before_download=True,
                    boot_image_signing_keys=[worker_key.public_key], group='yolo')
        # Glance's download, as the booting user's session would make it.
        scope.useFixture(fixtures.MockPatch(
            'yolo_nova.virt.first_boot.GlanceData.for_context',
            lambda context, image_id: first_boot.GlanceData(ks_session.Session(),
                                                            server.endpoint, image_id)))
        mount = mount_factory(base_dir, boot_images=tmp_path / 'boot-images')
        drvr = driver_tests.make_driver(glance)
        context = nova_context.get_admin_context()
        instance = driver_tests.make_instance(context, image_id)

        # Nova's fetch is never called: the disk is made over the base file being filled.
        disk = driver_tests.create_root_disk(drvr, context, instance, base_dir / name)
        info = images.info(disk)
        assert info['backing-filename'] == str(mount.mountpoint / name)
        assert info['virtual-size'] == 4 << 30
        assert not (base_dir / name).exists()
        fill = drvr.yolo_first_boots.running(name)
        assert fill is not None
        # Its boot is timed as a first boot before the download (streamed_boot_factor).
        assert drvr.yolo_report._served_from(instance) == 'streamed'

        driver_tests.start_with_driver(drvr, context, instance, disk)
        assert images.info(disk)['backing-filename'] == str(mount.mountpoint / name)
        with qemu.Guest(disk, console_log=tmp_path / 'boot.log') as guest:
            guest.wait_ready(driver_tests.BOOT_TIMEOUT)
            filled = fill._cursor
            assert fill.running and filled < os.path.getsize(image_cache), filled
            server.rate = 0
            assert fill.wait(600) and fill.outcome == 'complete', fill.reason
    assert filecmp.cmp(base_dir / name, image_cache, shallow=False)
    # As sparse as the base file Nova made (the test image's 2 GiB hold about 600 MiB of data).
    assert os.stat(base_dir / name).st_blocks * 512 < 1.1 * os.stat(image_cache).st_blocks * 512
    assert sorted(os.listdir(base_dir)) == [name]
    assert drvr.yolo_boot_images.has_boot_image(name, mount.client.status())
    print('guest ready with %d of %d bytes downloaded in order, %d ranges fetched on demand'
          % (filled, os.path.getsize(image_cache), len(server.ranges)))


def test_a_start_without_yolofs_waits_for_the_base_file(host, dirs, image_server, content):
    """A guest over a base file being filled that starts while yolofs is down, or a qemu-img
    run of Nova's: what Nova's normal first boot would have waited for, the download."""
    import fixtures
    from nova.tests import fixtures as nova_fixtures

    from yolo_common import images

    image_server.rate = 8 << 20
    fill = host.fill_raw(image_server, build_boot_image(dirs, content), sha256(content))
    host.backing.first_boots = host.first_boots
    disk = dirs / 'disk'
    images.create_overlay(host.backing.mount_path(NAME), disk, size=SIZE, open_backing=False)
    host.mount.stop()
    with fixtures.Fixture() as scope:
        scope.useFixture(nova_fixtures.PrivsepFixture())
        assert host.backing.place(str(disk)) == str(host.base_dir / NAME)
    assert fill.outcome == 'complete'
    assert (host.base_dir / NAME).read_bytes() == content
