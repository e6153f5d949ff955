"""A host's calibration: its boot-time parameters and its disk's capacity, in one JSON file.

``yolo-calibrate`` writes it on a compute node (``[yolo] calibration_file``); the compute driver
reports what it holds, or what the host's own boots give, to the scheduler (docs/scheduling.md,
"Calibration"). The disk's capacity turns yolofs' smoothed operation and byte rates into the
thesis' I/O *throughput* utilisation (:func:`io_utilisation`).
"""

import dataclasses
import json
import os

from yolo_nova.model import parameters

# The parameters a calibration must hold; it has the others' defaults where it does not.
_Parameters = dataclasses.make_dataclass(
    '_Parameters', parameters.fields(
        required=[p.name for p in parameters.PARAMETERS if p.measured]), frozen=True)


@dataclasses.dataclass(frozen=True)
class Calibration(_Parameters):
    """The parameters of the table (yolo_nova.model.parameters), then these."""
    disk_iops: float = 0.0              # 0: unknown
    disk_bytes_per_second: float = 0.0  # 0: unknown
    accel: str = ''                     # QEMU's accelerator in the boots: 'kvm', 'tcg', '' unknown
    measured_at: float = 0.0
    details: dict = dataclasses.field(default_factory=dict)

    @property
    def params(self):
        return parameters.BootTimeParameters(
            **{p.name: getattr(self, p.name) for p in parameters.PARAMETERS})


# Fields that the [yolo] options of the same name set, beside the table's.
DISK_CAPACITY = ('disk_iops', 'disk_bytes_per_second')

# An uncalibrated host: the table's defaults (the emulated HDD of
# docs/evaluation/boot-benchmark.md, TCG).
UNCALIBRATED = Calibration(**{p.name: p.default for p in parameters.PARAMETERS if p.measured})


def load(path):
    """The calibration in ``path``, or None if there is none; a broken file raises ValueError."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError('%s: %s' % (path, e))
    try:
        calibration = Calibration(**data)
        calibration.params  # validates the numbers
        if calibration.accel not in ('', 'kvm', 'tcg'):
            raise ValueError('unknown accelerator %r' % calibration.accel)
    except (TypeError, ValueError) as e:
        raise ValueError('%s: not a calibration: %s' % (path, e))
    return calibration


def save(calibration, path):
    write_json(dataclasses.asdict(calibration), path, indent=2, sort_keys=True)


def write_json(data, path, **dump_options):
    """``data`` as the whole of ``path`` at once (a reader never sees half a file)."""
    tmp = '%s.%d.tmp' % (path, os.getpid())
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(tmp, 'w') as f:
        json.dump(data, f, **dump_options)
        f.write('\n')
    os.replace(tmp, path)


def io_utilisation(host_load, disk_iops=0.0, disk_bytes_per_second=0.0):
    """x for the model from the host's load (yolo_common.yolofs.HostLoad, or anything with its
    attributes): the throughput utilisation ``max(iops / disk_iops, bytes_per_second /
    disk_bytes_per_second)`` when the disk's capacity is known, else the fraction of time the
    disk was busy."""
    shares = []
    if disk_iops > 0 and host_load.iops is not None:
        shares.append(float(host_load.iops) / disk_iops)
    if disk_bytes_per_second > 0 and host_load.bytes_per_second is not None:
        shares.append(float(host_load.bytes_per_second) / disk_bytes_per_second)
    if shares:
        return min(max(shares), 1.0)
    return float(host_load.io_utilisation)


def model_load(host_load, known):
    """The model's load figures (the fields HostBootState and ObservedBoot share) from the
    host's load (as for :func:`io_utilisation`) and its calibration ``known``."""
    return dict(io_utilisation=io_utilisation(host_load, known.disk_iops,
                                              known.disk_bytes_per_second),
                cpu_utilisation=float(host_load.cpu_utilisation),
                runnable=host_load.runnable_per_cpu,
                idlest_cpu_utilisation=host_load.idlest_cpu_utilisation,
                cpu_pressure=host_load.cpu_pressure)


def accel_of_virt_type(virt_type):
    """The QEMU accelerator of guests Nova starts with ``[libvirt] virt_type`` (None: no QEMU)."""
    return {'kvm': 'kvm', 'qemu': 'tcg'}.get(virt_type)
