"""When a guest leaves the mount, and what a start does with an interrupted detach."""

import threading

from yolo_nova.virt import detach


def window(name):
    """An open boot window in yolofs' status answer."""
    return {'name': name, 'reads': 120, 'seconds': 3.5, 'kind': 'observe'}


def test_a_boot_is_over_once_its_window_ended_and_it_settled():
    status = {'recording': [window('other-image')]}
    assert not detach.boot_is_over(status, {'image'}, 3, settle_seconds=10, max_seconds=600)
    assert detach.boot_is_over(status, {'image'}, 11, settle_seconds=10, max_seconds=600)


def test_a_boot_whose_window_is_open_waits_for_it_up_to_the_maximum():
    status = {'recording': [window('image')]}
    assert not detach.boot_is_over(status, {'image'}, 300, settle_seconds=10, max_seconds=600)
    assert detach.boot_is_over(status, {'image'}, 600, settle_seconds=10, max_seconds=600)


def test_a_yolofs_that_does_not_answer_is_a_reason_to_leave_at_once():
    assert detach.boot_is_over(None, {'image'}, 0, settle_seconds=10, max_seconds=600)


def test_a_start_takes_back_the_current_disk_of_an_interrupted_detach(tmp_path):
    disk = tmp_path / 'disk'
    disk.write_bytes(b'recreated, empty')
    (tmp_path / 'disk.yolo-detach').write_bytes(b'what the guest wrote')
    detach.recover(str(disk))
    assert disk.read_bytes() == b'what the guest wrote'
    assert not (tmp_path / 'disk.yolo-detach').exists()
    detach.recover(str(disk))
    assert disk.read_bytes() == b'what the guest wrote'


def test_the_detach_lock_is_one_per_instance_and_reentrant():
    first = detach.lock('a')
    assert detach.lock('a') is first and detach.lock('b') is not first
    with first, first:
        held = threading.Event()
        threading.Thread(target=lambda: held.set() if first.acquire(timeout=0) else None).start()
        assert not held.wait(0.2)
