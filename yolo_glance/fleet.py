"""Fleet learning: the next version of a published boot image, from what hosts' boots read
outside it (yolo_common/boot_reports.py says what a host reports).

The worker keeps the reports per image (:class:`ReportStore`) and plans a merge
(:func:`plan_merge`): a block of the base file joins the boot image when enough boots read it
outside it. A block's *support* counts each host's boots that read it, at most ``host_votes``
of them, so that one host cannot carry a block alone past a ``threshold`` above that. The
published extents are kept whatever the reports say (a report adds, it never removes), and
what is added is bounded: the blocks with the most support first, up to ``max_bytes``.

What a host cannot do, honest or not: make the boot image hold bytes its image does not (the
worker builds it from the image's own data, and every host verifies it again), remove extents,
or grow it past the bound. What a lying host can do: add blocks up to the bound, costing
memory. Hosts' names are theirs to say (the message bus authenticates none of them apart):
anyone holding the bus' credentials can speak for many hosts, and the bound is what holds.
"""

import bisect
import collections
import dataclasses
import json
import logging
import os
import tempfile
import threading
import time

from yolo_common import boot_reports

LOG = logging.getLogger(__name__)

# A host's boots count at most this many times toward a block's support: by default a block
# needs boots on two hosts, so that neither one host nor one tenant's boots steered to one host
# (a user-data script reading odd blocks, say) grow the boot image of every host.
HOST_VOTES = 1
# Support a block needs to be merged. One boot's stray reads (a login, a cron job in its first
# minute) do not grow every host's boot image.
THRESHOLD = 2
# Hosts whose reports are kept per image (those heard from longest ago are dropped first).
MAX_HOSTS_PER_IMAGE = 64


@dataclasses.dataclass(frozen=True)
class MergeOptions:
    """How merges choose what to add (``[yolo_fleet]``)."""
    threshold: int = THRESHOLD
    host_votes: int = HOST_VOTES
    # A merge adds at most this share of what the boot image holds (1.0: it may double)...
    max_growth: float = 1.0
    # ...and never makes it hold more than this (the compute hosts' default limit).
    max_bytes: int = 1 << 30


@dataclasses.dataclass(frozen=True)
class MergePlan:
    """What a merge makes of a published boot image."""
    trace: tuple        # ((offset, length), ...): the published extents, then those added
    added: tuple        # ((offset, length, support), ...) added, most support first
    hosts: int          # hosts whose reports were counted
    boots: int          # boots counted
    flavors: tuple = ()     # the flavors of those boots that said theirs

    @property
    def added_bytes(self):
        return sum(length for _, length, _ in self.added)


