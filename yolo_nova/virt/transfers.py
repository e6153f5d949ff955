"""This host's rate from Glance and of Nova's conversions to raw, from its own transfers.

No probing traffic: the rates come from what the host moves anyway, Nova's downloads of images
and their conversions (nova_patches), and the first-boot fills' downloads (first_boot). The host
reports them (host_report) as the model's ``glance_bytes_per_second`` and
``convert_bytes_per_second``, unless an operator set those ``[yolo]`` options. Kept in a file
(``[yolo] transfers_file``): a restarted nova-compute reports what it measured before.
"""

import collections
import json
import os
import threading

from oslo_log import log as logging
from oslo_utils import fileutils

LOG = logging.getLogger(__name__)

DOWNLOAD, CONVERSION = 'download', 'conversion'
KINDS = (DOWNLOAD, CONVERSION)
# The rate is the bytes over the seconds of the last KEEP transfers of a kind: a link that
# changed shows within a few downloads, one slow download does not decide it.
KEEP = 20
# Smaller transfers measure the latency of a request more than the rate of a link.
MIN_BYTES = 8 << 20


class Transfers:
    """The last transfers of each kind, kept in the JSON file at ``path`` (None: in memory)."""

    def __init__(self, path):
        self.path = path
        self._lock = threading.Lock()
        self._last = {kind: collections.deque(maxlen=KEEP) for kind in KINDS}
        self._load()

    def _load(self):
        if not self.path:
            return
        try:
            with open(self.path) as f:
                kept = json.load(f)
            for kind in KINDS:
                for nbytes, seconds in kept.get(kind, []):
                    self._add(kind, int(nbytes), float(seconds))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, AttributeError) as e:
            LOG.warning('Ignoring the transfers kept in %s: %s', self.path, e)

    def _add(self, kind, nbytes, seconds):
        if nbytes >= MIN_BYTES and seconds > 0:
            self._last[kind].append((nbytes, seconds))
            return True
        return False

    def record(self, kind, nbytes, seconds):
        """A transfer of ``nbytes`` bytes that took ``seconds``; never raises."""
        with self._lock:
            if not self._add(kind, nbytes, seconds) or not self.path:
                return
            kept = {k: list(v) for k, v in self._last.items()}
            try:
                fileutils.ensure_tree(os.path.dirname(self.path))
                with open(self.path + '.tmp', 'w') as f:
                    json.dump(kept, f)
                os.replace(self.path + '.tmp', self.path)
            except OSError as e:
                LOG.warning('Could not keep the transfers in %s: %s', self.path, e)

    def rate(self, kind):
        """Bytes a second over the last transfers of ``kind``, or None if there were none."""
        with self._lock:
            last = list(self._last[kind])
        if not last:
            return None
        return sum(n for n, _ in last) / sum(s for _, s in last)
