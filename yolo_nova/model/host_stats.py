"""The YOLO keys of a compute node's ``stats``: what compute nodes report, what the scheduler
reads.

Compute monitors cannot carry a disk I/O metric, so a host's load, its boot-time parameters and
its verified boot images travel as string keys of ``get_available_resource()['stats']``, which
reach the scheduler's ``HostState.stats`` at every periodic resource update (docs/scheduling.md,
"What hosts report"). The parameters' keys are the table's (yolo_nova.model.parameters).
What a host holds travels as a Bloom filter (:mod:`.locality`); hosts from before it report their
verified boot images as a list, and are predicted as holding every base file, as they were.
"""

import dataclasses
import functools
import math
import time

from yolo_nova.model import locality
from yolo_nova.model import parameters
from yolo_nova.model import prediction

PREFIX = 'yolo_'
# The host's load, each key with its format; the optional ones are reported by the hosts that
# measure them.
LOAD = (('io_utilisation', '%.4f'), ('cpu_utilisation', '%.4f'))
OPTIONAL_LOAD = (('runnable', '%.3f'), ('idlest_cpu_utilisation', '%.4f'),
                 ('cpu_pressure', '%.4f'))
# A boot image's size against its base file's data, where a host has installed none to measure
# it on: a boot reads a few percent of its image.
DEFAULT_BOOT_IMAGE_RATIO = 0.05
# What a host holds (locality), each key with its format.
LOCALITY = (('held', '%s'), ('streams_first_boots', '%s'), ('boot_image_ratio', '%.4f'))
# Keys every report holds; a report without the others (an older host's) gets their defaults:
# the thesis' model.
KEYS = tuple(PREFIX + name for name, _ in LOAD) + tuple(
    p.stats_key for p in parameters.PARAMETERS if p.measured) + (
    PREFIX + 'boot_images', PREFIX + 'updated_at')
OPTIONAL_KEYS = tuple(p.stats_key for p in parameters.PARAMETERS if not p.measured) + tuple(
    PREFIX + name for name, _ in OPTIONAL_LOAD + LOCALITY)


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A host's predicted boot of an image: ``held``, once it holds the image (and its boot
    image, if it has one): what YoloBootFilter judges, so that no host is discarded only for
    lacking the image; ``total``, with what it must fetch first (``fetch``): what
    YoloBootTimeWeigher weighs."""
    held: float
    total: float
    fetch: prediction.Fetch


@dataclasses.dataclass(frozen=True)
class HostBootState:
    """What a host reported: its load, its model parameters and what it holds: a Bloom filter
    of its base files and verified boot images (``held``; None from a host before it, which
    reported its verified boot images as ``boot_images``)."""
    io_utilisation: float
    cpu_utilisation: float
    params: parameters.BootTimeParameters
    boot_images: frozenset
    updated_at: float
    runnable: float = None
    idlest_cpu_utilisation: float = None
    cpu_pressure: float = None
    held: locality.BloomFilter = None
    streams_first_boots: bool = False
    boot_image_ratio: float = DEFAULT_BOOT_IMAGE_RATIO
    # The filter's false-positive rate, as filled (0 without one).
    held_false_positives: float = 0.0

    def to_stats(self):
        stats = {PREFIX + name: fmt % getattr(self, name) for name, fmt in LOAD}
        stats.update((PREFIX + name, fmt % getattr(self, name)) for name, fmt in OPTIONAL_LOAD
                     if getattr(self, name) is not None)
        stats.update((p.stats_key, ('%d' if p.integer else '%.3f') % getattr(
            self.params, p.name)) for p in parameters.PARAMETERS)
        # With the filter, the list is empty: it grows with the catalogue (a scheduler from
        # before the filter then predicts every host without boot images).
        stats[PREFIX + 'boot_images'] = ('' if self.held is not None
                                         else ','.join(sorted(self.boot_images)))
        stats[PREFIX + 'updated_at'] = '%.0f' % self.updated_at
        if self.held is not None:
            stats[PREFIX + 'held'] = self.held.encode()
            stats[PREFIX + 'streams_first_boots'] = str(self.streams_first_boots).lower()
            stats[PREFIX + 'boot_image_ratio'] = '%.4f' % self.boot_image_ratio
        return stats

    def holds_base_file(self, image_id):
        if self.held is None:
            return True
        return locality.base_file_entry(locality.base_file_name(image_id)) in self.held

    def holds_boot_image(self, image_id):
        if self.held is None:
            return image_id in self.boot_images
        return locality.boot_image_entry(image_id) in self.held

    def _boot(self, boot_image, concurrent_boots):
        return prediction.predict(self.params, self.io_utilisation, self.cpu_utilisation,
                                  boot_image=boot_image, concurrent_boots=concurrent_boots,
                                  runnable=self.runnable,
                                  idlest_cpu=self.idlest_cpu_utilisation,
                                  cpu_pressure=self.cpu_pressure)

    def predict(self, image, concurrent_boots):
        """The Prediction of a boot of ``image`` (a prediction.RequestedImage)."""
        holds_boot_image = self.holds_boot_image(image.id)
        fetch = prediction.fetch(self.params, image, self.holds_base_file(image.id),
                                 holds_boot_image, self.streams_first_boots,
                                 self.boot_image_ratio)
        served = holds_boot_image or image.boot_image
        held = self._boot(served, concurrent_boots)
        after_fetch = held if fetch.boot_image == served else self._boot(
            fetch.boot_image, concurrent_boots)
        if fetch.path == 'streamed':
            # The image's download runs beside its first boot.
            after_fetch *= self.params.streamed_boot_factor
        return Prediction(held, fetch.seconds + after_fetch, fetch)


def from_stats(stats, max_age, now=None):
    """The host's state, or None if it reported none, reported garbage, or reported too long ago."""
    stats = stats or {}
    try:
        raw = tuple(stats[key] for key in KEYS)
    except KeyError:
        return None
    raw += tuple(stats.get(key) for key in OPTIONAL_KEYS)
    state = _parse(raw)
    if state is None or (now if now is not None else time.time()) - state.updated_at > max_age:
        return None
    return state


