import dataclasses
import json

from yolo_bench import replay
from yolo_nova import calibration


def boot(started_at, vcpu, io=0.0, disk=0.5):
    """A boot served from its boot image: its vCPU time, 0.5 s waiting for a CPU, its disk."""
    return calibration.ObservedBoot(
        started_at=started_at, seconds=vcpu + 0.5 + disk, cpu_seconds=vcpu, boot_image=True,
        io_utilisation=io, cpu_utilisation=0.1, cpu_delay_seconds=0.5, cpu_pressure=0.02,
        disk_seconds=disk)


BASE = dataclasses.replace(calibration.UNCALIBRATED, cpus=2)
# A host whose boots sped up after four, then one boot under I/O load.
BOOTS = [boot(0, 30.0), boot(100, 30.5), boot(200, 29.5), boot(300, 30.0), boot(400, 24.0),
         boot(500, 24.5), boot(600, 24.0), boot(700, 24.3), boot(800, 24.2, io=0.99, disk=2.5)]


def test_each_boot_is_predicted_from_the_boots_before_it_only():
    replayed = replay.replay(BASE, BOOTS[::-1], 3, calibration.BETA_HALF_LIFE_BOOTS)
    assert [b.started_at for b, _ in replayed] == [300, 400, 500, 600, 700, 800]
    learned = calibration.with_observed_boots(BASE, BOOTS[:6], 3)
    assert replayed[3][1] == replay.predicted(learned, BOOTS[6])


def test_the_report_sets_recent_and_old_boots_side_by_side(tmp_path):
    lines = replay.report(BASE, BOOTS, 3)
    assert lines[0].count('predicted') == 2 and len(lines) == 2 + 6 + 2
    without, under = lines[-2:]
    assert without.startswith('5 boots without I/O load: mean model error ')
    assert under.startswith('1 boot under I/O load: ')
    # The host sped up: beta from the last boots follows it sooner than all boots alike.
    recent, alike = (float(part.split('%')[0]) for part in without.split('error ')[1].split(', '))
    assert recent < alike
    assert replay.report(BASE, BOOTS[:3], 3) == [
        'no boot to replay: fewer than 3 served from a boot image before any']


def test_the_command_reads_a_hosts_file(tmp_path, capsys):
    path = tmp_path / 'observed-boots.json'
    calibration.save_observed(BOOTS, str(path))
    assert replay.main([str(path), '--cpus', '2']) == 0
    assert capsys.readouterr().out.splitlines() == replay.report(BASE, BOOTS, 3)
    path.write_text(json.dumps([{'seconds': 'x'}]))
    try:
        replay.main([str(path)])
    except SystemExit as e:
        assert 'not a list of observed boots' in str(e)
    else:
        raise AssertionError('a broken file was replayed')