def _aligned(extents, block_size, source_size):
    """``extents`` widened to whole blocks and cut at the file's end (the last block may be
    short), merged: sorted, disjoint (start, end) pairs."""
    spans = sorted((offset // block_size * block_size,
                    min(-(-(offset + length) // block_size) * block_size, source_size))
                   for offset, length in extents if offset < source_size and length > 0)
    merged = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(span) for span in merged]


def _sweep(weighted):
    """The sums of overlapping weighted spans: sorted, disjoint (start, end, weight) with
    weight > 0, from (start, end, weight) triples."""
    changes = collections.defaultdict(int)
    for start, end, weight in weighted:
        changes[start] += weight
        changes[end] -= weight
    out, level, previous = [], 0, None
    for point in sorted(changes):
        if level > 0 and point > previous:
            if out and out[-1][1] == previous and out[-1][2] == level:
                out[-1] = (out[-1][0], point, level)
            else:
                out.append((previous, point, level))
        level += changes[point]
        previous = point
    return out


def _minus(spans, covered):
    """The parts of (start, end, weight) ``spans`` outside the sorted, disjoint (start, end)
    pairs ``covered``."""
    starts = [start for start, _ in covered]
    out = []
    for start, end, weight in spans:
        index = max(bisect.bisect_right(starts, start) - 1, 0)
        position = start
        for covered_start, covered_end in covered[index:]:
            if covered_start >= end:
                break
            if covered_end <= position:
                continue
            if covered_start > position:
                out.append((position, covered_start, weight))
            position = max(position, covered_end)
        if position < end:
            out.append((position, end, weight))
    return out


def support(reports, block_size, source_size, host_votes=HOST_VOTES):
    """Each block's support among ``reports`` (BootReport): sorted, disjoint (start, end,
    support) spans of whole blocks. A boot counts once per block however often it read it; a
    host's boots count at most ``host_votes`` times."""
    by_host = collections.defaultdict(list)
    for report in reports:
        by_host[report.host].extend(
            (start, end, 1) for start, end in _aligned(report.extents, block_size, source_size))
    capped = []
    for spans in by_host.values():
        capped.extend((start, end, min(weight, host_votes)) for start, end, weight in
                      _sweep(spans))
    return _sweep(capped)


def plan_merge(published, reports, block_size, source_size, max_bytes, threshold=THRESHOLD,
               host_votes=HOST_VOTES):
    """The next version of a boot image whose extents are ``published`` ((offset, length) in
    the order its data is stored), with the blocks ``reports`` read outside it that have at
    least ``threshold`` support, the most supported first, as long as the whole stays within
    ``max_bytes``. Reports of another base file size are not counted."""
    reports = [r for r in reports if r.source_size == source_size]
    covered = _aligned(published, block_size, source_size)
    room = max_bytes - sum(end - start for start, end in covered)
    candidates = sorted((span for span in _minus(
        support(reports, block_size, source_size, host_votes), covered) if span[2] >= threshold),
        key=lambda span: (-span[2], span[0]))
    added = []
    for start, end, weight in candidates:
        if room < block_size:
            break
        end = min(end, start + room // block_size * block_size)
        added.append((start, end - start, weight))
        room -= end - start
    return MergePlan(
        trace=tuple(published) + tuple((offset, length) for offset, length, _ in added),
        added=tuple(added), hosts=len({r.host for r in reports}), boots=len(reports),
        flavors=tuple(sorted({r.flavor for r in reports if r.flavor})))


class ReportStore:
    """The boot reports the worker has received, per image, in ``directory`` (a JSON file per
    image, replaced whole). Per host it keeps the last ``host_votes`` boots (more could not add
    support), per image the ``max_hosts`` hosts heard from last, none older than
    ``max_age_seconds``; a boot reported twice counts once."""

    def __init__(self, directory, host_votes=HOST_VOTES, max_hosts=MAX_HOSTS_PER_IMAGE,
                 max_age_seconds=30 * 86400, clock=time.time):
        self.directory = directory
        self.host_votes = host_votes
        self.max_hosts = max_hosts
        self.max_age_seconds = max_age_seconds
        self.clock = clock
        self.lock = threading.Lock()
        os.makedirs(directory, mode=0o700, exist_ok=True)

    def _path(self, image_id):
        # from_payload checked the id's characters: no path separators.
        return os.path.join(self.directory, image_id + '.json')

    def _load(self, image_id):
        path = self._path(image_id)
        try:
            with open(path) as f:
                hosts = json.load(f)
            if isinstance(hosts, dict):
                return hosts
        except FileNotFoundError:
            return {}
        except ValueError:
            pass
        # Damaged (a disk error, an editor): set aside for a look, and start again.
        LOG.error('%s is not a report file: moved to %s.bad', path, path)
        os.replace(path, path + '.bad')
        return {}

    def _save(self, image_id, hosts):
        fd, staged = tempfile.mkstemp(dir=self.directory, suffix='.part')
        try:
            with os.fdopen(fd, 'w') as f:
                json.dump(hosts, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(staged, self._path(image_id))
        except BaseException:
            os.unlink(staged)
            raise

    def add(self, report):
        """Keeps ``report`` (a BootReport); returns whether it is new."""
        now = self.clock()
        with self.lock:
            hosts = self._fresh(self._load(report.image_id), now)
            boots = hosts.setdefault(report.host, [])
            if any(boot['payload']['boot'] == report.boot for boot in boots):
                return False
            boots.append({'received': now, 'payload': report.to_payload()})
            del boots[:-self.host_votes]
            if len(hosts) > self.max_hosts:
                for host in sorted(hosts, key=lambda h: hosts[h][-1]['received'])[
                        :len(hosts) - self.max_hosts]:
                    del hosts[host]
            self._save(report.image_id, hosts)
            return True

    def reports(self, image_id):
        """The reports kept for ``image_id`` (BootReport)."""
        with self.lock:
            hosts = self._fresh(self._load(image_id), self.clock())
        reports = []
        for boots in hosts.values():
            for boot in boots:
                try:
                    reports.append(boot_reports.BootReport.from_payload(boot['payload']))
                except (boot_reports.BadReport, KeyError, TypeError) as e:
                    LOG.error('%s: a kept report is not one (%s): not counted', image_id, e)
        return reports

    def image_ids(self):
        """The images with reports kept."""
        with self.lock:
            return sorted(name[:-len('.json')] for name in os.listdir(self.directory)
                          if name.endswith('.json'))

    def forget(self, image_id):
        """Drops the reports of ``image_id`` (deleted)."""
        with self.lock:
            try:
                os.unlink(self._path(image_id))
            except FileNotFoundError:
                pass

    def _fresh(self, hosts, now):
        kept = {}
        for host, boots in hosts.items():
            boots = [b for b in boots if isinstance(b, dict)
                     and now - b.get('received', 0) <= self.max_age_seconds]
            if boots:
                kept[host] = boots
        return kept
