"""Two compute hosts, one under I/O contention: where new servers land, what YoloBootFilter
predicted for each host, and how long their guests took to boot.

    python -m yolo_bench.scheduling [--requests 3] [--on-contended 1] [--stressors 2]
                                    [--yolo on,off]

(``bench/aio/scheduling`` stands the all-in-one cloud up with its second compute host first.)
For each scheduler setting and each phase (fio stressors on the first host's instance storage,
then on the second's), servers are created one at a time, each once both hosts have reported
their load after the stressors settled and after the last server was deleted (and its guest's
load left yolofs' average), and each deleted when its guest is ready. Settings: ``on`` is
YoloBootFilter and its weigher as configured; ``off`` makes the filter pass every host and the
weigher weigh nothing, so that Nova's own weighers choose, while the filter still logs its
predictions.

Per request: every host's predicted boot time and the filter's verdict (from the scheduler's
debug log), the host the server landed on, and its measured boot: from ACTIVE to the guest's
ready marker (QEMU starts about a second before Nova reports ACTIVE; the model predicts QEMU's
boot). The model's error is the prediction for the chosen host against the measured boot. With
``--on-contended``, each phase ends with servers the admin asks onto the contended host by name,
whose boots (which placement otherwise avoids) measure the model under contention.
"""

import argparse
import configparser
import dataclasses
import pathlib
import statistics
import subprocess
import sys
import time

import openstack
import psutil

from yolo_bench import cloud
from yolo_bench import replay
from yolo_nova.model import calibration
from yolo_testing import aio

FIRST_HOST = aio.FIRST_HOST
SECOND_HOST = aio.SECOND_HOST
INSTANCES = aio.INSTANCES
# Both hosts share this machine's CPUs, run their guests under TCG and learn from their boots
# as configured by default.
HOST_CPUS = psutil.cpu_count()
LEARN_FROM_BOOTS = 3
SCHEDULER_CONF = pathlib.Path('/etc/nova/nova-scheduler.conf')
# What setting "off" writes into [yolo] of the scheduler's configuration.
YOLO_OFF = {'max_boot_time_ratio': '0', 'max_predicted_boot_time': '0',
            'boot_time_weight_multiplier': '0'}
# Servers are kept this long after their guest is ready, for nova-compute to time their boot.
KEEP_SECONDS = 3.0


@dataclasses.dataclass
class Request:
    yolo: str               # the scheduler setting
    busy: str               # the host under contention
    number: int
    landed: str
    # host: (predicted boot seconds, io utilisation, verdict, cpu pressure or None)
    predicted: dict
    boot_seconds: float     # ACTIVE to ready
    # Asked onto the contended host by name (--on-contended): the model against a loaded boot.
    asked: bool = False

    @property
    def error(self):
        """The prediction for the chosen host against the measured boot (signed, relative)."""
        if self.landed not in self.predicted:
            return None
        return (self.predicted[self.landed][0] - self.boot_seconds) / self.boot_seconds


def device_of(path):
    """The device of the filesystem that holds ``path``."""
    return subprocess.run(['findmnt', '-n', '-o', 'SOURCE', '--target', str(path)],
                          capture_output=True, text=True).stdout.strip()


def reported_parameters(hosts):
    """{host: (alpha, beta, alpha_yolo, io_pole_yolo, cpu_contention, beta_growth)} as the
    hosts last reported them."""
    return {host: tuple(float(aio.reported_stats(host).get('yolo_' + name, 'nan'))
                        for name in ('alpha', 'beta', 'alpha_yolo', 'io_pole_yolo',
                                     'cpu_contention', 'beta_growth'))
            for host in hosts}


def described(boot):
    """Where a timed boot's time went, as its host recorded it."""
    if boot is None:
        return 'not timed'
    parts = ['%.1f s from its start to ready: vCPU %.1f s' % (boot.seconds, boot.cpu_seconds)]
    if boot.cpu_delay_seconds is not None:
        parts.append('waited for a CPU %.1f s' % boot.cpu_delay_seconds)
    if boot.disk_seconds is not None:
        writes = boot.disk_write_seconds
        parts.append('for its disks %.2f s' % boot.disk_seconds if writes is None else
                     'for its reads %.2f s, its writes %.2f s' % (
                         boot.disk_seconds - writes, writes))
    return ', '.join(parts)


def stolen_share(before, after):
    """The hypervisor's steal between two psutil.cpu_times(), as a share of the CPUs' busy time
    (which counts it): of a virtual machine's CPUs, what its hypervisor took while they wanted
    to run."""
    delta = {name: getattr(after, name) - getattr(before, name) for name in after._fields}
    busy = sum(delta.values()) - delta['idle'] - delta.get('iowait', 0.0) \
        - delta.get('guest', 0.0) - delta.get('guest_nice', 0.0)
    return delta.get('steal', 0.0) / busy if busy > 0 else 0.0


