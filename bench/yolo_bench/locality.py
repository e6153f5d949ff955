"""Where the bytes are: two compute hosts that hold different parts of an image; where new
servers land, how long their boot took there and, right after, on the other host.

    python -m yolo_bench.locality [--requests 6] [--scenarios 1,2,3] [--stressors 2]
                                  [--slow-link 100]

(``bench/aio/locality`` stands the all-in-one cloud up with its second compute host first.)
Scenarios (docs/scheduling.md, "Where the bytes are"):

1. the second host holds the image's base file and boot image (Nova's image pre-caching, which
   installs the boot image too); the first holds nothing, and boots after the download (the
   all-in-one's first host: ``first_boot_before_download = False``): Nova's download and
   conversion, then a normal boot;
2. the first host holds the base file and boot image, but its instance storage is under I/O
   contention (fio stressors); the second holds only the boot image (``openstack yolo image
   warm``), and streams its first boot;
3. neither holds anything, and both take Nova's path (the second host's first boots before the
   download turned off): the second reaches Glance through a link of ``--slow-link`` Mbit/s
   (tc, on the address of glance-api's that its Nova is pointed at), the first through the
   loopback's. The second forgets the transfers it measured its rate from before, then each
   host downloads the image once, untimed: the scheduler then knows each host's link from its
   own downloads.

Before each boot, both hosts are set to the scenario: what they held of the image is removed
(the base file, as Nova's image cache manager removes an unused one, then yolofs' ``prune``, and
the warm store's file), then given again, and both have reported since. A server is created as
the demo user and timed from its request to its guest's ready line on the host the scheduler
chose; the hosts are set again, and the admin boots the image on the other host, timed the same
way. Once per scenario, a server with YOLO's filter and weigher off shows Nova's own weighers'
choice. Reported per scenario: where each server landed, both boots, the time YOLO's choice saved
against Nova's (the other host's boot minus the chosen one's where the two differ, 0 where they
agree), its mean and spread.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openstack

from yolo_bench import cloud
from yolo_bench import first_boots
from yolo_bench import scheduling
from yolo_nova.model import estimators
from yolo_nova.model import locality
from yolo_testing import aio
from yolo_testing import wait

FIRST_HOST, SECOND_HOST = aio.FIRST_HOST, aio.SECOND_HOST
# The all-in-one's second host looks for warm images every 30 s (tools/aio/lib.sh).
WARM_TIMEOUT = 300


def yolofs_ctl(host, *args):
    proc = subprocess.run([str(aio.YOLOFS_BIN), 'ctl', '--socket', str(aio.CONTROL_SOCKETS[host]),
                           *args], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(proc.stdout)


def warm_store(host):
    return aio.INSTANCES[host] / 'yolo-incoming' / 'warm'


def base_file(host, image_id):
    return aio.INSTANCES[host] / '_base' / locality.base_file_name(image_id)


def holds(host, image_id):
    """What ``host`` holds of the image: 'base' (with its boot image), 'boot image' (warm) or
    'nothing'."""
    if base_file(host, image_id).exists():
        return 'base'
    store = warm_store(host)
    if store.exists() and any(p.name.startswith(image_id + '.') for p in store.iterdir()):
        return 'boot image'
    return 'nothing'


def forget(host, image_id):
    """The host holds nothing of the image: its base file removed (no server uses it), yolofs'
    boot image of it pruned, its warm store's file removed."""
    base_file(host, image_id).unlink(missing_ok=True)
    yolofs_ctl(host, 'prune')
    store = warm_store(host)
    if store.exists():
        for path in store.iterdir():
            if path.name.startswith(image_id + '.'):
                path.unlink()


class Aggregates:
    """One host aggregate per host, for Nova's image pre-caching and for warming."""

    def __init__(self, admin):
        self.admin = admin
        self.of = {}
        for host in aio.HOSTS:
            aggregate = admin.compute.create_aggregate(name='locality-%s-%d' % (host, os.getpid()))
            admin.compute.add_host_to_aggregate(aggregate, host)
            self.of[host] = aggregate

    def close(self):
        for host, aggregate in self.of.items():
            openstack_cli('aggregate', 'remove', 'host', aggregate.id, host)
            openstack_cli('aggregate', 'delete', aggregate.id)


def openstack_cli(*args):
    """An admin's ``openstack`` command; tried again a few times: an aggregate's change tells
    the scheduler, whose exchange is not there yet for a few seconds after its restart
    (scheduling.set_scheduler)."""
    for attempt in range(5):
        proc = subprocess.run([str(aio.VENV / 'bin' / 'openstack'), '--os-cloud', 'aio-admin',
                               *map(str, args)], capture_output=True, text=True)
        if proc.returncode == 0:
            return
        time.sleep(5)
    raise RuntimeError('openstack %s: %s' % (' '.join(args), proc.stderr.strip()))


def cache(aggregates, host, image):
    """The host holds the image's base file and boot image (Nova's image pre-caching)."""
    openstack_cli('--os-compute-api-version', '2.81', 'aggregate', 'cache', 'image',
                  aggregates.of[host].id, image.id)
    wait.wait('%s caching %s' % (host, image.name), 600,
              lambda: holds(host, image.id) == 'base' and any(
                  b['image_id'] == image.id and b['verified']
                  for b in yolofs_ctl(host, 'status')['boot_images']), interval=3.0)


