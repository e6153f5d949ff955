"""The boots nova-compute times: from a guest's start to its console's ready line."""

import time
import types

import pytest

from yolo_nova.model import estimators
from yolo_nova.virt import boot_timer

CONDITIONS = dict(boot_image=True, io_utilisation=0.5, cpu_utilisation=0.25, runnable=0.5,
                  concurrent_boots=1)


@pytest.fixture(autouse=True)
def fast_polls(monkeypatch):
    monkeypatch.setattr(boot_timer, 'POLL_SECONDS', 0.05)


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, 'timed out'
        time.sleep(0.02)


class Consoles:
    """Guests' consoles as the driver reads them: raises for a guest that is gone."""

    def __init__(self):
        self.text = {}

    def read(self, instance):
        if instance.uuid not in self.text:
            raise LookupError('no guest %s' % instance.uuid)
        return self.text[instance.uuid]


def timer(tmp_path, consoles, timeout=30.0):
    return boot_timer.BootTimer(str(tmp_path / 'observed.json'), r'login: *$', timeout,
                                consoles.read, lambda instance: (12.345, 0.5), accel='tcg',
                                disk_seconds=lambda instance: (0.604, 0.15))


def test_a_boot_is_timed_to_its_ready_line_and_kept(tmp_path):
    consoles = Consoles()
    consoles.text['a'] = b'[    0.000000] Linux version 6.1\n'
    times = timer(tmp_path, consoles)
    times.watch(types.SimpleNamespace(uuid='a'), dict(CONDITIONS))
    assert times.in_progress() == 1
    time.sleep(0.3)
    assert times.observed() == []
    consoles.text['a'] += b'Debian GNU/Linux 12 yolo ttyS0\n\nyolo login: '
    wait_for(lambda: times.observed())
    [boot] = times.observed()
    assert boot.seconds >= 0.3 and boot.cpu_seconds == 12.35 and boot.accel == 'tcg'
    assert (boot.cpu_delay_seconds, boot.disk_seconds, boot.disk_write_seconds) == (0.5, 0.75, 0.15)
    assert (boot.boot_image, boot.io_utilisation, boot.concurrent_boots) == (True, 0.5, 1)
    wait_for(lambda: times.in_progress() == 0)
    # Boots of another accelerator are kept but do not count here.
    other = boot_timer.BootTimer(times.path, 'x', 1.0, consoles.read, None, accel='kvm')
    assert other.observed() == [] and len(estimators.load_observed(times.path)) == 1


def test_a_guest_gone_or_never_ready_is_not_timed(tmp_path):
    consoles = Consoles()
    consoles.text['slow'] = 'Loading initial ramdisk ...\n'
    times = timer(tmp_path, consoles, timeout=0.3)
    times.watch(types.SimpleNamespace(uuid='gone'), dict(CONDITIONS))
    times.watch(types.SimpleNamespace(uuid='slow'), dict(CONDITIONS))
    wait_for(lambda: times.in_progress() == 0)
    consoles.text['slow'] += 'login: '
    time.sleep(0.2)
    assert times.observed() == []


def test_only_a_ready_line_counts_and_a_bad_pattern_is_refused(tmp_path):
    consoles = Consoles()
    consoles.text['a'] = 'the login: prompt comes later\n'
    times = timer(tmp_path, consoles, timeout=0.5)
    times.watch(types.SimpleNamespace(uuid='a'), dict(CONDITIONS))
    wait_for(lambda: times.in_progress() == 0)
    assert times.observed() == []
    with pytest.raises(boot_timer.re.error):
        boot_timer.BootTimer(str(tmp_path / 'x.json'), 'login: (', 1.0, None, None)


def test_boots_under_way_are_those_started_recently(tmp_path, monkeypatch):
    consoles = Consoles()
    consoles.text['old'] = consoles.text['new'] = 'booting\n'
    times = timer(tmp_path, consoles)
    assert not times.booting(ended_within=1000.0)
    times.watch(types.SimpleNamespace(uuid='old'), dict(CONDITIONS))
    # 1.5 s apart: the asserts have a second to run, even on a loaded machine.
    time.sleep(1.5)
    times.watch(types.SimpleNamespace(uuid='new'), dict(CONDITIONS))
    assert times.in_progress() == 2
    assert times.in_progress(younger_than=1.0) == 1
    assert times.booting() and times.booting(younger_than=1.0)
    # A boot that ended (its guest gone) still counts for a while: its load lingers.
    del consoles.text['old'], consoles.text['new']
    wait_for(lambda: times.in_progress() == 0)
    assert times.booting(ended_within=1000.0) and not times.booting()
