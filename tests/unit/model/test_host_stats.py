"""What hosts report in their stats, and what the scheduler reads back."""

import time

from yolo_nova.model import host_stats
from yolo_nova.model import parameters


def test_host_stats_without_the_optional_keys_give_the_thesis_model():
    state = host_stats.HostBootState(0.5, 0.75, parameters.BootTimeParameters(
        alpha=5.0, beta=20.0, alpha_yolo=0.5, io_exponent=0.0, cpu_contention=0.0,
        beta_growth=0.25, io_pole=0.5, io_pole_yolo=0.25),
        frozenset(), time.time(), runnable=1.0, idlest_cpu_utilisation=0.25, cpu_pressure=0.125)
    stats = state.to_stats()
    parsed = host_stats.from_stats(stats, max_age=60)
    assert (parsed.params.io_exponent, parsed.params.cpu_contention, parsed.params.beta_growth,
            parsed.params.io_pole, parsed.params.io_pole_yolo,
            parsed.runnable, parsed.idlest_cpu_utilisation, parsed.cpu_pressure) == (
        0.0, 0.0, 0.25, 0.5, 0.25, 1.0, 0.25, 0.125)
    old = {k: v for k, v in stats.items()
           if k not in host_stats.OPTIONAL_KEYS}
    parsed = host_stats.from_stats(old, max_age=60)
    assert (parsed.params.io_exponent, parsed.params.cpu_contention, parsed.params.beta_growth,
            parsed.params.io_pole, parsed.params.io_pole_yolo,
            parsed.runnable, parsed.idlest_cpu_utilisation, parsed.cpu_pressure) == (
        1.0, 1.0, 0.0, 1.0, 1.0, None, None, None)
    # A pole out of bounds is no report at all.
    assert host_stats.from_stats(dict(stats, yolo_io_pole_yolo='2.0'), max_age=60) is None
