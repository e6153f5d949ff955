"""Tempest's compute API tests (CI's subset, tools/aio/tempest/ci-include.txt) pass on the
all-in-one cloud with YOLO on, as they do on plain Nova."""

import subprocess

from yolo_testing import REPO


def test_tempest_compute_subset_passes(cloud):
    proc = subprocess.run([str(REPO / 'tools' / 'aio' / 'tempest' / 'run'), 'ci'],
                          capture_output=True, text=True, timeout=3600)
    print(proc.stdout[-20000:])
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    assert ' - Passed: ' in proc.stdout and ' - Failed: 0' in proc.stdout
