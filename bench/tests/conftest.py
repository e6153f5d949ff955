"""The benchmarks' tests use the product's test images, its tests' native-threads setup, and
Nova's test environment (tests/nova_env.py) before any of them imports Nova."""

from tests.conftest import tiny_image  # noqa: F401
from tests import nova_env  # noqa: F401,I100,H306 (after the native-threads setup)
