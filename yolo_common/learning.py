"""Learning a base file's boot image from one real boot (yolofs record mode)."""

import dataclasses
import pathlib
import time

from yolo_common import images
from yolo_common import qemu
from yolo_common import yolofs


class LearningFailed(qemu.GuestFailed):
    """The profiling boot taught nothing usable (the guest died early, or read nothing)."""


@dataclasses.dataclass(frozen=True)
class Learned:
    trace: pathlib.Path          # the reads of the boot, `OFFSET LENGTH` per line
    boot_image: pathlib.Path     # built from the trace, with its verification stamp
    boot_seconds: float          # the learning boot, QEMU start to the end of the window
    build_seconds: float         # from the end of the window to the boot image on disk
    ended_by: str = 'ready'      # 'ready' (console pattern), 'idle' or 'max' (yolofs' window)


def learn_boot_image(base, work, boot_timeout=900, idle_seconds=None, sandbox=None,
                     yolofs_binary=None, **boot_options):
    """Boots ``base`` once through a learning yolofs mount of its directory and returns what was
    learned. The mount, its store (``work/boot-images``), socket and log live under ``work``,
    the guest's overlay in ``work/guest``. ``sandbox`` (a ``yolo_glance.sandbox.Sandbox``):
    QEMU runs in it, seeing the mount (read-only) and the overlay's directory only.

    The window ends when the guest is ready (``ready_marker`` on its console, ended with
    ``record_stop``), or, if ``idle_seconds`` is given, when yolofs sees that long without a
    read, or after ``boot_timeout`` seconds. Without ``idle_seconds`` a guest that is not ready
    in time raises ``qemu.BootTimeout``: under TCG a guest can go longer than any sensible idle
    gap without reading its disk. ``yolofs_binary``: the yolofs command (see
    :func:`yolo_common.yolofs.binary`). ``boot_options`` go to :class:`yolo_common.qemu.Guest`.
    """
    base, work = pathlib.Path(base), pathlib.Path(work)
    work.mkdir(parents=True, exist_ok=True)
    store = work / 'boot-images'
    window = {'record_idle_secs': idle_seconds or boot_timeout + 60,
              'record_max_secs': boot_timeout if idle_seconds else boot_timeout + 60}
    with yolofs.Mount(source=base.parent, mountpoint=work / 'mnt', boot_images=store,
                      control_socket=work / 'control.sock', log_path=work / 'yolofs-learn.log',
                      learn=True, yolofs_binary=yolofs_binary, **window) as mount:
        guest_dir = work / 'guest'
        guest_dir.mkdir(exist_ok=True)
        overlay = guest_dir / 'learn.qcow2'
        images.create_overlay(mount.mountpoint / base.name, overlay)
        if sandbox is not None:
            boot_options['wrapper'] = sandbox.wrapper(read_only=[mount.mountpoint],
                                                      writable=[guest_dir])
            boot_options['preexec_fn'] = sandbox.set_limits
        try:
            with qemu.Guest(overlay, **boot_options) as guest:
                if idle_seconds is None:
                    guest.wait_ready(boot_timeout)
                    ended_by = 'ready'
                else:
                    ended_by = _wait_for_window(guest, mount, base.name, boot_timeout)
                boot_seconds = time.monotonic() - guest.started
        finally:
            overlay.unlink()
        window_closed = time.monotonic()
        if ended_by == 'ready':
            mount.client.record_stop(base.name)
    # yolofs finishes the builds it has started before it exits.
    build_seconds = time.monotonic() - window_closed
    boot_image = store / (base.name + '.yolo')
    if not boot_image.exists():
        raise LearningFailed('the profiling boot of %s read nothing (ended by %s)'
                             % (base.name, ended_by))
    return Learned(store / (base.name + '.trace'), boot_image, boot_seconds, build_seconds,
                   ended_by)


def _wait_for_window(guest, mount, name, timeout):
    """Until the guest is ready or yolofs ends the recording window (idle gap, maximum)."""
    seen_recording = False
    deadline = time.monotonic() + timeout + 30
    while time.monotonic() < deadline:
        if guest.ready:
            return 'ready'
        if guest.process.poll() is not None:
            raise LearningFailed('QEMU exited with %d before the guest was ready; console '
                                 'tail: %r' % (guest.process.returncode, guest.console_tail()),
                                 guest.stderr_tail())
        if name in mount.client.status().recording:
            seen_recording = True
        elif seen_recording:
            elapsed = time.monotonic() - guest.started
            return 'max' if elapsed >= timeout - 1 else 'idle'
        time.sleep(0.5)
    raise LearningFailed('the recording window of %s never ended' % name)
