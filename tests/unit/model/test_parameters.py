"""The parameter table: the one declaration of each parameter, and what is derived from it."""

import dataclasses
import pathlib
import subprocess
import sys

import pytest

from yolo_nova import conf
from yolo_nova.model import calibration
from yolo_nova.model import host_stats
from yolo_nova.model import parameters

# The contract with operators and older hosts (docs/scheduling.md): a parameter's stats key,
# [yolo] option and aggregate metadata key never change.
NAMES = {
    'alpha': ('yolo_alpha', 'boot_time_alpha', 'yolo_boot_time_alpha'),
    'beta': ('yolo_beta', 'boot_time_beta', 'yolo_boot_time_beta'),
    'alpha_yolo': ('yolo_alpha_yolo', 'boot_time_alpha_yolo', 'yolo_boot_time_alpha_yolo'),
    'cpus': ('yolo_cpus', None, None),
    'io_exponent': ('yolo_io_exponent', 'io_exponent', None),
    'cpu_contention': ('yolo_cpu_contention', None, None),
    'beta_growth': ('yolo_beta_growth', None, None),
    'io_pole': ('yolo_io_pole', None, None),
    'io_pole_yolo': ('yolo_io_pole_yolo', None, None),
    'glance_bytes_per_second': ('yolo_glance_bytes_per_second', 'glance_bytes_per_second',
                                'yolo_glance_bytes_per_second'),
    'convert_bytes_per_second': ('yolo_convert_bytes_per_second', 'convert_bytes_per_second',
                                 'yolo_convert_bytes_per_second'),
    'streamed_boot_factor': ('yolo_streamed_boot_factor', 'streamed_boot_factor',
                             'yolo_streamed_boot_factor'),
}


def test_the_keys_and_options_of_each_parameter_are_those_documented():
    assert {p.name: (p.stats_key, p.option, p.aggregate_key)
            for p in parameters.PARAMETERS} == NAMES


def test_the_parameters_dataclass_is_the_tables():
    fields = dataclasses.fields(parameters.BootTimeParameters)
    assert [(f.name, f.type, f.default) for f in fields] == [
        (p.name, p.type, p.default) for p in parameters.PARAMETERS]
    # An uncalibrated host: the emulated HDD of docs/evaluation/boot-benchmark.md under TCG, the
    # thesis' refinements.
    assert parameters.BootTimeParameters() == calibration.UNCALIBRATED.params
    assert dataclasses.astuple(calibration.UNCALIBRATED.params) == (
        5.9, 22.7, 0.4, 1, 1.0, 1.0, 0.0, 1.0, 1.0, 125e6, 200e6, 1.25)


@pytest.mark.parametrize('parameter', parameters.PARAMETERS, ids=lambda p: p.name)
def test_each_parameter_is_bounded(parameter):
    lowest, highest = parameter.bounds
    for value in (lowest, highest):
        parameters.BootTimeParameters(**{parameter.name: value})
    step = 1 if parameter.integer else 0.001
    for value in (lowest - step, highest + step, None, float('nan')):
        with pytest.raises(ValueError, match=parameter.name):
            parameters.BootTimeParameters(**{parameter.name: value})


def test_a_calibration_holds_what_it_measures():
    required = {f.name for f in dataclasses.fields(calibration.Calibration)
                if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}
    assert required == {p.name for p in parameters.PARAMETERS if p.measured}
    assert calibration.Calibration(alpha=1.0, beta=2.0, alpha_yolo=0.5, cpus=2).io_pole == 1.0


def test_the_yolo_options_of_the_parameters_are_the_tables():
    options = {opt.name: opt for opt in conf.compute_opts}
    for p in parameters.PARAMETERS:
        if p.option is None:
            continue
        opt = options[p.option]
        assert (opt.default, opt.type.min, opt.type.max) == (None, p.bounds[0], p.option_max)
        assert 'else %g.' % p.default in opt.help
    # Where the samples in etc/ have them.
    names = [opt.name for opt in conf.compute_opts]
    start = names.index('calibration_file') + 1
    assert names[start:start + 4] == [
        'boot_time_alpha', 'boot_time_beta', 'boot_time_alpha_yolo', 'io_exponent']


def test_the_stats_keys_are_the_tables():
    # Every report holds what a calibration measures; older hosts' lack the rest.
    for p in parameters.PARAMETERS:
        assert p.stats_key in (host_stats.KEYS if p.measured else host_stats.OPTIONAL_KEYS)


def test_an_io_part_set_by_an_operator_brings_the_thesis_pole():
    assert parameters.with_thesis_poles({'alpha': 3.0, 'beta': 20.0, 'disk_iops': 5.0}) == {
        'alpha': 3.0, 'beta': 20.0, 'disk_iops': 5.0, 'io_pole': 1.0}
    assert parameters.with_thesis_poles({'alpha_yolo': 0.1}) == {
        'alpha_yolo': 0.1, 'io_pole_yolo': 1.0}


def test_the_model_imports_nothing_from_nova():
    modules = subprocess.run(
        [sys.executable, '-c', 'import sys, yolo_nova.model.estimators, '
         'yolo_nova.model.host_stats; print(" ".join(sys.modules))'],
        check=True, capture_output=True, text=True,
        cwd=pathlib.Path(__file__).resolve().parents[3]).stdout.split()
    assert [m for m in modules if m == 'nova' or m.startswith('nova.')] == []