# The scheduler asks for every host at every request, but hosts report once a minute: parse each
# report once.
@functools.lru_cache(maxsize=4096)
def _parse(raw):
    value = dict(zip(KEYS + OPTIONAL_KEYS, raw))
    try:
        return HostBootState(
            io_utilisation=float(value[PREFIX + 'io_utilisation']),
            cpu_utilisation=float(value[PREFIX + 'cpu_utilisation']),
            params=parameters.BootTimeParameters(**{
                p.name: _parameter(p, value[p.stats_key]) for p in parameters.PARAMETERS}),
            boot_images=frozenset(i for i in value[PREFIX + 'boot_images'].split(',') if i),
            updated_at=_finite(float(value[PREFIX + 'updated_at'])),
            **{name: _optional_float(value[PREFIX + name]) for name, _ in OPTIONAL_LOAD},
            **_locality(value))
    except (TypeError, ValueError, AttributeError):
        return None


def _finite(number):
    # A report of nan or inf would never be too old.
    if not math.isfinite(number):
        raise ValueError('not a finite number: %r' % number)
    return number


def _locality(value):
    held = value[PREFIX + 'held']
    if not held:
        return {}
    bloom = locality.BloomFilter.decode(held)
    false_positives = bloom.false_positive_rate()
    if false_positives > locality.MAX_FALSE_POSITIVE_RATE:
        raise ValueError('a filter that holds %.0f%% of everything' % (100 * false_positives))
    ratio = _optional_float(value[PREFIX + 'boot_image_ratio'])
    return {'held': bloom, 'held_false_positives': false_positives,
            'streams_first_boots': value[PREFIX + 'streams_first_boots'] == 'true',
            # Bounded: a host's report may be wrong, a prediction must not be absurd.
            'boot_image_ratio': DEFAULT_BOOT_IMAGE_RATIO
            if ratio is None or not math.isfinite(ratio) else min(max(ratio, 0.0), 1.0)}


def _parameter(parameter, value):
    # Those a calibration measures are in every report; the others, not reported (or reported
    # empty), have their default.
    if parameter.measured:
        return parameter.type(value)
    return parameter.type(value or parameter.default)


def _optional_float(value):
    return None if value is None else float(value)
