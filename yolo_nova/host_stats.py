"""The YOLO keys of a compute node's ``stats``: what compute nodes report, what the scheduler
reads.

Compute monitors cannot carry a disk I/O metric, so a host's load, its calibrated boot-time
parameters and its verified boot images travel as string keys of
``get_available_resource()['stats']``, which reach the scheduler's ``HostState.stats`` at every
periodic resource update. No Nova imports: both sides use this module.
"""

import dataclasses
import functools
import time

from yolo_nova import boot_model

PREFIX = 'yolo_'
KEYS = ('io_utilisation', 'cpu_utilisation', 'alpha', 'beta', 'alpha_yolo', 'cpus',
        'boot_images', 'updated_at')
# Reported by newer hosts; a host without them gets the thesis' model.
OPTIONAL_KEYS = ('io_exponent', 'runnable', 'idlest_cpu_utilisation', 'cpu_contention',
                 'cpu_pressure', 'beta_growth', 'io_pole', 'io_pole_yolo')


@dataclasses.dataclass(frozen=True)
class HostBootState:
    """What a host reported: its load, its model parameters, its verified boot images."""
    io_utilisation: float
    cpu_utilisation: float
    params: boot_model.BootTimeParameters
    boot_images: frozenset
    updated_at: float
    runnable: float = None
    idlest_cpu_utilisation: float = None
    cpu_pressure: float = None

    def to_stats(self):
        optional = {PREFIX + 'io_exponent': '%.3f' % self.params.io_exponent,
                    PREFIX + 'cpu_contention': '%.3f' % self.params.cpu_contention,
                    PREFIX + 'beta_growth': '%.3f' % self.params.beta_growth,
                    PREFIX + 'io_pole': '%.3f' % self.params.io_pole,
                    PREFIX + 'io_pole_yolo': '%.3f' % self.params.io_pole_yolo}
        if self.runnable is not None:
            optional[PREFIX + 'runnable'] = '%.3f' % self.runnable
        if self.idlest_cpu_utilisation is not None:
            optional[PREFIX + 'idlest_cpu_utilisation'] = '%.4f' % self.idlest_cpu_utilisation
        if self.cpu_pressure is not None:
            optional[PREFIX + 'cpu_pressure'] = '%.4f' % self.cpu_pressure
        return {
            **optional,
            PREFIX + 'io_utilisation': '%.4f' % self.io_utilisation,
            PREFIX + 'cpu_utilisation': '%.4f' % self.cpu_utilisation,
            PREFIX + 'alpha': '%.3f' % self.params.alpha,
            PREFIX + 'beta': '%.3f' % self.params.beta,
            PREFIX + 'alpha_yolo': '%.3f' % self.params.alpha_yolo,
            PREFIX + 'cpus': str(self.params.cpus),
            PREFIX + 'boot_images': ','.join(sorted(self.boot_images)),
            PREFIX + 'updated_at': '%.0f' % self.updated_at,
        }

    def predict(self, image_id, concurrent_boots):
        return boot_model.predict(self.params, self.io_utilisation, self.cpu_utilisation,
                                  boot_image=image_id in self.boot_images,
                                  concurrent_boots=concurrent_boots, runnable=self.runnable,
                                  idlest_cpu=self.idlest_cpu_utilisation,
                                  cpu_pressure=self.cpu_pressure)


def from_stats(stats, max_age, now=None):
    """The host's state, or None if it reported none, reported garbage, or reported too long ago."""
    stats = stats or {}
    try:
        raw = tuple(stats[PREFIX + key] for key in KEYS)
    except KeyError:
        return None
    raw += tuple(stats.get(PREFIX + key) for key in OPTIONAL_KEYS)
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
            io_utilisation=float(value['io_utilisation']),
            cpu_utilisation=float(value['cpu_utilisation']),
            params=boot_model.BootTimeParameters(
                alpha=float(value['alpha']), beta=float(value['beta']),
                alpha_yolo=float(value['alpha_yolo']), cpus=int(value['cpus']),
                io_exponent=float(value['io_exponent'] or 1.0),
                cpu_contention=float(value['cpu_contention'] or 1.0),
                beta_growth=float(value['beta_growth'] or 0.0),
                io_pole=float(value['io_pole'] or 1.0),
                io_pole_yolo=float(value['io_pole_yolo'] or 1.0)),
            boot_images=frozenset(i for i in value['boot_images'].split(',') if i),
            updated_at=float(value['updated_at']),
            runnable=_optional_float(value['runnable']),
            idlest_cpu_utilisation=_optional_float(value['idlest_cpu_utilisation']),
            cpu_pressure=_optional_float(value['cpu_pressure']))
    except (TypeError, ValueError, AttributeError):
        return None


def _optional_float(value):
    return None if value is None else float(value)
