"""The worker tests' in-memory Glance and worker, for every test of the Glance side."""

from tests.unit.glance.test_worker import glance  # noqa: F401
from tests.unit.glance.test_worker import make_worker  # noqa: F401
