"""The calibration file and the throughput utilisation derived from it."""

import json

import pytest

from yolo_common import yolofs
from yolo_nova.model import calibration
from yolo_nova.model import estimators


def test_save_then_load(tmp_path):
    path = tmp_path / 'sub' / 'calibration.json'
    saved = estimators.from_boots([(28.0, 22.0), (30.0, 23.0), (29.0, 22.5)],
                                  [(23.0, 22.4), (23.4, 22.6), (23.2, 22.5)], cpus=2,
                                  disk_iops=300.0, disk_bytes_per_second=150e6)
    calibration.save(saved, str(path))
    loaded = calibration.load(str(path))
    assert loaded.params == saved.params
    # Medians: beta 22.5, alpha 29.0 - 22.5, alpha_yolo 23.2 - 22.5.
    assert (loaded.alpha, loaded.beta, loaded.alpha_yolo) == (6.5, 22.5, 0.7)
    assert loaded.disk_iops == 300.0
    assert loaded.accel == ''   # files written before the accelerator was recorded


def test_the_accelerator_is_kept_and_checked(tmp_path):
    path = tmp_path / 'calibration.json'
    saved = estimators.from_boots([(28.0, 22.0)], [(23.0, 22.4)], cpus=2, accel='kvm')
    calibration.save(saved, str(path))
    assert calibration.load(str(path)).accel == 'kvm'
    data = json.loads(path.read_text())
    data['accel'] = 'hvf'
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match='unknown accelerator'):
        calibration.load(str(path))
    assert [calibration.accel_of_virt_type(t) for t in ('kvm', 'qemu', 'lxc')] == [
        'kvm', 'tcg', None]


def test_missing_file_is_none_broken_file_is_an_error(tmp_path):
    assert calibration.load(str(tmp_path / 'none.json')) is None
    for text in ('{', '{"alpha": 1}', json.dumps({'alpha': -1, 'beta': 1, 'alpha_yolo': 1,
                                                 'cpus': 1})):
        (tmp_path / 'bad.json').write_text(text)
        with pytest.raises(ValueError):
            calibration.load(str(tmp_path / 'bad.json'))


def test_io_utilisation_is_throughput_when_capacity_is_known():
    load = yolofs.HostLoad(io_utilisation=0.9, iops=60.0, bytes_per_second=120e6)
    assert calibration.io_utilisation(load) == 0.9
    assert calibration.io_utilisation(load, disk_iops=300.0) == pytest.approx(0.2)
    # The busier of the two limits; never above 1.
    assert calibration.io_utilisation(load, 300.0, 150e6) == pytest.approx(0.8)
    assert calibration.io_utilisation(load, 30.0, 150e6) == 1.0


def test_model_load_carries_what_yolofs_reports():
    known = calibration.Calibration(alpha=5.0, beta=20.0, alpha_yolo=0.5, cpus=2)
    answer = {'io_utilisation': 0.5, 'cpu_utilisation': 0.25, 'runnable_per_cpu': 0.5,
              'idlest_cpu_utilisation': 0.1, 'cpu_pressure': 0.2, 'a_later_field': 1}
    assert calibration.model_load(yolofs.HostLoad.from_answer(answer), known) == {
        'io_utilisation': 0.5, 'cpu_utilisation': 0.25, 'runnable': 0.5,
        'idlest_cpu_utilisation': 0.1, 'cpu_pressure': 0.2}
    # A yolofs that does not know its host's pressure (PSI off) reports null, as older ones
    # report nothing.
    answer['cpu_pressure'] = None
    assert calibration.model_load(yolofs.HostLoad.from_answer(answer), known)[
        'cpu_pressure'] is None
    del answer['cpu_pressure']
    assert calibration.model_load(yolofs.HostLoad.from_answer(answer), known)[
        'cpu_pressure'] is None
