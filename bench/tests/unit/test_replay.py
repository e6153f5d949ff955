import dataclasses
import json

import pytest

from yolo_bench import replay
from yolo_nova.model import calibration
from yolo_nova.model import estimators
from yolo_nova.model import prediction


def boot(started_at, vcpu, io=0.0, disk=0.5, accel='tcg'):
    """A boot served from its boot image: its vCPU time, 0.5 s waiting for a CPU, its disk."""
    return estimators.ObservedBoot(
        started_at=started_at, seconds=vcpu + 0.5 + disk, cpu_seconds=vcpu, boot_image=True,
        io_utilisation=io, cpu_utilisation=0.1, cpu_delay_seconds=0.5, cpu_pressure=0.02,
        disk_seconds=disk, accel=accel)


BASE = dataclasses.replace(calibration.UNCALIBRATED, cpus=2)
# A host whose boots sped up after four, then one boot under I/O load.
BOOTS = [boot(0, 30.0), boot(100, 30.5), boot(200, 29.5), boot(300, 30.0), boot(400, 24.0),
         boot(500, 24.5), boot(600, 24.0), boot(700, 24.3), boot(800, 24.2, io=0.99, disk=2.5)]


def test_each_boot_is_predicted_from_the_boots_over_when_it_started():
    replayed = replay.replay(BASE, BOOTS[::-1], 3, estimators.BETA_HALF_LIFE_BOOTS)
    assert [b.started_at for b, _ in replayed] == [300, 400, 500, 600, 700, 800]
    learned = estimators.with_observed_boots(BASE, BOOTS[:6], 3)
    assert replayed[3][1] == replay.predicted(learned, BOOTS[6])
    # As the scheduler predicts: the boot image's I/O part, the boots under way.
    busy = dataclasses.replace(BOOTS[6], concurrent_boots=1, io_utilisation=0.3)
    assert replay.predicted(learned, busy) == prediction.predict(
        learned.params, 0.3, 0.1, boot_image=True, concurrent_boots=1, cpu_pressure=0.02)
    # A boot still under way when the next started was not yet learned from.
    overlapping = BOOTS[:3] + [dataclasses.replace(BOOTS[3], started_at=210.0)]
    assert replay.replay(BASE, overlapping, 3, None) == []


def test_the_report_sets_recent_and_old_boots_side_by_side():
    lines = replay.report(BASE, BOOTS, 3)
    assert lines[0].count('predicted') == 2 and len(lines) == 2 + 6 + 2
    without, under = lines[-2:]
    assert without.startswith('5 boots without I/O load: mean model error ')
    assert under.startswith('1 boot under I/O load: ')
    assert under.endswith('; their own median (27.2 s) as the prediction: 0%')
    assert without.endswith('; their own median (25.3 s) as the prediction: 4%')
    # The host sped up: beta from the last boots follows it sooner than all boots alike.
    recent, alike = (float(part.split('%')[0])
                     for part in without.split('error ')[1].split(';')[0].split(', '))
    assert recent < alike
    assert replay.report(BASE, BOOTS[:3], 3) == [
        'no boot to replay: fewer than 3 served from a boot image before any']


def test_the_command_reads_a_hosts_files(tmp_path, capsys):
    path = tmp_path / 'observed-boots.json'
    estimators.save_observed(BOOTS + [boot(900, 5.0, accel='kvm')], str(path))
    assert replay.main([str(path), '--cpus', '2', '--accel', 'tcg']) == 0
    assert capsys.readouterr().out.splitlines() == replay.report(BASE, BOOTS, 3)
    measured = tmp_path / 'calibration.json'
    calibration.save(dataclasses.replace(BASE, beta=28.0, accel='kvm'), str(measured))
    with pytest.raises(SystemExit, match='its boots ran under kvm, not tcg'):
        replay.main([str(path), '--calibration', str(measured), '--accel', 'tcg'])
    with pytest.raises(SystemExit, match='no such file'):
        replay.main([str(path), '--calibration', str(tmp_path / 'none.json')])
    path.write_text(json.dumps([{'seconds': 'x'}]))
    with pytest.raises(SystemExit, match='not a list of observed boots'):
        replay.main([str(path)])
