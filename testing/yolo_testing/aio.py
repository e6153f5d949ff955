"""The all-in-one cloud's layout as tools/aio/settings, its one source, sets it: host names,
instances directories, yolofs' sockets, logs. The settings are read as the aio script reads
them (sourced by bash, overrides from the environment applied)."""

import contextlib
import functools
import json
import os
import pathlib
import re
import subprocess
import time

from yolo_nova.model import estimators
from yolo_testing import REPO
from yolo_testing import storage
from yolo_testing import stressors
from yolo_testing.wait import wait

SETTINGS = REPO / 'tools' / 'aio' / 'settings'
AIO = REPO / 'tools' / 'aio' / 'aio'


@functools.cache
def settings():
    """Every variable tools/aio/settings sets, by name."""
    listed = subprocess.run(
        ['bash', '-c', 'set -a && source "$1" && env -0', 'aio-settings', str(SETTINGS)],
        check=True, capture_output=True, env={'PATH': os.environ.get('PATH', '/usr/bin:/bin'),
                                              **{k: v for k, v in os.environ.items()
                                                 if k.startswith(('AIO_', 'YOLOFS_'))}})
    return dict(item.split('=', 1) for item in listed.stdout.decode().split('\0') if '=' in item)


def _path(name):
    return pathlib.Path(settings()[name])


FIRST_HOST = settings()['AIO_COMPUTE_HOST']
SECOND_HOST = settings()['AIO_COMPUTE2_HOST']
HOSTS = (FIRST_HOST, SECOND_HOST)
VENV = _path('AIO_VENV')
LOG_DIR = _path('AIO_LOG_DIR')
RUN_DIR = _path('AIO_RUN_DIR')
# The first host's yolofs service: its keeper's pid (the daemon is the keeper's child).
YOLOFS_PID_FILE = RUN_DIR / 'yolofs.pid'
YOLOFS_BIN = settings()['AIO_YOLOFS_BIN']
# Per host: its Nova state, instances directory, yolofs mount point and control socket.
STATE = {FIRST_HOST: _path('NOVA_STATE'), SECOND_HOST: _path('COMPUTE2_STATE')}
INSTANCES = {FIRST_HOST: _path('NOVA_INSTANCES'), SECOND_HOST: _path('COMPUTE2_INSTANCES')}
MOUNT_POINTS = {FIRST_HOST: _path('YOLOFS_MOUNTPOINT'),
                SECOND_HOST: _path('COMPUTE2_YOLOFS_MOUNTPOINT')}
CONTROL_SOCKETS = {FIRST_HOST: settings()['YOLOFS_CONTROL_SOCKET'],
                   SECOND_HOST: settings()['COMPUTE2_YOLOFS_CONTROL_SOCKET']}
# The second host's libvirt (its /run/libvirt is run/ in there).
COMPUTE2_LIBVIRT = _path('COMPUTE2_LIBVIRT')
COMPUTE2_LIBVIRT_URI = settings()['COMPUTE2_LIBVIRT_URI']

# What the cloud reports: the boots its hosts timed, the loads they report, the
# scheduler's predictions.
# Where each host's nova-compute keeps the boots it timed ($state_path/yolo/observed-boots.json).
OBSERVED_BOOTS = {host: STATE[host] / 'yolo' / 'observed-boots.json' for host in HOSTS}
# And its transfers from Glance and conversions, which it measures its rates from
# ($state_path/yolo/transfers.json).
TRANSFERS = {host: STATE[host] / 'yolo' / 'transfers.json' for host in HOSTS}
# Settings of the second host's nova-compute beside nova-compute-2.conf (aio restart-compute2).
COMPUTE2_CONF_DIR = pathlib.Path('/etc/nova/nova-compute-2.conf.d')
SCHEDULER_LOG = LOG_DIR / 'nova-scheduler.log'
# YoloBootFilter's debug line; Nova's HostState prints as "(host, node) ram: ...".
PREDICTION = re.compile(r'\((\S+), \S+\) ram: .*: predicted boot ([\d.]+)s \(io ([\d.]+), '
                        r'cpu ([\d.]+), cpu pressure ([\d.]+|unknown).*: (passes|rejected)\b'
                        r'(?:; with its fetch ([\d.]+)s \((\w+) ([\d.]+)s)?')
# nova-compute reports every 20 s here (tools/aio/lib.sh: update_resources_interval), 60 s by
# default; yolofs' load is a moving average with a time constant of
# 10 s, which has come 95% of the way to a new load after three.
REPORT_TIMEOUT = 300


