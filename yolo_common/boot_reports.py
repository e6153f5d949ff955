"""What a compute host reports of a boot to the worker: the blocks it read outside its boot image.

A boot served from a boot image that reads part of its base file outside it (the profiling boot
missed it: Nova's guests have a network, a config drive, another flavor) is a lesson for every
host. yolofs lists those reads per boot (``stats``: a boot's ``outside``); nova-compute sends
them to the worker as a notification on the worker's topic; the worker merges the reports of
many hosts into the next version of the published boot image (yolo_glance/fleet.py).

A report names extents of the base file, never any of its bytes: the worker builds boot images
from the image's own data. The payload is untrusted (any host, or anything holding the message
bus' credentials, can send one): :meth:`BootReport.from_payload` checks every field, and the
bounds below keep one report small.
"""

import dataclasses
import re

EVENT_TYPE = 'yolo.boot_image.boot_report'
# A report's extents, at most: a boot that reads more outside its boot image is cut, the first
# extents it read kept (what yolofs sends is already bounded by the boot image's size).
MAX_EXTENTS = 2048
# The most bytes one report's extents may name (the largest boot image a host takes).
MAX_BYTES = 1 << 30
MAX_FIELD_LENGTH = 255
# A Glance image id (a UUID): letters, digits and dashes, which also makes it a safe file name.
_IMAGE_ID = re.compile(r'^[0-9A-Za-z][0-9A-Za-z-]{0,63}$')


class BadReport(ValueError):
    """A payload that is not a boot report: ignored, with this reason."""


@dataclasses.dataclass(frozen=True)
class BootReport:
    """One boot's reads outside its boot image, on one host."""
    image_id: str           # the Glance image booted
    host: str               # the compute host that served it (as it says)
    boot: str               # the boot, unique on the host (its window's start and base file)
    extents: tuple          # ((offset, length), ...) of the base file, in the order first read
    source_size: int        # the base file's size, as the host sees it
    flavor: str = None      # the flavor of the guest, if the host knows it

    @property
    def bytes(self):
        return sum(length for _, length in self.extents)

    def to_payload(self):
        payload = dataclasses.asdict(self)
        payload['extents'] = [list(extent) for extent in self.extents]
        return payload

    @classmethod
    def from_payload(cls, payload):
        """The report in ``payload`` (a notification's), checked; raises BadReport."""
        if not isinstance(payload, dict):
            raise BadReport('not a mapping')
        fields = {}
        for name in ('image_id', 'host', 'boot'):
            fields[name] = _text(payload, name)
        if payload.get('flavor') is not None:
            fields['flavor'] = _text(payload, 'flavor')
        if not _IMAGE_ID.match(fields['image_id']):
            raise BadReport('image_id %r is not an image id' % fields['image_id'])
        size = payload.get('source_size')
        if not _is_int(size) or size <= 0:
            raise BadReport('source_size %.80r is not a positive integer' % (size,))
        extents = payload.get('extents')
        if not isinstance(extents, list) or not extents:
            raise BadReport('no extents')
        if len(extents) > MAX_EXTENTS:
            raise BadReport('%d extents, more than %d' % (len(extents), MAX_EXTENTS))
        checked, total = [], 0
        for extent in extents:
            if (not isinstance(extent, (list, tuple)) or len(extent) != 2
                    or not all(_is_int(n) for n in extent)):
                raise BadReport('extent %.80r is not [offset, length]' % (extent,))
            offset, length = extent
            if offset < 0 or length <= 0 or offset + length > size:
                raise BadReport('extent %r is not within the %d-byte base file' % (extent, size))
            total += length
            checked.append((offset, length))
        if total > MAX_BYTES:
            raise BadReport('%d bytes named, more than %d' % (total, MAX_BYTES))
        return cls(extents=tuple(checked), source_size=size, **fields)


def _text(payload, name):
    value = payload.get(name)
    if not isinstance(value, str) or not value or len(value) > MAX_FIELD_LENGTH:
        raise BadReport('%s %.80r is not a string of 1-%d characters'
                        % (name, value, MAX_FIELD_LENGTH))
    return value


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)
