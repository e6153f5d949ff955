"""The worker tests' in-memory Glance and a factory of workers over it."""

import pytest

from tests.functional.glance.fakes import fake_learner
from tests.functional.glance.fakes import FakeGlance
from yolo_common import signing
from yolo_common import yolofs
from yolo_glance import worker as worker_mod


@pytest.fixture
def glance(tmp_path):
    (tmp_path / 'glance').mkdir()
    return FakeGlance(tmp_path / 'glance')


@pytest.fixture
def signer():
    """The workers' key (all the workers of a deployment share one)."""
    return signing.Signer.generate()


@pytest.fixture
def make_worker(glance, tmp_path, signer):
    def make(**kwargs):
        options = dict(glance=glance, work_dir=str(tmp_path / 'work'),
                       profiling=worker_mod.ProfilingOptions('login:', 30.0, 600.0),
                       learner=fake_learner(), yolofs_binary=yolofs.binary(),
                       worker_id='w1', retry_delay=0, signer=signer)
        options.update(kwargs)
        return worker_mod.Worker(**options)
    return make
