"""When a guest leaves the mount, and what starts do with an interrupted detach."""

import subprocess
import threading
import time

import pytest

from yolo_common import images
from yolo_common import yolofs
from yolo_nova.virt import detach


def window(name):
    """An open boot window in yolofs' status answer."""
    return {'name': name, 'reads': 120, 'seconds': 3.5, 'kind': 'observe'}


def over(status, elapsed, window_seen=True):
    return detach.boot_is_over(status, {'image'}, elapsed, settle_seconds=10, max_seconds=600,
                               window_seen=window_seen)


def test_a_boot_is_over_once_its_window_ended_and_it_settled():
    status = yolofs.Status.from_answer({'recording': [window('other-image')]})
    assert not over(status, 3)
    assert over(status, 11)


def test_a_boot_whose_window_is_open_waits_for_it_up_to_the_maximum():
    status = yolofs.Status.from_answer({'recording': [window('image')]})
    assert not over(status, 300)
    assert over(status, 600)


def test_a_guest_that_has_not_begun_to_read_is_not_over_its_boot():
    # Paused until its network is plugged, say: no window has opened yet.
    assert not over(yolofs.Status.from_answer({'recording': []}), 120, window_seen=False)
    assert over(yolofs.Status.from_answer({'recording': []}), 600, window_seen=False)


def test_a_yolofs_that_does_not_answer_is_a_reason_to_leave_at_once():
    assert over(None, 0, window_seen=False)


def qcow2(path, data=None):
    """A qcow2 overlay (of a 1 MiB backing file), with ``data`` written at 64 KiB if given."""
    backing = path.parent / 'base'
    if not backing.exists():
        backing.write_bytes(bytes(1 << 20))
    images.create_overlay(backing, path)
    if data is not None:
        subprocess.run(['qemu-io', '-f', 'qcow2', '-c', 'write -P %d 64k 4k' % data, str(path)],
                       check=True, capture_output=True)
    return path


def pattern_at_64k(path):
    out = subprocess.run(['qemu-io', '-f', 'qcow2', '-r', '-c', 'read -v 64k 1', str(path)],
                         check=True, capture_output=True, text=True).stdout
    return int(out.split()[1], 16)


def test_a_start_takes_back_the_interim_disk_the_guest_was_on(tmp_path):
    # The second copy had begun (disk holds some of it): the guest was on the interim disk.
    disk = qcow2(tmp_path / 'disk', data=6)
    interim = qcow2(tmp_path / 'disk.yolo-detach', data=7)
    detach.mark(str(interim), str(interim))
    detach.recover(str(disk))
    assert pattern_at_64k(disk) == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ['base', 'disk']
    # The second pivot under way, disk still empty: the interim disk is the guest's.
    interim = qcow2(tmp_path / 'disk.yolo-detach', data=8)
    disk.unlink()
    qcow2(disk)
    detach.mark(str(interim), str(interim), pivoting=True)
    detach.recover(str(disk))
    assert pattern_at_64k(disk) == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ['base', 'disk']


@pytest.mark.parametrize('before_the_pivot', ['disk', 'disk.yolo-detach'],
                         ids=['first_pivot', 'second_pivot'])
def test_an_unknown_pivot_keeps_both_disks_and_starts_on_the_one_before_it(
        tmp_path, caplog, before_the_pivot):
    # The pivot away from before_the_pivot was asked for when libvirt's answer was lost.
    disk = qcow2(tmp_path / 'disk', data=1)
    interim = qcow2(tmp_path / 'disk.yolo-detach', data=2)
    detach.mark(str(interim), str(tmp_path / before_the_pivot), pivoting=True)
    detach.recover(str(disk))
    started, kept_data = (1, 2) if before_the_pivot == 'disk' else (2, 1)
    assert pattern_at_64k(disk) == started
    [kept] = tmp_path.glob('disk.yolo-kept-*')
    assert pattern_at_64k(kept) == kept_data
    assert not interim.exists() and detach.read_mark(str(interim)) is None
    assert 'ALARM' in caplog.text and kept.name in caplog.text


def test_a_start_removes_an_unmarked_interim_copy(tmp_path):
    disk = tmp_path / 'disk'
    disk.write_bytes(b'the current disk')
    (tmp_path / 'disk.yolo-detach').write_bytes(b'a copy whose pivot never happened')
    detach.recover(str(disk))
    assert disk.read_bytes() == b'the current disk'
    assert list(tmp_path.iterdir()) == [disk]


def domain(source):
    return ("<domain><devices><disk type='file'><driver type='qcow2'/>"
            "<source file='%s'/><target dev='vda'/></disk></devices></domain>" % source)


def test_nova_computes_start_settles_marks_with_what_libvirt_says(tmp_path):
    disk, interim = tmp_path / 'disk', tmp_path / 'disk.yolo-detach'
    interim.write_bytes(b'current')
    # A running guest on the interim disk: marked, and returned to be moved back.
    assert detach.reconcile(domain(interim), running=True) == [('vda', str(interim))]
    assert detach.read_mark(str(interim)) == (interim.name, False, False)
    # A running guest on disk: what the detach left is stale.
    assert detach.reconcile(domain(disk), running=True) == []
    assert not interim.exists() and detach.read_mark(str(interim)) is None


