"""What this host's boots read outside their boot images, sent to the worker (fleet learning).

yolofs lists, per boot it served from a boot image, the blocks the boot read outside it (its
``stats``: each boot's ``outside``). At each periodic resource update the driver sends the boots
it has not sent yet, of boot images installed from Glance, as notifications on the worker's topic
(``[yolo] boot_report_topic``); the worker merges the reports of every host into the next
version of the published boot image (yolo_glance/fleet.py), which hosts then install in place of
theirs. A report names extents, never bytes; sending one never delays or fails anything here.
"""

import collections
import os
import time

from oslo_log import log as logging
import oslo_messaging

from yolo_common import boot_reports
from yolo_common import yolofs

LOG = logging.getLogger(__name__)
# A boot's window opens at its first read of the base file: at most this long after the spawn
# began (a download, a conversion, the guest's firmware), and never before it.
SPAWN_TO_FIRST_READ_SECONDS = 900


def report_extents(outside):
    """``outside`` (a boot's, from yolofs) as a report may carry it: its first extents, within
    boot_reports' bounds (the first ones read first)."""
    extents, total = [], 0
    for offset, length in outside[:boot_reports.MAX_EXTENTS]:
        if total + length > boot_reports.MAX_BYTES:
            break
        extents.append((offset, length))
        total += length
    return tuple(extents)


class BootReporter:
    """Sends the worker the boots of this host's yolofs (``backing_files``' client) that read
    outside their boot images. ``notifier``: an oslo.messaging Notifier (by default, one on
    ``transport_url`` or Nova's notification transport, sending on ``topic``)."""

    def __init__(self, backing_files, host, topic, conf=None, notifier=None,
                 transport_url=None):
        self.backing_files = backing_files
        self.host = host
        self.topic = topic
        self._conf = conf
        self._transport_url = transport_url
        self._notifier = notifier
        # Base file name -> start of the newest boot reported. A restarted nova-compute sends
        # the boots yolofs still lists again: the worker counts a boot once.
        self._reported = {}
        self.sent = 0
        # (time, image id, flavor name) of the last spawns here: which flavor a boot was.
        self._spawns = collections.deque(maxlen=256)

    def spawning(self, image_id, flavor, now=None):
        """Nova spawns a guest of ``image_id`` with ``flavor`` (its name) here."""
        self._spawns.append((time.time() if now is None else now, image_id, flavor))

    def flavor_of(self, image_id, started_unix):
        """The flavor of the spawn of ``image_id`` whose boot started at ``started_unix``: the
        last one begun before it (within SPAWN_TO_FIRST_READ_SECONDS), or None."""
        for spawned, spawned_image, flavor in reversed(self._spawns):
            if spawned_image == image_id and \
                    started_unix - SPAWN_TO_FIRST_READ_SECONDS <= spawned <= started_unix + 1:
                return flavor
        return None

    @property
    def notifier(self):
        if self._notifier is None:
            transport = oslo_messaging.get_notification_transport(
                self._conf, url=self._transport_url)
            # One attempt: a broker that is down costs the periodic task a connection timeout,
            # never a wait for the broker (oslo.messaging's default retries for ever).
            self._notifier = oslo_messaging.Notifier(
                transport, publisher_id='yolo-compute.%s' % self.host, driver='messagingv2',
                topics=[self.topic], retry=0)
        return self._notifier

    def send_new(self, status):
        """Sends the boots not sent yet (``status``: yolofs' answer, which says which boot
        images were installed from Glance and for which image); returns how many it sent."""
        try:
            files = self.backing_files.client.stats()
        except (OSError, ValueError, yolofs.YolofsError) as e:
            LOG.warning('yolofs did not list its boots (no boot reports this time): %s', e)
            return 0
        sent = 0
        for name, stats in sorted(files.items()):
            entry = status.boot_images.get(name)
            # Learned here, the boot image is not the published one the worker merges into.
            if entry is None or entry.learned or not entry.image_id or not entry.verified:
                continue
            boots = [boot for boot in stats.get('boots') or ()
                     if boot['started_unix'] > self._reported.get(name, -1)]
            for boot in boots:
                self._reported[name] = max(self._reported.get(name, -1), boot['started_unix'])
                extents = report_extents(boot.get('outside') or ())
                if extents and self._send(name, entry.image_id, boot, extents):
                    sent += 1
        self.sent += sent
        return sent

    def _send(self, name, image_id, boot, extents):
        try:
            size = os.path.getsize(self.backing_files.base_path(name))
            report = boot_reports.BootReport(
                image_id=image_id, host=self.host, boot='%s@%d' % (name, boot['started_unix']),
                extents=extents, source_size=size,
                flavor=self.flavor_of(image_id, boot['started_unix']))
            self.notifier.info({}, boot_reports.EVENT_TYPE, report.to_payload())
        except Exception:
            LOG.exception('Could not send the boot report of image %s', image_id)
            return False
        LOG.info('Sent the worker what a boot of image %s read outside its boot image: %d '
                 'bytes in %d extents', image_id, report.bytes, len(extents))
        return True
