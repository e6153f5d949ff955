"""End to end: learn a boot image from a real QEMU boot, then boot from it.

The test image is converted to raw as Nova does (``_base/<sha1(image id)>``). A first boot runs
with a qcow2 overlay whose backing file is on a learning yolofs mount; once the guest reports sshd
started, the recording window is closed with ``record_stop`` and the boot image is built. A second
boot, through a serving mount with the boot image preloaded, must reach ready with most of its read
bytes served from the boot image.
"""

import json

from yolo_common import images
from yolo_common import qemu
from yolo_common import yolofs

BOOT_TIMEOUT = 900


def boot_through(mount, base, overlay, console_log):
    images.create_overlay(mount.mountpoint / base.name, overlay)
    backing = images.info(overlay)['backing-filename']
    assert backing == str(mount.mountpoint / base.name)
    with qemu.Guest(overlay, console_log=console_log) as guest:
        seconds = guest.wait_ready(BOOT_TIMEOUT)
    overlay.unlink()
    return seconds


def test_learn_then_boot_from_the_boot_image(image_cache, mount_factory, tmp_path):
    base = image_cache
    store = tmp_path / 'boot-images'

    # 1. Learn: the window is ended by a control request once the guest is ready.
    learning = mount_factory(base.parent, boot_images=store, learn=True,
                             record_idle_secs=600, record_max_secs=1800)
    boot_through(learning, base, tmp_path / 'learn.qcow2', tmp_path / 'learn-console.log')
    assert learning.client.record_stop(base.name)['built'] is True
    learning.stop()

    boot_image = store / (base.name + '.yolo')
    info = json.loads(yolofs.run('inspect', '--json', boot_image).stdout)
    assert info['identity']['source_size'] == base.stat().st_size
    # A boot reads a few percent of the image, not all of it.
    assert 1 << 20 < info['covered_bytes'] < base.stat().st_size // 4, info
    yolofs.run('verify', boot_image, base)

    # 2. Serve: the second boot reads mostly from the boot image.
    serving = mount_factory(base.parent, boot_images=store, mlock=True)
    serving.client.preload(base.name)
    boot_through(serving, base, tmp_path / 'serve.qcow2', tmp_path / 'serve-console.log')
    stats = serving.client.stats(base.name)[base.name]
    read = stats['bytes_memory'] + stats['bytes_passthrough']
    assert read > 1 << 20, stats
    assert stats['bytes_memory'] / read > 0.8, stats
    assert stats['errors'] == 0, stats
