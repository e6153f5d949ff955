"""Learning a base file's boot image from one real boot (yolofs record mode)."""

import dataclasses
import pathlib
import time

from yolo_common import images
from yolo_common import qemu
from yolo_common import yolofs


@dataclasses.dataclass(frozen=True)
class Learned:
    trace: pathlib.Path          # the reads of the boot, `OFFSET LENGTH` per line
    boot_image: pathlib.Path     # built from the trace, with its verification stamp
    boot_seconds: float          # the learning boot, QEMU start to ready
    build_seconds: float         # from the end of the window to the boot image on disk


def learn_boot_image(base, work, boot_timeout=900, **boot_options):
    """Boots ``base`` once through a learning yolofs mount of its directory and returns what was
    learned. The mount, its store (``work/boot-images``), socket and log live under ``work``.

    The window is ended with ``record_stop`` once the guest is ready: under TCG a guest can go
    longer than any sensible idle gap without reading its disk. ``boot_options`` go to
    :class:`yolo_common.qemu.Guest` (cache mode, console log, ...).
    """
    base, work = pathlib.Path(base), pathlib.Path(work)
    work.mkdir(parents=True, exist_ok=True)
    store = work / 'boot-images'
    with yolofs.Mount(source=base.parent, mountpoint=work / 'mnt', boot_images=store,
                      control_socket=work / 'control.sock', log_path=work / 'yolofs-learn.log',
                      learn=True, record_idle_secs=600) as mount:
        overlay = work / 'learn.qcow2'
        images.create_overlay(mount.mountpoint / base.name, overlay)
        try:
            boot_seconds = qemu.boot(overlay, timeout=boot_timeout, **boot_options)
        finally:
            overlay.unlink()
        window_closed = time.monotonic()
        mount.client.record_stop(base.name)
        build_seconds = time.monotonic() - window_closed
    return Learned(store / (base.name + '.trace'), store / (base.name + '.yolo'), boot_seconds,
                   build_seconds)
