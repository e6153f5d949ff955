"""The console of a guest: watched for its ready marker, logged within a bound."""

import pytest

from yolo_common import qemu


def test_a_guest_that_prints_without_end_fills_its_log_only_up_to_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(qemu, 'CONSOLE_LOG_LIMIT', 1 << 20)
    log = tmp_path / 'console.log'
    guest = qemu.Guest(tmp_path / 'disk', console_log=str(log))
    # The guest's stand-in: 8 MiB of output, then the marker.
    guest.command = ['sh', '-c', 'head -c 8388608 /dev/zero | tr "\\0" x; echo; '
                     'echo YOLO-GUEST-READY; sleep 30']
    with guest:
        guest.wait_ready(timeout=60)
    # The marker after the limit is still seen, and the log stopped at the limit.
    assert guest.ready
    data = log.read_bytes()
    assert data.startswith(b'x' * (1 << 20))
    assert data[1 << 20:] == b'\n[console log truncated]\n'


def test_what_qemu_says_is_kept_apart_from_the_guests_console(tmp_path):
    # The image's owner reads why its guest failed (the console); QEMU's and its sandbox's
    # messages name the host's paths and are for the worker's log only.
    guest = qemu.Guest(tmp_path / 'disk')
    guest.command = ['sh', '-c', 'echo "SeaBIOS: booting from hard disk"; '
                     'echo "qemu: /var/lib/yolo/worker/x/disk: Permission denied" >&2; exit 1']
    with guest:
        with pytest.raises(qemu.BootTimeout) as failed:
            guest.wait_ready(timeout=60)
    assert 'SeaBIOS: booting from hard disk' in str(failed.value)
    assert '/var/lib/yolo' not in str(failed.value)
    assert failed.value.qemu_stderr == 'qemu: /var/lib/yolo/worker/x/disk: Permission denied'
