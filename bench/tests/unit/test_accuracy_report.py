"""The model-accuracy report: calibration from idle rows, predictions and errors of the rest."""

import csv
import dataclasses

import pytest

from yolo_bench import accuracy


def row(kind, level, policy, x, y, boot_s, vcpu_run_s=22.0, repetition=0):
    return accuracy.Row(kind, level, policy, repetition, x, y, boot_s, vcpu_run_s)


ROWS = [row('idle', 0, 'normal', 0.01, 0.02, 28.0), row('idle', 0, 'yolo', 0.0, 0.02, 22.5),
        row('io', 0.5, 'normal', 0.5, 0.05, 45.0), row('io', 0.5, 'yolo', 0.5, 0.05, 23.0),
        row('cpu', 0.5, 'normal', 0.0, 0.5, 50.0)]


def test_calibration_comes_from_the_idle_boots_only():
    cal = accuracy.calibrate(ROWS)
    assert (cal.alpha, cal.beta, cal.alpha_yolo) == (6.0, 22.0, 0.5)


def test_predictions_and_errors():
    pairs = dict((r.boot_s, p) for r, p in accuracy.predictions(ROWS))
    assert set(pairs) == {45.0, 23.0, 50.0}
    # e^0.5 * 6 / 0.5 + 22 / 0.95 for the normal boot under I/O load.
    assert pairs[45.0] == pytest.approx(19.784 + 23.158, abs=0.01)
    assert pairs[50.0] == pytest.approx(6.0 + 44.0, abs=0.01)
    mean_abs, mean_rel, max_abs = accuracy.errors(accuracy.predictions(ROWS))
    assert max_abs == pytest.approx(abs(pairs[45.0] - 45.0), abs=0.01)
    report = accuracy.report(ROWS)
    assert 'alpha 6.00 s, beta 22.00 s, alpha_yolo 0.50 s' in report
    assert '| all | 3 |' in report


def test_csv_round_trip(tmp_path):
    path = tmp_path / 'rows.csv'
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, accuracy.FIELDS)
        writer.writeheader()
        for r in ROWS:
            writer.writerow(dataclasses.asdict(r))
    assert accuracy.read(path) == ROWS


def test_rank_agreement():
    pairs = [(row('io', 0, 'normal', 0, 0, 30.0), 31.0), (row('io', 0, 'normal', 0, 0, 40.0), 60.0),
             (row('io', 0, 'normal', 0, 0, 50.0), 45.0), (row('io', 0, 'normal', 0, 0, 51.0), 1.0)]
    # Ordered pairs: (30,40) yes, (30,50) yes, (40,50) no; 51 is within 2 s of 50 only.
    # (30,51) no, (40,51) no.
    assert accuracy.rank_agreement(pairs) == 2 / 5


def test_the_measured_model_takes_k_from_the_io_calibration_boots_and_the_fair_share():
    rows = ROWS + [row('iocal', 0.5, 'normal', 0.5, 0.0, 22.0 + 12.0),   # 6 / (1 - x): k = 0
                   row('cpu', 0.75, 'yolo', 0.0, 0.75, 45.0)]
    rows[-1].runnable = 1.0
    cal = accuracy.calibrate(rows)
    assert accuracy.io_exponent(rows, cal) == pytest.approx(0.0)
    thesis = dict((r.boot_s, p) for r, p in accuracy.predictions(rows, 'thesis'))
    measured = dict((r.boot_s, p) for r, p in accuracy.predictions(rows, 'measured'))
    assert 34.0 not in measured  # the calibration boot is not evaluated
    assert thesis[45.0] == pytest.approx(0.5 + 88.0)      # 22 / 0.25
    assert measured[45.0] == pytest.approx(0.5 + 44.0)    # 22 / max(0.25, 1 / 2)
    assert measured[50.0] == thesis[50.0]                 # no runnable recorded: as the thesis
    assert 'Model: measured' in accuracy.report(rows)
