"""The boot-time model: what a host's boot time is predicted from, and how it is learned.

No Nova imports: the scheduler's filter and weigher, the compute driver, ``yolo-calibrate`` and
the benchmarks all use it.

* :mod:`.parameters`: the parameter table, the one place a parameter is declared (its bounds,
  default, host stats key, ``[yolo]`` option and aggregate metadata key), and
  ``BootTimeParameters``, derived from it.
* :mod:`.prediction`: ``predict``, whose docstring states the whole formula.
* :mod:`.calibration`: a host's calibration (its parameters and its disk's capacity) and its
  file, written by ``yolo-calibrate``.
* :mod:`.estimators`: the estimators, from idle boots and from the boots a host timed, and the
  order in which a host's parameters take precedence.
* :mod:`.host_stats`: what hosts report to the scheduler in their ``stats``.

docs/scheduling.md explains the model and its decisions; docs/evaluation/scheduling-runs.md gives
the measurements behind them.
"""