def reported_stats(host):
    """The stats ``host`` last reported to the scheduler (Nova's compute_nodes), YOLO's among
    them; {} before its first report."""
    row = subprocess.run(
        ['mysql', '-N', '-B', 'nova', '-e',
         "SELECT stats FROM compute_nodes WHERE host = '%s' AND deleted = 0" % host],
        capture_output=True, text=True, check=True).stdout.strip()
    return json.loads(row) if row else {}


def wait_for_reports(hosts, after, accept=None, timeout=REPORT_TIMEOUT):
    """Waits until every host has reported a load measured after Unix time ``after`` (and, with
    ``accept``, until it accepts them); returns their I/O utilisations as reported: with a
    calibrated disk capacity a share of throughput, else of busy time."""
    def reported():
        stats = {host: reported_stats(host) for host in hosts}
        if any(float(s.get('yolo_updated_at', 0)) < after for s in stats.values()):
            return None
        loads = {host: float(s['yolo_io_utilisation']) for host, s in stats.items()}
        return loads if accept is None or accept(loads) else None
    return wait('reports of %s after %s' % (', '.join(hosts), time.ctime(after)), timeout,
                reported, interval=5.0)


def observed_boots(host, since=0.0):
    """The boots ``host``'s nova-compute timed (estimators.ObservedBoot), started after Unix
    time ``since``."""
    return [boot for boot in estimators.load_observed(OBSERVED_BOOTS[host])
            if boot.started_at >= since]


def log_position():
    return SCHEDULER_LOG.stat().st_size


def text_since(path, position):
    """What the log at ``path`` says after byte ``position``."""
    with open(path, 'rb') as f:
        f.seek(position)
        return f.read().decode(errors='replace')


def prediction_lines(since, log=SCHEDULER_LOG):
    """Every prediction of YoloBootFilter's in the scheduler's log after byte ``since``, in
    order: [(host, predicted seconds once it holds the image, io utilisation, verdict)]."""
    return [(m.group(1), float(m.group(2)), float(m.group(3)), m.group(6))
            for m in PREDICTION.finditer(text_since(log, since))]


def predictions(since, log=SCHEDULER_LOG):
    """YoloBootFilter's last prediction per host in the scheduler's log after byte ``since``:
    {host: (predicted seconds once it holds the image, io utilisation, verdict, cpu pressure or
    None, predicted seconds with its fetch, the fetch's path, the fetch's seconds)}; a scheduler
    from before locality logs no fetch (None, None, None)."""
    return {m.group(1): (float(m.group(2)), float(m.group(3)), m.group(6),
                         None if m.group(5) == 'unknown' else float(m.group(5)),
                         None if m.group(7) is None else float(m.group(7)), m.group(8),
                         None if m.group(9) is None else float(m.group(9)))
            for m in PREDICTION.finditer(text_since(log, since))}


# Where a host on an emulated HDD of its own (AIO_COMPUTE_DISK=hdd) names its throttle, for its
# libvirt hook (tools/aio/libvirt-qemu-hook): its libvirtd's /run/libvirt.
GUESTS_CGROUP_FILES = {FIRST_HOST: pathlib.Path('/run/libvirt/yolo-guests-blkio-cgroup'),
                       SECOND_HOST: COMPUTE2_LIBVIRT / 'run' / 'yolo-guests-blkio-cgroup'}
# yolofs' load is a moving average with a time constant of 10 s, which has come 95% of the way
# to a new load after three.
LOAD_SETTLE_SECONDS = 30


def instance_storage(host):
    """The host's instance storage as its stressors use it: in its throttle, with its guests and
    its yolofs, where the host is on an emulated HDD of its own."""
    cgroup_file = GUESTS_CGROUP_FILES[host]
    if cgroup_file.exists():
        cgroup = pathlib.Path(cgroup_file.read_text().strip())
        if cgroup.is_dir():     # not one a benchmark that was killed left named
            return storage.ThrottledDirectory(INSTANCES[host], cgroup)
    return storage.LocalDisk(INSTANCES[host])


@contextlib.contextmanager
def contention(host, count):
    """``count`` fio processes reading and writing the host's instance storage at random (the
    boot benchmark's stressors), for the duration; yields the Unix time from which yolofs'
    smoothed load has taken them in."""
    disk = instance_storage(host)
    files = [stressors.stressor_file(disk, i) for i in range(count)]
    try:
        for path in files:
            storage.write_random(path, stressors.STRESSOR_FILE_MIB)
        with stressors.io_stressors(disk, count):
            yield time.time() + LOAD_SETTLE_SECONDS
    finally:
        for path in files:
            path.unlink(missing_ok=True)
