"""The YOLO keys of a compute node's ``stats``: what compute nodes report, what the scheduler
reads.

Compute monitors cannot carry a disk I/O metric, so a host's load, its boot-time parameters and
its verified boot images travel as string keys of ``get_available_resource()['stats']``, which
reach the scheduler's ``HostState.stats`` at every periodic resource update (docs/scheduling.md,
"What hosts report"). The parameters' keys are the table's (yolo_nova.model.parameters).
"""

import dataclasses
import functools
import time

from yolo_nova.model import parameters
from yolo_nova.model import prediction

PREFIX = 'yolo_'
# The host's load, each key with its format; the optional ones are reported by the hosts that
# measure them.
LOAD = (('io_utilisation', '%.4f'), ('cpu_utilisation', '%.4f'))
OPTIONAL_LOAD = (('runnable', '%.3f'), ('idlest_cpu_utilisation', '%.4f'),
                 ('cpu_pressure', '%.4f'))
# Keys every report holds; a report without the others (an older host's) gets their defaults:
# the thesis' model.
KEYS = tuple(PREFIX + name for name, _ in LOAD) + tuple(
    p.stats_key for p in parameters.PARAMETERS if p.measured) + (
    PREFIX + 'boot_images', PREFIX + 'updated_at')
OPTIONAL_KEYS = tuple(p.stats_key for p in parameters.PARAMETERS if not p.measured) + tuple(
    PREFIX + name for name, _ in OPTIONAL_LOAD)


@dataclasses.dataclass(frozen=True)
class HostBootState:
    """What a host reported: its load, its model parameters, its verified boot images."""
    io_utilisation: float
    cpu_utilisation: float
    params: parameters.BootTimeParameters
    boot_images: frozenset
    updated_at: float
    runnable: float = None
    idlest_cpu_utilisation: float = None
    cpu_pressure: float = None

    def to_stats(self):
        stats = {PREFIX + name: fmt % getattr(self, name) for name, fmt in LOAD}
        stats.update((PREFIX + name, fmt % getattr(self, name)) for name, fmt in OPTIONAL_LOAD
                     if getattr(self, name) is not None)
        stats.update((p.stats_key, ('%d' if p.integer else '%.3f') % getattr(
            self.params, p.name)) for p in parameters.PARAMETERS)
        stats[PREFIX + 'boot_images'] = ','.join(sorted(self.boot_images))
        stats[PREFIX + 'updated_at'] = '%.0f' % self.updated_at
        return stats

    def predict(self, image_id, concurrent_boots):
        return prediction.predict(self.params, self.io_utilisation, self.cpu_utilisation,
                                  boot_image=image_id in self.boot_images,
                                  concurrent_boots=concurrent_boots, runnable=self.runnable,
                                  idlest_cpu=self.idlest_cpu_utilisation,
                                  cpu_pressure=self.cpu_pressure)


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
            updated_at=float(value[PREFIX + 'updated_at']),
            **{name: _optional_float(value[PREFIX + name]) for name, _ in OPTIONAL_LOAD})
    except (TypeError, ValueError, AttributeError):
        return None


def _parameter(parameter, value):
    # Those a calibration measures are in every report; the others, not reported (or reported
    # empty), have their default.
    if parameter.measured:
        return parameter.type(value)
    return parameter.type(value or parameter.default)


def _optional_float(value):
    return None if value is None else float(value)
