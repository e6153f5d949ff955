"""The model's parameters: one table, from which the rest is derived.

Each row declares a parameter once: its bounds, its default, the key a host reports it under in
its ``stats``, the ``[yolo]`` option that sets it on a compute node and the aggregate metadata key
that sets it at the scheduler (see docs/scheduling.md, "Parameters", generated from this table
by tools/model-table.py, and "Order of precedence"). ``BootTimeParameters``,
the options (yolo_nova.conf), the stats keys (:mod:`.host_stats`), the aggregate keys
(yolo_nova.scheduler.utils) and the order of precedence (:func:`.estimators.host_calibration`)
all come from it. A new parameter is a row here and its use in :func:`.prediction.predict`.
"""

import dataclasses

# Bounds of what a host may report (its stats come over the message bus and through the
# database): beyond them the model's arithmetic overflows, and the scheduler must not raise.
MAX_SECONDS = 86400.0
MAX_CPUS = 1 << 16
MAX_IO_EXPONENT = 3.0
MAX_BETA_GROWTH = 1.0       # a boot needing twice its CPU on a saturated CPU
MAX_BYTES_PER_SECOND = 1e12


@dataclasses.dataclass(frozen=True)
class Parameter:
    name: str                   # BootTimeParameters' and Calibration's field
    meaning: str
    bounds: tuple               # (lowest, highest), both allowed
    default: float              # an uncalibrated host's, or the thesis' until it is learned
    stats_key: str              # in a host's stats (host_stats)
    # Whether every calibration measures it: a calibration file and a host's report must hold
    # it (the others have their default where they are missing).
    measured: bool = False
    # Whether a host learns it from its own boots (estimators.with_observed_boots).
    learned: bool = False
    integer: bool = False
    option: str = None          # the [yolo] option that sets it on a compute node
    option_help: str = None     # its help, with {default:g} for the default
    option_max: float = None    # its maximum value, if it has one
    aggregate_key: str = None   # the aggregate metadata key that sets it at the scheduler
    pole: str = None            # for an I/O part: the parameter that is its pole
    # A rate: the larger, the faster a boot (the others: the larger, the slower).
    rate: bool = False

    @property
    def type(self):
        return int if self.integer else float


