# Nova's test environment, before any test module here imports Nova (tests/nova_env.py).
from tests import nova_env  # noqa: F401