def warm(aggregates, host, image):
    """The host holds the image's boot image alone (its warm store)."""
    openstack_cli('yolo', 'image', 'warm', image.id, '--aggregate', aggregates.of[host].id)
    wait.wait('%s warming %s' % (host, image.name), WARM_TIMEOUT,
              lambda: holds(host, image.id) == 'boot image', interval=3.0)


def unwarm(image):
    openstack_cli('yolo', 'image', 'unwarm', image.id)


SCENARIOS = {
    # name: (what each host holds, the host under contention)
    '1': ({SECOND_HOST: 'base', FIRST_HOST: 'nothing'}, None),
    '2': ({FIRST_HOST: 'base', SECOND_HOST: 'boot image'}, FIRST_HOST),
    '3': ({FIRST_HOST: 'nothing', SECOND_HOST: 'nothing'}, None),
}
# Scenario 3's links: the second host's Nova reaches glance-api at its second address.
OWN_LINK = aio.settings()['AIO_GLANCE_SECOND_ADDRESS']
OWN_LINK_CONF = aio.COMPUTE2_CONF_DIR / 'locality-own-link.conf'


@contextlib.contextmanager
def own_link(mbit):
    """The second host reaches Glance through a link of ``mbit`` Mbit/s, on Nova's path; it
    forgets the transfers it measured its rate from over the loopback's (read as it starts)."""
    url = 'http://%s:%s/' % (OWN_LINK, first_boots.GLANCE_PORT)
    try:
        urllib.request.urlopen(url, timeout=10).close()
    except urllib.error.HTTPError:
        pass                                    # it answers
    except OSError as e:
        raise SystemExit('glance-api does not answer at %s (%s): stand the all-in-one up again '
                         '(tools/aio/aio clean, then bench/aio/locality)' % (url, e))
    OWN_LINK_CONF.write_text(
        '[glance]\nendpoint_override = http://%s:%s\n'
        '[yolo]\nfirst_boot_before_download = false\n' % (OWN_LINK, first_boots.GLANCE_PORT))
    try:
        aio.TRANSFERS[SECOND_HOST].unlink(missing_ok=True)
        subprocess.run([str(aio.AIO), 'restart-compute2'], check=True)
        with first_boots.glance_link(address=OWN_LINK) as set_rate:
            set_rate(mbit)
            yield
    finally:
        # Nor are the rates measured through this link kept.
        OWN_LINK_CONF.unlink(missing_ok=True)
        aio.TRANSFERS[SECOND_HOST].unlink(missing_ok=True)
        subprocess.run([str(aio.AIO), 'restart-compute2'], check=True)


def forget_timed_boots(host):
    """The host forgets the boots it timed but its first boots before the download, which
    measure its streamed_boot_factor alone."""
    path = str(aio.OBSERVED_BOOTS[host])
    estimators.save_observed([b for b in estimators.load_observed(path) if b.streamed], path)


def set_hosts(aggregates, image, held):
    """Each host holds what ``held`` says of the image, and has reported it. Both forget the
    boots they timed (forget_timed_boots): they report the same parameters, and differ only in
    what they hold, their load and what their first boots before the download measured."""
    for host in aio.HOSTS:
        forget(host, image.id)
        forget_timed_boots(host)
    for host, what in held.items():
        if what == 'base':
            cache(aggregates, host, image)
        elif what == 'boot image':
            warm(aggregates, host, image)
    for host, what in held.items():
        assert holds(host, image.id) == what, (host, holds(host, image.id), what)
    # Reports measured once the caching's download and conversion have left the load.
    aio.wait_for_reports(aio.HOSTS, time.time() + aio.LOAD_SETTLE_SECONDS)


def boot(conn, admin, image, flavor, name, timeout, **placement):
    """(the host it landed on, request to ready in seconds, the scheduler's predictions)."""
    since = aio.log_position()
    landed = {}

    def on_active(servers):
        landed['host'] = admin.compute.get_server(servers[0].id).compute_host
    _, ready, _ = cloud.boot_servers(conn, admin, image, flavor, name, 1, timeout,
                                     on_active=on_active, keep_seconds=scheduling.KEEP_SECONDS,
                                     **placement)
    return landed['host'], ready, aio.predictions(since)


def measure_links(aggregates, admin, image, flavors, timeout):
    """Each host downloads the image once (an untimed boot there): it measures its link."""
    for host in aio.HOSTS:
        set_hosts(aggregates, image, SCENARIOS['3'][0])
        boot(admin, admin, image, flavors['admin'], 'locality-link-%s' % host, timeout,
             availability_zone='nova:%s' % host)