def set_scheduler(setting):
    """YOLO's filter and weigher as configured (``on``) or without effect (``off``); restarts
    nova-scheduler."""
    conf = configparser.ConfigParser(interpolation=None)
    conf.read(SCHEDULER_CONF)
    if not conf.has_section('yolo'):
        conf.add_section('yolo')
    for key, value in YOLO_OFF.items():
        if setting == 'off':
            conf.set('yolo', key, value)
        else:
            conf.remove_option('yolo', key)
    with open(SCHEDULER_CONF, 'w') as f:   # in place: its owner and mode stay
        conf.write(f)
    subprocess.run([str(aio.AIO), 'restart-scheduler'], check=True, stdout=subprocess.DEVNULL)


def request(conn, admin, image, flavor, name, timeout, **placement):
    """One server: (the host it landed on, its boot from ACTIVE to ready, the predictions);
    ``placement``: an admin's ``host=HOST`` (the scheduler's filters weigh that host alone)."""
    since = aio.log_position()
    landed = {}

    def on_active(servers):
        landed['host'] = admin.compute.get_server(servers[0].id).compute_host
    active, ready, _ = cloud.boot_servers(conn, admin, image, flavor, name, 1, timeout,
                                          on_active=on_active, keep_seconds=KEEP_SECONDS,
                                          **placement)
    return landed['host'], ready - active, aio.predictions(since)


def summary(requests):
    lines = ['| YOLO in the scheduler | contended host | request | predicted %s (io, cpu '
             'pressure) | predicted %s (io, cpu pressure) | landed on | boot, ACTIVE to ready '
             '(s) | model error |' % (
                 FIRST_HOST, SECOND_HOST),
             '|---|---|---:|---:|---:|---|---:|---:|']
    for r in requests:
        cells = [r.yolo, r.busy, str(r.number)]
        for host in (FIRST_HOST, SECOND_HOST):
            seconds, io, verdict, pressure = r.predicted.get(
                host, (float('nan'), float('nan'), '-', None))
            cells.append('%.1f (%.2f, %s)%s' % (
                seconds, io, '-' if pressure is None else '%.2f' % pressure,
                ', rejected' if verdict == 'rejected' else ''))
        error = r.error
        cells += [r.landed + (' (asked)' if r.asked else ''), '%.1f' % r.boot_seconds,
                  '-' if error is None else '%+.0f%%' % (100 * error)]
        lines.append('| ' + ' | '.join(cells) + ' |')
    lines.append('')
    for setting in dict.fromkeys(r.yolo for r in requests):
        mine = [r for r in requests if r.yolo == setting and not r.asked]
        away = sum(r.landed != r.busy for r in mine)
        if mine:
            lines.append('YOLO %s: %d of %d servers on the host without contention; %s' % (
                setting, away, len(mine), error_summary(mine)))
        asked = [r for r in requests if r.yolo == setting and r.asked]
        if asked:
            lines.append('YOLO %s, servers asked onto the contended host: %s' % (
                setting, error_summary(asked)))
    return '\n'.join(lines)


