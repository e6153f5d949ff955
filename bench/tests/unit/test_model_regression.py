"""The boot-time model against the stored runs (docs/scheduling.md, "Accuracy goal"): the goal, a
mean error within 15 % of the measured boot time, is met and kept. A change to the model or its
learning that raises these errors fails here, offline, without a run."""

import re

import pytest

from yolo_bench import accuracy
from yolo_testing import REPO

DATA = REPO / 'docs' / 'evaluation' / 'data'
GOAL = 0.15


@pytest.fixture(autouse=True)
def two_cpus(monkeypatch):
    # The runs were measured on two CPUs; the model's CPU share depends on the count.
    monkeypatch.setattr(accuracy.os, 'cpu_count', lambda: 2)


def test_the_measured_model_predicts_the_loaded_boots_of_the_hdd_within_the_goal():
    pairs = accuracy.predictions(accuracy.read(DATA / 'model-accuracy-hdd-2.csv'), 'measured')
    _, mean_relative, _ = accuracy.errors(pairs)
    assert len(pairs) == 14
    assert mean_relative <= GOAL, mean_relative
    # The weigher needs the order above all: pairs of boots ordered as measured.
    assert accuracy.rank_agreement(pairs) >= 0.9


def test_boots_at_once_are_predicted_within_the_goal():
    report = accuracy.concurrency_report(DATA / 'boot-multi-hdd.csv', cpus=2)
    mean = float(re.search(r'Mean relative error (\d+) %', report).group(1))
    assert mean <= GOAL * 100, report