PARAMETERS = (
    Parameter(
        'alpha', 'the I/O part of an idle normal boot, in seconds', (0.0, MAX_SECONDS), 5.9,
        'yolo_alpha', measured=True, learned=True, option='boot_time_alpha',
        aggregate_key='yolo_boot_time_alpha', pole='io_pole', option_help="""
The I/O part, in seconds, of a boot on this host when idle (boot-time model, see
``docs/scheduling.md``). Unset: from ``calibration_file``, else {default:g}.
"""),
    Parameter(
        'beta', 'the CPU part of an idle boot, in seconds', (0.0, MAX_SECONDS), 22.7,
        'yolo_beta', measured=True, learned=True, option='boot_time_beta',
        aggregate_key='yolo_boot_time_beta', option_help="""
The CPU part, in seconds, of a boot on this host when idle. Unset: from ``calibration_file``,
else {default:g}.
"""),
    Parameter(
        'alpha_yolo', 'the I/O part of an idle boot served from a verified boot image, in '
        'seconds', (0.0, MAX_SECONDS), 0.4, 'yolo_alpha_yolo', measured=True, learned=True,
        option='boot_time_alpha_yolo', aggregate_key='yolo_boot_time_alpha_yolo',
        pole='io_pole_yolo', option_help="""
The I/O part, in seconds, of an idle boot served from a verified boot image. Unset: from
``calibration_file``, else {default:g}.
"""),
    Parameter(
        'cpus', "the host's CPUs, which boots in progress share", (1, MAX_CPUS), 1, 'yolo_cpus',
        measured=True, integer=True),
    Parameter(
        'io_exponent', 'k of the I/O part e^(k x): 1 for a seeking disk, near 0 for one that '
        'shares its rate', (0.0, MAX_IO_EXPONENT), 1.0, 'yolo_io_exponent',
        option='io_exponent', option_max=MAX_IO_EXPONENT, option_help="""
k in the model's I/O part ``e^(k x) alpha / (1 - x)``: 1 (the thesis) for a seeking HDD, near 0
for a disk that shares its rate without seeking. Unset: from ``calibration_file``, else {default:g}.
"""),
    Parameter(
        'cpu_contention', "c: the share of its CPU's load a boot's vCPU yields to", (0.0, 1.0),
        1.0, 'yolo_cpu_contention', learned=True),
    Parameter(
        'beta_growth', 'g: how the CPU a boot needs grows with the load on its CPU',
        (0.0, MAX_BETA_GROWTH), 0.0, 'yolo_beta_growth', learned=True),
    Parameter(
        'io_pole', 'q of the I/O part 1 / (1 - x)^q, normal boots', (0.0, 1.0), 1.0,
        'yolo_io_pole', learned=True),
    Parameter(
        'io_pole_yolo', 'q of the I/O part, boots served from a boot image', (0.0, 1.0), 1.0,
        'yolo_io_pole_yolo', learned=True),
    Parameter(
        'glance_bytes_per_second', "the rate of the host's downloads from Glance, in bytes a "
        'second', (1.0, MAX_BYTES_PER_SECOND), 125e6, 'yolo_glance_bytes_per_second',
        option='glance_bytes_per_second', aggregate_key='yolo_glance_bytes_per_second', rate=True,
        option_help="""
The rate, in bytes a second, of this host's downloads from Glance (1 Gbit/s is 125e6): with what
the host holds of an image, it predicts what a boot must fetch first. Unset: measured from the
host's own downloads and first-boot fills, else {default:g}.
"""),
    Parameter(
        'convert_bytes_per_second', "the rate of Nova's conversion of a download to raw, in "
        'bytes of the download a second', (1.0, MAX_BYTES_PER_SECOND), 200e6,
        'yolo_convert_bytes_per_second', option='convert_bytes_per_second', rate=True,
        aggregate_key='yolo_convert_bytes_per_second', option_help="""
The rate, in bytes of the download a second, at which Nova converts a downloaded image to raw on
this host. Unset: measured from the host's own conversions, else {default:g}.
"""),
    Parameter(
        'streamed_boot_factor', 'a first boot before the download against the same boot with '
        'the base file held: the download beside it shares the CPU, the disk and the link',
        (1.0, 10.0), 1.25, 'yolo_streamed_boot_factor', learned=True,
        option='streamed_boot_factor', option_max=10.0, aggregate_key='yolo_streamed_boot_factor',
        option_help="""
How many times longer a first boot before the download (``first_boots``) takes on this host than
the same boot with its base file held: the download beside it takes CPU, disk and link. Unset:
learned from the host's own first boots (``learn_from_boots`` of them), else {default:g}.
"""),
)
BY_NAME = {parameter.name: parameter for parameter in PARAMETERS}


def _check_bounds(params):
    for p in PARAMETERS:
        value, (lowest, highest) = getattr(params, p.name), p.bounds
        if p.integer:
            if not (isinstance(value, int) and lowest <= value <= highest):
                raise ValueError('%s must be an integer from %d to %d, not %r' % (
                    p.name, lowest, highest, value))
        elif not (isinstance(value, (int, float)) and lowest <= value <= highest):
            raise ValueError('%s must be a number from %g to %g, not %r' % (
                p.name, lowest, highest, value))


def fields(required):
    """The table as dataclass fields; ``required``: those that have no default."""
    return [(p.name, p.type) if p.name in required else
            (p.name, p.type, dataclasses.field(default=p.default)) for p in PARAMETERS]


# The parameters of one host; an uncalibrated host's by default. Out of bounds: ValueError.
BootTimeParameters = dataclasses.make_dataclass(
    'BootTimeParameters', fields(required=()), frozen=True,
    namespace={'__post_init__': _check_bounds, '__module__': __name__,
               '__doc__': 'The parameters of one host (table PARAMETERS).'})


def with_thesis_poles(overrides):
    """``overrides`` of parameters, with the thesis' pole for each I/O part they set: an I/O part
    an operator sets grows as the thesis' does, not as a fit to the host's boots did."""
    return dict(overrides, **{BY_NAME[name].pole: 1.0 for name in overrides
                              if name in BY_NAME and BY_NAME[name].pole})