def run_scenario(args, name, aggregates, user, admin, image, flavors):
    held, busy = SCENARIOS[name]
    warmed = 'boot image' in held.values()
    rows = []
    try:
        if not warmed:
            unwarm(image)
        with contextlib.ExitStack() as scenario:
            if busy:
                scenario.enter_context(aio.contention(busy, args.stressors))
            if name == '3':
                scenario.enter_context(own_link(args.slow_link))
                measure_links(aggregates, admin, image, flavors, args.timeout)
            scheduling.set_scheduler('off')
            try:
                set_hosts(aggregates, image, held)
                nova_choice, _, _ = boot(user, admin, image, flavors['user'],
                                         'locality-%s-nova' % name, args.timeout)
            finally:
                scheduling.set_scheduler('on')
            print('==> scenario %s: %s; Nova\'s own weighers chose %s' % (
                name, held, nova_choice), flush=True)
            for number in range(1, args.requests + 1):
                set_hosts(aggregates, image, held)
                chosen, chosen_seconds, predicted = boot(
                    user, admin, image, flavors['user'], 'locality-%s-%d' % (name, number),
                    args.timeout)
                other = SECOND_HOST if chosen == FIRST_HOST else FIRST_HOST
                set_hosts(aggregates, image, held)
                _, other_seconds, _ = boot(admin, admin, image, flavors['admin'],
                                           'locality-%s-%d-other' % (name, number),
                                           args.timeout, availability_zone='nova:%s' % other)
                seconds = {chosen: chosen_seconds, other: other_seconds}
                saved = seconds[nova_choice] - seconds[chosen]
                rows.append({'scenario': name, 'request': number, 'chosen': chosen,
                             'holds': held[chosen], 'seconds': seconds, 'nova_choice': nova_choice,
                             'saved_vs_nova': saved, 'predicted': predicted})
                print('==> %s.%d: landed on %s (holds %s), request to ready %.1f s; on %s '
                      '(holds %s) %.1f s; saved against Nova\'s choice %.1f s; predicted %s' % (
                          name, number, chosen, held[chosen], chosen_seconds, other,
                          held[other], other_seconds, saved, predicted), flush=True)
    finally:
        if warmed:
            unwarm(image)
    return rows


# The model's accuracy goal (docs/scheduling.md): a gap between the hosts' boots within it is
# one the scheduler is not expected to see.
MODEL_ERROR = 0.15


def chose_the_faster(row):
    return row['seconds'][row['chosen']] <= min(row['seconds'].values())


def decisive(row):
    """Whether the hosts' boots differed by more than the model's error."""
    fast, slow = sorted(row['seconds'].values())
    return slow > fast * (1 + MODEL_ERROR)


def summary(rows):
    lines = ['scenario  requests  chose the faster  where the gap > %d%%  '
             'saved against Nova (mean, stdev, min, max)' % (MODEL_ERROR * 100)]
    for name in sorted({r['scenario'] for r in rows}):
        mine = [r for r in rows if r['scenario'] == name]
        saved = [r['saved_vs_nova'] for r in mine]
        wide = [r for r in mine if decisive(r)]
        lines.append('%-9s %8d  %16s  %18s  %.1f s, %.1f s, %.1f s, %.1f s' % (
            name, len(mine), '%d of %d' % (sum(map(chose_the_faster, mine)), len(mine)),
            '%d of %d' % (sum(map(chose_the_faster, wide)), len(wide)), statistics.fmean(saved),
            statistics.stdev(saved) if len(saved) > 1 else 0.0, min(saved), max(saved)))
    return '\n'.join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.locality',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--requests', type=int, default=6,
                        help='servers per scenario (default: %(default)s)')
    parser.add_argument('--scenarios', type=cloud.comma_separated(tuple(SCENARIOS), 'scenario'),
                        default=list(SCENARIOS), help='comma-separated (default: 1,2,3)')
    parser.add_argument('--stressors', type=int, default=2,
                        help='fio stressors on the contended host (default: %(default)s)')
    parser.add_argument('--slow-link', type=int, default=100,
                        help="the second host's link to Glance in scenario 3, Mbit/s "
                             '(default: %(default)s)')
    parser.add_argument('--image', default='debian12-yolo',
                        help='public image to boot, uploaded if missing (default: %(default)s)')
    parser.add_argument('--flavor', default='m1.yolo', help='(default: %(default)s)')
    parser.add_argument('--timeout', type=float, default=1800.0,
                        help='seconds one boot may take (default: %(default)s)')
    parser.add_argument('--json', help='write every request to this file')
    cloud.ready_pattern_option(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cloud.set_ready_pattern(args.ready_pattern)
    admin = openstack.connect(cloud='aio-admin')
    user = openstack.connect(cloud='aio-demo')
    image = cloud.public_image(admin, args.image)
    print('==> waiting for the boot image of %s' % args.image, flush=True)
    cloud.wait_for_boot_image(admin, image, args.timeout)
    flavors = {'user': user.compute.find_flavor(args.flavor),
               'admin': admin.compute.find_flavor(args.flavor)}
    aggregates = Aggregates(admin)
    rows = []
    try:
        for name in args.scenarios:
            rows += run_scenario(args, name, aggregates, user, admin, image, flavors)
    finally:
        aggregates.close()
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(rows, f, indent=1)
    print()
    print(summary(rows))
    return 0


if __name__ == '__main__':
    sys.exit(main())
