"""yolo-calibrate for real: idle boots of the tiny image give parameters the driver can report."""

import pytest

from yolo_nova.cmd import calibrate
from yolo_nova.model import calibration

# Its parameters are measured boots (one under its own load): another test's boot beside it
# would be part of the measurement.
pytestmark = pytest.mark.serial


def test_calibrate_boots_and_saves(tiny_image, tmp_path):
    output = tmp_path / 'calibration.json'
    assert calibrate.main(['--image', str(tiny_image), '--instances-path', str(tmp_path / 'i'),
                           '--boots', '1', '--output', str(output), '--disk-iops', '300',
                           '--disk-bytes-per-second', '150e6', '--accel', 'tcg']) == 0
    result = calibration.load(str(output))
    normal_boot, _ = result.details['normal_boots'][0]
    yolo_boot, yolo_cpu = result.details['yolo_boots'][0]
    # beta is the YOLO boot's vCPU running time: most of a TCG boot, never more than the boot.
    assert 0 < result.beta == yolo_cpu <= yolo_boot
    assert result.alpha == round(max(0.0, normal_boot - yolo_cpu), 3)
    assert result.alpha_yolo == round(max(0.0, yolo_boot - yolo_cpu), 3)
    assert (result.disk_iops, result.disk_bytes_per_second) == (300.0, 150e6)
    assert result.accel == 'tcg'
    # k was measured by a boot under load, within its bounds.
    assert result.details['loaded_boot'] > 0
    assert 0.0 <= result.io_exponent <= 3.0
    # The scratch space on the instance storage is cleaned up.
    assert list((tmp_path / 'i').iterdir()) == []
