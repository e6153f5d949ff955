"""When a guest leaves the mount, and what starts do with an interrupted detach."""

import threading
import time

from yolo_nova.virt import detach


def window(name):
    """An open boot window in yolofs' status answer."""
    return {'name': name, 'reads': 120, 'seconds': 3.5, 'kind': 'observe'}


def over(status, elapsed, window_seen=True):
    return detach.boot_is_over(status, {'image'}, elapsed, settle_seconds=10, max_seconds=600,
                               window_seen=window_seen)


def test_a_boot_is_over_once_its_window_ended_and_it_settled():
    status = {'recording': [window('other-image')]}
    assert not over(status, 3)
    assert over(status, 11)


def test_a_boot_whose_window_is_open_waits_for_it_up_to_the_maximum():
    status = {'recording': [window('image')]}
    assert not over(status, 300)
    assert over(status, 600)


def test_a_guest_that_has_not_begun_to_read_is_not_over_its_boot():
    # Paused until its network is plugged, say: no window has opened yet.
    assert not over({'recording': []}, 120, window_seen=False)
    assert over({'recording': []}, 600, window_seen=False)


def test_a_yolofs_that_does_not_answer_is_a_reason_to_leave_at_once():
    assert over(None, 0, window_seen=False)


def test_a_start_takes_back_the_marked_current_disk_of_an_interrupted_detach(tmp_path):
    disk = tmp_path / 'disk'
    disk.write_bytes(b'recreated, empty')
    interim = tmp_path / 'disk.yolo-detach'
    interim.write_bytes(b'what the guest wrote')
    detach.mark_current(str(interim))
    detach.recover(str(disk))
    assert disk.read_bytes() == b'what the guest wrote'
    assert list(tmp_path.iterdir()) == [disk]


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


def test_nova_computes_start_marks_the_interim_disk_libvirt_names(tmp_path):
    interim = tmp_path / 'disk.yolo-detach'
    interim.write_bytes(b'current')
    assert detach.reconcile(domain(tmp_path / 'disk')) == []
    assert detach.reconcile(domain(interim)) == [str(interim)]
    assert (tmp_path / 'disk.yolo-detach.current').exists()
    assert detach.reconcile(domain(interim)) == []


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
            return {'recording': []}

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
