"""Nova's test environment, for the tests that use Nova's test fixtures.

Imported by the conftest.py of the directories holding them (tests/unit/scheduler,
tests/unit/virt, tests/functional), so that the other unit tests run without loading Nova.
"""

import os

# Nova 34 runs on native threads; its test fixtures must not patch eventlet in. Importing
# nova.tests.unit first (as Nova's own test discovery does) selects that backend.
os.environ.setdefault('OS_NOVA_DISABLE_EVENTLET_PATCHING', '1')
import nova.tests.unit  # noqa: E402,F401,H306