def test_a_stopped_guests_definition_settles_only_an_unknown_pivot_and_only_if_reliable(
        tmp_path):
    interim = tmp_path / 'disk.yolo-detach'

    def left(marked, names, reliable):
        interim.write_bytes(b'interim')
        if marked:
            detach.mark(str(interim), str(tmp_path / marked[0]), pivoting=marked[1])
        else:
            detach.remove_mark(str(interim))
        detach.reconcile(domain(tmp_path / names), running=False,
                         definition_reliable=lambda _: reliable)
        marked = detach.read_mark(str(interim))
        return interim.exists(), marked and marked[:2]

    # The first pivot's outcome unknown: libvirt's definition names disk, it did not happen.
    assert left(('disk', True), 'disk', True) == (False, None)
    # It names the interim disk: it happened.
    assert left(('disk', True), 'disk.yolo-detach', True) == (True, (interim.name, False))
    # The second pivot took effect.
    assert left(('disk.yolo-detach', True), 'disk', True) == (False, None)
    # After a host restart the definition may be older than the pivot: left to the start.
    assert left(('disk.yolo-detach', True), 'disk', False) == (True, (interim.name, True))
    # A mark that knows, or none: the definition is not asked.
    assert left(('disk.yolo-detach', False), 'disk', True) == (True, (interim.name, False))
    assert left(None, 'disk.yolo-detach', True) == (True, None)


def test_a_disk_libvirt_lost_track_of_is_settled_by_its_mark_alone(tmp_path):
    # libvirt named disk after a pivot that QEMU's locks say took effect (detach.pivot): the
    # mark names the interim disk; libvirt's XML, live or not, is not asked.
    disk = qcow2(tmp_path / 'disk', data=1)
    interim = qcow2(tmp_path / 'disk.yolo-detach', data=2)
    detach.mark(str(interim), str(interim), libvirt_unsure=True)
    assert detach.unsure_disks(domain(disk)) == [str(disk)]
    for running in (True, False):
        assert detach.reconcile(domain(disk), running=running,
                                definition_reliable=lambda _: True) == []
        assert interim.exists()
    detach.recover(str(disk))
    assert pattern_at_64k(disk) == 2 and list(tmp_path.glob('disk.yolo-kept-*')) == []
    # QEMU found on disk: the interim file goes.
    interim = qcow2(tmp_path / 'disk.yolo-detach', data=3)
    detach.mark(str(interim), str(disk), libvirt_unsure=True)
    detach.recover(str(disk))
    assert pattern_at_64k(disk) == 2 and not interim.exists()


def test_a_mark_that_cannot_be_read_keeps_both_files(tmp_path):
    disk = qcow2(tmp_path / 'disk', data=1)
    qcow2(tmp_path / 'disk.yolo-detach', data=2)
    (tmp_path / 'disk.yolo-detach.current').write_text('')
    detach.recover(str(disk))
    assert pattern_at_64k(disk) == 1
    [kept] = tmp_path.glob('disk.yolo-kept-*')
    assert pattern_at_64k(kept) == 2


def test_a_start_over_a_disk_it_cannot_settle_fails(tmp_path, monkeypatch):
    disk = qcow2(tmp_path / 'disk', data=1)
    interim = qcow2(tmp_path / 'disk.yolo-detach', data=2)
    detach.mark(str(interim), str(disk), pivoting=True)
    monkeypatch.setenv('PATH', str(tmp_path))     # no qemu-img: holds_data cannot tell
    with pytest.raises(OSError):
        detach.recover(str(disk))
    assert interim.exists() and detach.read_mark(str(interim)) == (disk.name, True, False)


def test_the_detach_lock_is_one_per_instance_and_reentrant():
    first = detach.lock('a')
    assert detach.lock('a') is first and detach.lock('b') is not first
    with first, first:
        held = threading.Event()
        threading.Thread(target=lambda: held.set() if first.acquire(timeout=0) else None).start()
        assert not held.wait(0.2)


def test_a_guest_over_a_base_file_being_filled_stays_until_the_file_is_there(tmp_path):
    # docs/first-boot.md: the copies' destination is the base file, not there before its fill
    # has ended.
    class BackingFiles:
        def status(self):
            return yolofs.Status.from_answer({'recording': []})

        def base_path(self, name):
            return str(tmp_path / name)

    detacher = detach.Detacher(BackingFiles(), lambda uuid: None, settle_seconds=0,
                               max_seconds=0)
    watched = {'u': detach.Watch('u', frozenset(['base']), time.monotonic() - 10)}
    detacher._detach_finished_boots(watched)
    assert 'u' in watched
    (tmp_path / 'base').write_bytes(b'')
    detacher._detach_finished_boots(watched)
    assert watched == {}