def error_summary(requests):
    errors = [abs(r.error) for r in requests if r.error is not None]
    return 'mean absolute model error %s; boot median %.1f s' % (
        '%.0f%%' % (100 * statistics.mean(errors)) if errors else '-',
        statistics.median(r.boot_seconds for r in requests))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.scheduling',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--requests', type=int, default=3,
                        help='servers per setting and phase (default: %(default)s)')
    parser.add_argument('--warm-ups', type=int, default=3,
                        help='untimed boots on each host first (default: %(default)s)')
    parser.add_argument('--stressors', type=int, default=2,
                        help='fio stressors on the contended host\'s instance storage '
                             '(default: %(default)s)')
    parser.add_argument('--on-contended', type=int, default=0, metavar='N',
                        help='after each phase\'s requests, N servers the admin asks onto the '
                             'contended host by name (the scheduler weighs that host alone): '
                             'the model against boots under contention, which placement '
                             'otherwise avoids (default: %(default)s)')
    parser.add_argument('--yolo', type=cloud.comma_separated(('on', 'off'), 'setting'),
                        default=['on', 'off'],
                        help='scheduler settings, comma-separated: on, off (default: on,off)')
    parser.add_argument('--cloud', default='aio-demo',
                        help='clouds.yaml cloud that creates the servers (default: %(default)s)')
    parser.add_argument('--admin-cloud', default='aio-admin', help='(default: %(default)s)')
    parser.add_argument('--image', default='debian12-yolo',
                        help='public image to boot, uploaded if missing (default: %(default)s)')
    parser.add_argument('--flavor', default='m1.yolo', help='(default: %(default)s)')
    parser.add_argument('--timeout', type=float, default=1800.0,
                        help='seconds one boot may take (default: %(default)s)')
    cloud.ready_pattern_option(parser)
    args = parser.parse_args(argv)
    if args.requests < 0 or args.on_contended < 0:
        parser.error('--requests and --on-contended take a number of servers (0 or more)')
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cloud.set_ready_pattern(args.ready_pattern)
    admin = openstack.connect(cloud=args.admin_cloud)
    user = openstack.connect(cloud=args.cloud)
    image = cloud.public_image(admin, args.image)
    print('==> waiting for the boot image of %s' % args.image, flush=True)
    cloud.wait_for_boot_image(admin, image, args.timeout)
    flavor = user.compute.find_flavor(args.flavor)
    admin_flavor = admin.compute.find_flavor(args.flavor)
    # Placed by the admin, and not counted: the first caches the image in _base and installs its
    # boot image, as later boots find them; each is timed by the host's nova-compute, whose
    # boot-time parameters come from its own last boots once there are [yolo] learn_from_boots.
    for host in INSTANCES:
        for number in range(1, args.warm_ups + 1):
            active, ready, _ = cloud.boot_servers(
                admin, admin, image, admin_flavor, 'scheduling-warm-up', 1, args.timeout,
                keep_seconds=KEEP_SECONDS, availability_zone='nova:%s' % host)
            print('==> warm-up boot %d on %s: ACTIVE to ready %.1f s' % (
                number, host, ready - active), flush=True)
    for host, path in INSTANCES.items():
        disk = aio.instance_storage(host)
        print('==> %s: instances on %s, %s' % (
            host, device_of(path), 'blkio cgroup %s' % disk.cgroup if disk.name == 'hdd'
            else 'unthrottled'), flush=True)
    requests = []
    try:
        for setting in args.yolo:
            set_scheduler(setting)
            for busy in (FIRST_HOST, SECOND_HOST):
                with aio.contention(busy, args.stressors) as settled:
                    loads = aio.wait_for_reports(INSTANCES, settled)
                    print('==> YOLO %s, %s under contention: reported I/O %s, parameters %s'
                          % (setting, busy, loads, reported_parameters(INSTANCES)), flush=True)
                    fresh_after = settled
                    for number in range(1, args.requests + args.on_contended + 1):
                        # Each request is predicted from reports of the hosts as they are: taken
                        # once the last server's guest has left yolofs' smoothed load, and after
                        # its host learned from its boot.
                        aio.wait_for_reports(INSTANCES, fresh_after)
                        parameters = reported_parameters(INSTANCES)
                        onto_busy = number > args.requests
                        name = 'scheduling-%s-%s-%d' % (setting, busy, number)
                        asked, cpu_before = time.time(), psutil.cpu_times()
                        conn, flavor_of_conn, placement = (
                            (admin, admin_flavor, {'host': busy}) if onto_busy
                            else (user, flavor, {}))
                        landed, boot, predicted = request(conn, admin, image, flavor_of_conn,
                                                          name, args.timeout, **placement)
                        stolen = stolen_share(cpu_before, psutil.cpu_times())
                        fresh_after = time.time() + aio.LOAD_SETTLE_SECONDS
                        requests.append(Request(setting, busy, number, landed, predicted, boot,
                                                asked=onto_busy))
                        timed = aio.observed_boots(landed, since=asked)
                        print('==> %d: landed on %s, boot %.1f s, predicted %s from parameters '
                              '%s' % (number, landed, boot, predicted, parameters), flush=True)
                        print('    its guest: %s; steal %.0f%% of the CPUs\' busy time meanwhile'
                              % (described(timed[-1] if timed else None), 100 * stolen),
                              flush=True)
    finally:
        set_scheduler('on')
    print()
    print(summary(requests))
    for host, path in aio.OBSERVED_BOOTS.items():
        print('\n==> the model on the boots %s timed, each predicted from those before it '
              '(python -m yolo_bench.replay %s --cpus %d --accel tcg):' % (host, path, HOST_CPUS))
        base = dataclasses.replace(calibration.UNCALIBRATED, cpus=HOST_CPUS)
        boots = [boot for boot in aio.observed_boots(host) if boot.accel == 'tcg']
        print('\n'.join(replay.report(base, boots, LEARN_FROM_BOOTS)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
