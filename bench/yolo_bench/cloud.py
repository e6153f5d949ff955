"""Boot times through Nova on the all-in-one cloud: ``openstack server create`` to ACTIVE and to
the guest's ready marker, per policy, the page cache dropped before each boot.

    python -m yolo_bench.cloud [--repetitions 3] [--storage hdd --stressors 0,8] [--servers 1,4]
                               [--images same,distinct] [--csv FILE] [--plot PNG]
    python -m yolo_bench.cloud --report FILE... [--plot PNG]

Each boot is appended to the CSV file as it is measured (an interrupted run keeps what it
measured); ``--report`` prints the summary (and draws the plot) of earlier runs' files.

Policies: ``off`` is yolofs stopped on the compute node (the driver then backs instance disks on
``_base``, Nova's own behaviour), ``on`` is YOLO, ``warm`` is ``off`` with the base file read into
the page cache first (which helps only where Nova's cache mode goes through the page cache; the
report gives the mode Nova chose, read from the guest's domain XML). Runs are interleaved:
repetition by repetition, condition by condition, policy by policy, so that the machine's noise
falls on all alike. Servers are created as a non-admin user with ``--nic none``; ``--servers N``
creates N at once (``--min N --max N``) and reports the last of them; with ``--images distinct``,
N servers of N distinct images (the image and copies of it uploaded as other public images: each
its own base file, boot image and page cache), a request each in quick succession.

Storage ``hdd``: for the run, the compute node's instances directory (``_base`` included) is the
boot benchmark's emulated HDD (``yolo_testing.storage.ThrottledDisk``, mounted over it), and every
process doing I/O there shares its one blkio throttle: the fio stressors and yolofs are moved into
its cgroup, and each guest's QEMU joins it as it starts, paused before its vCPUs run, through the
all-in-one's libvirt hook (``tools/aio/libvirt-qemu-hook``).

Run as root with the all-in-one's venv (bench/aio/boot-times does both).
"""

import argparse
import contextlib
import csv
import dataclasses
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import openstack

from yolo_bench import results
from yolo_common import contract
from yolo_common import images
from yolo_common import yolofs
from yolo_glance import conf as glance_conf
from yolo_testing import aio
from yolo_testing import REPO
from yolo_testing import stressors as stressors_mod
from yolo_testing.wait import wait

# A guest's ready line, by default: what ends the Glance worker's profiling boots by default.
# An image's yolo_ready_pattern (the worker's too) wins, and a benchmark's --ready-pattern wins
# over both.
READY_PATTERN = re.compile(next(opt.default for opt in glance_conf.profiling_opts
                                if opt.name == 'ready_pattern'))
POLICIES = ('off', 'on', 'warm')
IMAGE_KINDS = ('same', 'distinct')
INSTANCES = aio.INSTANCES[aio.FIRST_HOST]
# Read by tools/aio/libvirt-qemu-hook: the cgroup the first host's guests join as they start.
GUESTS_CGROUP_FILE = aio.GUESTS_CGROUP_FILES[aio.FIRST_HOST]
# Where the all-in-one's compute hosts keep their instances (tools/aio/settings
# AIO_COMPUTE_DISK): this benchmark mounts its emulated HDD over the first host's directory on
# the machine's disk, not over a disk of the host's own.
COMPUTE_DISK_FILE = aio.STATE[aio.FIRST_HOST] / 'compute-disk'


@dataclasses.dataclass
class Boot:
    policy: str
    stressors: int
    servers: int
    repetition: int
    active_seconds: float       # until the last server was ACTIVE
    ready_seconds: float        # until the last guest was ready
    cache: str                  # Nova's cache mode for the root disk (domain XML)
    images: str = 'same'        # the servers' image: one for all, or 'distinct' images
    # Seconds the guests' root disk requests took up to ready (reads, writes, flushes): their
    # latencies summed per guest (overlapping requests count apart), averaged over the guests
    # (QEMU's counters). What the guests waited for their disk, on a contended one.
    disk_seconds: tuple = None

    def row(self):
        return {'policy': self.policy, 'stressors': self.stressors, 'servers': self.servers,
                'images': self.images, 'repetition': self.repetition,
                'active_s': '%.2f' % self.active_seconds, 'ready_s': '%.2f' % self.ready_seconds,
                'cache': self.cache,
                **dict(zip(DISK_FIELDS, ('%.3f' % t for t in self.disk_seconds or ())))}

    @classmethod
    def from_row(cls, row):
        disk = tuple(float(row[name]) for name in DISK_FIELDS if row.get(name))
        return cls(row['policy'], int(row['stressors']), int(row['servers']),
                   int(row['repetition']), float(row['active_s']), float(row['ready_s']),
                   row['cache'], row['images'], disk or None)


DISK_FIELDS = ('disk_read_s', 'disk_write_s', 'disk_flush_s')
CSV_FIELDS = ('policy', 'stressors', 'servers', 'images', 'repetition', 'active_s', 'ready_s',
              'cache') + DISK_FIELDS


def append_csv(path, boot):
    results.append_row(path, CSV_FIELDS, boot.row())


def read_csv(path):
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != CSV_FIELDS:
            raise ValueError('%s: expected columns %s, found %s' % (
                path, ', '.join(CSV_FIELDS), ', '.join(reader.fieldnames or ())))
        return [Boot.from_row(row) for row in reader]


def drop_caches():
    subprocess.run(['sync'], check=True)
    pathlib.Path('/proc/sys/vm/drop_caches').write_text('3\n')


class ComputeNode:
    """The all-in-one's compute node as the benchmark changes it: yolofs on or off, and (storage
    ``hdd``) the emulated HDD under its instances directory, whose cgroup yolofs joins whenever
    it starts."""

    def __init__(self):
        self.disk = None

    def set_policy(self, policy):
        subprocess.run([str(aio.AIO), 'start-yolofs' if policy == 'on' else 'stop-yolofs'],
                       check=True, stdout=subprocess.DEVNULL)
        if policy == 'on' and self.disk is not None:
            # The service's process group: the keeper and yolofs (a restarted one inherits it).
            group = os.getpgid(int(aio.YOLOFS_PID_FILE.read_text()))
            pids = subprocess.run(['pgrep', '-g', str(group)], check=True, capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                (self.disk.cgroup / 'cgroup.procs').write_text(pid)

    @contextlib.contextmanager
    def instances_on_hdd(self, stressors):
        """The instances directory on a new emulated HDD for the duration (nothing of the one
        beneath it is seen meanwhile: ``_base`` starts empty), with files for ``stressors``."""
        from yolo_testing import storage
        self.set_policy('off')      # yolofs reads _base: it starts again on the new one
        # Placement gives each server its flavor's disk out of the file system's size (DISK_GB):
        # room for a storm of 8 servers of 4 GB beside their base files (the file is sparse).
        disk = storage.ThrottledDisk(INSTANCES, size_gib=64)
        disk.setup()
        try:
            for path in (INSTANCES, INSTANCES / '_base'):
                path.mkdir(exist_ok=True)
                shutil.chown(path, 'nova', 'nova')
                path.chmod(0o755)
            for i in range(stressors):
                storage.write_random(stressors_mod.stressor_file(disk, i),
                                     stressors_mod.STRESSOR_FILE_MIB)
            self.disk = disk
            GUESTS_CGROUP_FILE.write_text(str(disk.cgroup))
            yield disk
        finally:
            GUESTS_CGROUP_FILE.unlink(missing_ok=True)
            self.set_policy('off')
            self.disk = None
            disk.teardown()


# libvirt of the all-in-one's second compute host (tools/aio/settings); the first host's is the
# machine's.
LIBVIRT_URIS = {aio.SECOND_HOST: aio.COMPUTE2_LIBVIRT_URI}


def virsh(admin, server_id, *args):
    """``virsh COMMAND DOMAIN ARGS...`` on the server's guest, through its host's libvirtd."""
    server = admin.compute.get_server(server_id)
    uri = LIBVIRT_URIS.get(server.compute_host, 'qemu:///system')
    command, *rest = args
    return subprocess.run(['virsh', '-c', uri, command, server.instance_name, *rest],
                          check=True, capture_output=True, text=True).stdout


def cache_mode(admin, server_id):
    """The cache mode of the guest's root disk in its libvirt domain XML."""
    xml = ET.fromstring(virsh(admin, server_id, 'dumpxml'))
    return xml.find('./devices/disk/driver').get('cache')


def disk_seconds(admin, server_id):
    """(reads, writes, flushes): the seconds the requests of the guest's root disk took so
    far, each kind summed, as QEMU counts them (``virsh domblkstat``)."""
    xml = ET.fromstring(virsh(admin, server_id, 'dumpxml'))
    device = xml.find('./devices/disk/target').get('dev')
    stats = dict(line.split()[1:3] for line in
                 virsh(admin, server_id, 'domblkstat', device).splitlines() if line.strip())
    return tuple(int(stats.get(kind + '_total_times', 0)) / 1e9
                 for kind in ('rd', 'wr', 'flush'))


class GuestFailed(Exception):
    """A guest that will never be ready."""


def ready_pattern_option(parser):
    """Adds --ready-pattern to a benchmark's arguments; main() hands it to set_ready_pattern."""
    parser.add_argument('--ready-pattern', type=re.compile,
                        help="regular expression of a guest's ready line on its console "
                             "(default: the image's %s, else the Glance worker's default, %r)"
                             % (contract.READY_PATTERN, READY_PATTERN.pattern))


_chosen_pattern = None


def set_ready_pattern(pattern):
    """The ready line of every guest this benchmark boots (None: by image)."""
    global _chosen_pattern
    _chosen_pattern = pattern


def ready_pattern(admin, image_id):
    """The regular expression of the ready line of a guest of ``image_id``."""
    if _chosen_pattern is not None:
        return _chosen_pattern
    own = (admin.image.get_image(image_id).properties or {}).get(contract.READY_PATTERN)
    return re.compile(own) if own else READY_PATTERN


def states_of(conn, servers):
    return [conn.compute.get_server(s.id) for s in servers]


def boot_servers(conn, admin, image, flavor, name, count, timeout, on_active=None,
                 keep_seconds=0.0, on_ready=None, **placement):
    """Creates ``count`` servers at once (one request, ``--min``/``--max``), or with a list of
    images one server of each (a request each, in quick succession); returns (seconds until the
    last is ACTIVE, seconds until the last guest is ready, the cache mode); deletes them,
    ``keep_seconds`` after the last is ready (nova-compute's boot timer reads the consoles once
    a second: a guest deleted at once may not be timed). ``on_active(servers)`` is called once
    all are ACTIVE, ``on_ready(servers)`` once all are ready; ``placement``: more arguments of
    the requests (an admin's ``availability_zone='nova:HOST'``)."""
    started = time.monotonic()
    if isinstance(image, list):
        servers = [conn.compute.create_server(name='%s-%d' % (name, number), image_id=one.id,
                                              flavor_id=flavor.id, networks='none', **placement)
                   for number, one in enumerate(image, 1)]
    else:
        first = conn.compute.create_server(name=name, image_id=image.id, flavor_id=flavor.id,
                                           networks='none', min_count=count, max_count=count,
                                           **placement)
        servers = [first] if count == 1 else wait(
            'servers %s' % name, 60,
            lambda: [s for s in conn.compute.servers(name='^%s-' % name)] or None)
    try:
        assert len(servers) == count, (name, [s.name for s in servers])

        def active():
            states = states_of(conn, servers)
            failed = [s for s in states if s.status == 'ERROR']
            if failed:
                raise RuntimeError('server %s went to ERROR: %s' % (failed[0].id,
                                                                    failed[0].fault))
            return all(s.status == 'ACTIVE' for s in states)
        wait('servers ACTIVE', timeout, active)
        active_at = time.monotonic()
        if on_active is not None:
            on_active(servers)
        cache = cache_mode(admin, servers[0].id)
        requested = image if isinstance(image, list) else [image] * len(servers)
        patterns = {one.id: ready_pattern(admin, one.id) for one in requested}
        pending = {s.id: patterns[one.id] for s, one in zip(servers, requested)}

        def ready():
            for server_id, pattern in list(pending.items()):
                output = conn.compute.get_server_console_output(server_id).get('output', '')
                if pattern.search(output):
                    del pending[server_id]
                elif 'Kernel panic' in output:
                    raise GuestFailed('the guest of %s panicked: %s' % (
                        server_id, output[output.index('Kernel panic'):].splitlines()[0]))
            return not pending
        wait('guests ready', timeout, ready)
        ready_at = time.monotonic()
        if on_ready is not None:
            on_ready(servers)
        time.sleep(keep_seconds)
        return active_at - started, ready_at - started, cache
    finally:
        for server in servers:
            conn.compute.delete_server(server.id)
        for server in servers:
            conn.compute.wait_for_delete(server, wait=timeout)


def public_image(admin, name, image_file=None, disk_format='qcow2', store=None):
    """The public image ``name``, uploaded from ``image_file`` (default: the test image) if
    missing, into Glance's store ``store`` (default: Glance's default store)."""
    image = admin.image.find_image(name)
    if image is None:
        image_file = image_file or pathlib.Path(subprocess.run(
            [str(REPO / 'tools' / 'build-test-image.sh')], check=True, capture_output=True,
            text=True).stdout.splitlines()[-1])
        print('==> uploading %s as the public image %s%s' % (
            image_file, name, ' to store %s' % store if store else ''), flush=True)
        if store is None:
            return admin.image.create_image(name=name, filename=str(image_file),
                                            disk_format=disk_format, container_format='bare',
                                            visibility='public', wait=True)
        # The upload's X-Image-Meta-Store header: neither the SDK nor the client has an option.
        created = admin.image.post('/images', json={
            'name': name, 'disk_format': disk_format, 'container_format': 'bare',
            'visibility': 'public'}).json()
        with open(image_file, 'rb') as data:
            admin.image.put('/images/%s/file' % created['id'], data=data, headers={
                'Content-Type': 'application/octet-stream', 'X-Image-Meta-Store': store})
        image = admin.image.get_image(created['id'])
    return image


def wait_for_boot_image(admin, image, timeout):
    """The id of the boot image the worker published for ``image`` from its profiling boot
    (while the build runs, the image may link one derived from a related image's)."""
    def linked():
        properties = admin.image.get_image(image.id).properties or {}
        status = properties.get('yolo_boot_image_status')
        if status in ('failed', 'skipped'):
            raise RuntimeError('image %s has no boot image: %s (%s)' % (
                image.id, status, properties.get('yolo_boot_image_reason')))
        return properties.get('yolo_boot_image_id') if status == 'ready' else None
    return wait('boot image of %s' % image.name, timeout, linked, interval=5.0)


def by_condition(boots):
    """{(stressors, servers, images): {policy: [boots]}}, conditions in the order they were
    measured, policies in POLICIES' order."""
    grouped = {}
    for policy in POLICIES:
        for b in boots:
            if b.policy == policy:
                grouped.setdefault((b.stressors, b.servers, b.images), {}).setdefault(
                    policy, []).append(b)
    return {condition: grouped[condition] for condition in
            dict.fromkeys((b.stressors, b.servers, b.images) for b in boots)}


def summary(boots):
    """One row per condition (stressors, servers at once), one column per policy: the median
    time to ready (min-max) and to ACTIVE; then off/on and warm/on."""
    policies = [p for p in POLICIES if any(b.policy == p for b in boots)]
    grouped = by_condition(boots)
    head = ['I/O stressors', 'servers at once', 'cache'] + \
        ['%s: ready s (min-max), ACTIVE s' % p for p in policies]
    head += ['%s / on' % p for p in policies if p != 'on' and 'on' in policies]
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * 3 + '---:|' * (len(head) - 3)]
    medians = {}
    for condition, of_condition in grouped.items():
        stressors, servers, kind = condition
        cells = [str(stressors), str(servers) if servers == 1 or kind == 'same'
                 else '%d (distinct images)' % servers,
                 '/'.join(sorted({b.cache for mine in of_condition.values() for b in mine}))]
        for policy in policies:
            mine = of_condition.get(policy, [])
            ready = [b.ready_seconds for b in mine]
            medians[condition, policy] = statistics.median(ready)
            cells.append('%.1f (%.1f-%.1f), %.1f' % (
                statistics.median(ready), min(ready), max(ready),
                statistics.median(b.active_seconds for b in mine)))
        if 'on' in policies:
            on = medians[condition, 'on']
            cells += ['%.2f' % (medians[condition, p] / on) for p in policies if p != 'on']
        lines.append('| ' + ' | '.join(cells) + ' |')
    idle = medians.get(((0, 1, 'same'), 'on'))
    if idle:
        lines.append('')
        for condition in grouped:
            if condition[:2] != (0, 1):     # (stressors, servers)
                lines.append('YOLO on with %s / YOLO on idle: %.2f' % (
                    described(*condition), medians[condition, 'on'] / idle))
    if any(b.disk_seconds for b in boots):
        lines += ['', 'Guests\' root disk requests up to ready, median of their summed latency '
                  '(reads / writes / flushes, s):']
        for condition, of_condition in grouped.items():
            cells = []
            for policy, mine in of_condition.items():
                times = [b.disk_seconds for b in mine if b.disk_seconds]
                if times:
                    cells.append('%s %s' % (policy, ' / '.join(
                        '%.1f' % statistics.median(kind) for kind in zip(*times))))
            lines.append('- %s: %s' % (described(*condition), ', '.join(cells)))
    return '\n'.join(lines)


def plot(boots, path):
    """Bars of the time to ready per condition, one per policy (median, min-max)."""
    from yolo_bench import plots
    groups = {described(*condition).replace(', ', '\n'): {
        policy: [b.ready_seconds for b in mine] for policy, mine in of_condition.items()}
        for condition, of_condition in by_condition(boots).items()}
    return plots.policy_bars(
        groups, path, 'Through Nova: server create to guest ready, cache=%s\n(median, min-max '
        'of %d repetitions)' % ('/'.join(sorted({b.cache for b in boots})),
                                max(b.repetition for b in boots)),
        'seconds to ready')


def described(stressors, servers, kind):
    """A condition of the summary in words."""
    return '%d stressors, %d server%s%s' % (stressors, servers, '' if servers == 1 else 's',
                                            ' of distinct images' if kind == 'distinct' else '')


def _list(text):
    return [int(item) for item in text.split(',') if item]


def comma_separated(choices, what):
    """An argparse type: a comma-separated list of some of ``choices``."""
    def parse(text):
        chosen = [item for item in text.split(',') if item]
        unknown = set(chosen) - set(choices)
        if unknown:
            raise argparse.ArgumentTypeError('unknown %s %s (choose from %s)' % (
                what, ', '.join(sorted(unknown)), ', '.join(choices)))
        if not chosen:
            raise argparse.ArgumentTypeError('no %s given (choose from %s)' % (
                what, ', '.join(choices)))
        return chosen
    return parse


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.cloud',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--repetitions', type=int, default=3,
                        help='boots per policy and condition (default: %(default)s)')
    parser.add_argument('--policies', type=comma_separated(POLICIES, 'policy'),
                        default=list(POLICIES),
                        help='comma-separated, of %s (default: all)' % ', '.join(POLICIES))
    # The emulated HDD under contention by default: on a fast disk, YOLO and Nova's own path
    # tie (what YOLO is for shows where the disk is contended).
    parser.add_argument('--storage', choices=('local', 'hdd'), default='hdd',
                        help='the instances directory where it is, or on the emulated HDD '
                             '(default: %(default)s)')
    parser.add_argument('--stressors', type=_list,
                        help='fio stressors on the instances directory\'s disk, comma-separated '
                             '(hdd only; default: 0,8 on the HDD, 0 otherwise)')
    parser.add_argument('--servers', type=_list, default=[1],
                        help='servers created at once, comma-separated (default: 1)')
    parser.add_argument('--images', type=comma_separated(IMAGE_KINDS, 'kind of images'),
                        default=['same'],
                        help='several servers at once boot the same image (one request) or '
                             'distinct images (copies of it, a request each), comma-separated '
                             '(default: same)')
    parser.add_argument('--cloud', default='aio-demo',
                        help='clouds.yaml cloud that creates the servers (default: %(default)s)')
    parser.add_argument('--admin-cloud', default='aio-admin',
                        help='clouds.yaml cloud that uploads the image (default: %(default)s)')
    parser.add_argument('--image', default='debian12-yolo',
                        help='public image to boot, uploaded if missing (default: %(default)s)')
    parser.add_argument('--image-file', type=pathlib.Path,
                        help='qcow2 to upload (default: tools/build-test-image.sh)')
    parser.add_argument('--flavor', default='m1.yolo', help='(default: %(default)s)')
    parser.add_argument('--timeout', type=float, default=1800.0,
                        help='seconds one boot may take (default: %(default)s)')
    parser.add_argument('--csv', type=pathlib.Path, default=REPO / 'results' / 'cloud-boots.csv',
                        help='file each boot is appended to (default: %(default)s)')
    parser.add_argument('--plot', type=pathlib.Path,
                        help='PNG of the times to ready (default: none)')
    parser.add_argument('--report', type=pathlib.Path, nargs='+', metavar='CSV',
                        help='boot nothing: the summary (and --plot) of these files')
    ready_pattern_option(parser)
    args = parser.parse_args(argv)
    if args.stressors is None:
        args.stressors = [0, 8] if args.storage == 'hdd' else [0]
    if args.storage == 'local' and any(args.stressors):
        parser.error('--stressors needs --storage hdd (they share its throttle)')
    return args


def report(boots, plot_path):
    print(summary(boots))
    if plot_path:
        print('plot: %s' % plot(boots, plot_path))


@contextlib.contextmanager
def disabled(admin, service):
    """The compute service disabled meanwhile: the scheduler sends no server there (the
    second host that tools/run-tests or the scheduling benchmarks leave up)."""
    print('==> %s disabled while the benchmark runs' % service.host, flush=True)
    admin.compute.disable_service(service, disabled_reason='yolo_bench.cloud times boots on '
                                  'one compute host')
    try:
        yield
    finally:
        admin.compute.enable_service(service)


@dataclasses.dataclass
class Bench:
    """The cloud as a benchmark on its first host finds it: the connections, the compute node,
    the image and its copies (distinct images), the flavor."""
    admin: object
    user: object
    node: ComputeNode
    image: object
    copies: list
    flavor: object


@contextlib.contextmanager
def first_host_bench(args, distinct):
    """The cloud set for timed boots on its first host: the other hosts disabled, the instances
    directory on the HDD (``--storage hdd``, with files for the most ``--stressors``), the image
    and ``distinct - 1`` copies of it uploaded, each booted once (untimed) so that the host holds
    its base file and boot image; yolofs on."""
    admin = openstack.connect(cloud=args.admin_cloud)
    user = openstack.connect(cloud=args.cloud)
    computes = {s.host: s for s in admin.compute.services(binary='nova-compute')
                if s.state == 'up' and s.status == 'enabled'}
    if aio.FIRST_HOST not in computes:
        sys.exit('this benchmark times boots on the compute host %s, which is not up: %s are'
                 % (aio.FIRST_HOST, ', '.join(computes) or 'none'))
    kept = COMPUTE_DISK_FILE.read_text().strip() if COMPUTE_DISK_FILE.exists() else 'machine'
    if kept != 'machine':
        sys.exit('this benchmark chooses the compute host\'s storage (--storage); this cloud was '
                 'set up with AIO_COMPUTE_DISK=%s: clean it first (tools/aio/aio clean)' % kept)
    image = public_image(admin, args.image, args.image_file)
    # Distinct images: copies of the image, each its own Glance image, base file, boot image and
    # page cache.
    copies = [public_image(admin, '%s-copy-%d' % (args.image, number), args.image_file)
              for number in range(1, distinct)]
    for one in [image] + copies:
        print('==> waiting for the boot image of %s' % one.name, flush=True)
        wait_for_boot_image(admin, one, args.timeout)
    flavor = user.compute.find_flavor(args.flavor)
    node = ComputeNode()
    with contextlib.ExitStack() as stack:
        for host, service in computes.items():
            if host != aio.FIRST_HOST:
                stack.enter_context(disabled(admin, service))
        if args.storage == 'hdd':
            disk = stack.enter_context(node.instances_on_hdd(max(args.stressors)))
            print('==> instances directory on %s' % disk.describe(), flush=True)
        # Untimed: the compute node caches the image in _base and installs its boot image, which
        # every later boot finds there (a host's first boot of an image is another benchmark).
        node.set_policy('on')
        print('==> warm-up boot (untimed)', flush=True)
        boot_servers(user, admin, [image] + copies, flavor, 'boot-times-warm-up',
                     1 + len(copies), args.timeout)
        try:
            yield Bench(admin, user, node, image, copies, flavor)
        finally:
            node.set_policy('on')


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    set_ready_pattern(args.ready_pattern)
    if args.report:
        report([boot for path in args.report for boot in read_csv(path)], args.plot)
        return 0
    boots, failed = [], []
    distinct = max(args.servers) if 'distinct' in args.images else 1
    with first_host_bench(args, distinct) as bench:
        conditions = [(stressors, servers, kind) for stressors in args.stressors
                      for servers in args.servers for kind in args.images
                      if servers > 1 or kind == 'same']
        for repetition in range(1, args.repetitions + 1):
            for stressors, servers, kind in conditions:
                booted = (bench.image if kind == 'same'
                          else [bench.image] + bench.copies[:servers - 1])
                for policy in args.policies:
                    try:
                        boots.append(measure(args, bench.node, bench.user, bench.admin, booted,
                                             bench.flavor, policy, stressors, servers, kind,
                                             repetition))
                        append_csv(args.csv, boots[-1])
                    except GuestFailed as e:
                        failed.append('YOLO %s, %d stressors, %d servers (%s), boot %d: %s'
                                      % (policy, stressors, servers, kind, repetition, e))
                        print('==> %s' % failed[-1], flush=True)
    print()
    report(boots, args.plot)
    # Left out of the table, and said: a guest that failed is not a boot time.
    for failure in failed:
        print('failed: %s' % failure)
    return 0


def measure(args, node, user, admin, image, flavor, policy, stressors, servers, kind,
            repetition):
    """One boot of ``servers`` servers of ``image`` (or of each of a list of images)."""
    bases = [INSTANCES / '_base' / images.base_file_name(one.id)
             for one in (image if isinstance(image, list) else [image])]
    node.set_policy(policy)
    if policy == 'on':
        # yolofs has just started: its boot images are loaded (verified against the base files)
        # before the clock starts, as on a compute node where yolofs runs all along.
        for base in bases:
            yolofs.ControlClient(aio.CONTROL_SOCKETS[aio.FIRST_HOST]).preload(base.name)
    drop_caches()
    if policy == 'warm':
        subprocess.run(['cat'] + [str(base) for base in bases], stdout=subprocess.DEVNULL,
                       check=True)
    name = 'boot-times-%s-%d-%d-%s-%d' % (policy, stressors, servers, kind, repetition)
    disk = []

    def on_ready(booted):
        try:
            per_guest = [disk_seconds(admin, server.id) for server in booted]
        except (subprocess.CalledProcessError, ValueError, AttributeError) as e:
            print('==> no disk times of %s: %s' % (name, e), flush=True)   # the boot counts
            return
        disk.extend(statistics.mean(times) for times in zip(*per_guest))
    with stressors_mod.io_stressors(node.disk, stressors):
        active, ready, cache = boot_servers(user, admin, image, flavor, name, servers,
                                            args.timeout, on_ready=on_ready)
    boot = Boot(policy, stressors, servers, repetition, active, ready, cache, kind, tuple(disk))
    print('==> YOLO %-4s %d stressors, %d servers (%s), boot %d: ACTIVE after %.1f s, ready '
          'after %.1f s (cache=%s; guest disk requests: reads %s s, writes %s s, flushes %s s)'
          % (policy, stressors, servers, kind, repetition, active, ready, cache,
             *(['%.1f' % t for t in disk] or ['-'] * 3)), flush=True)
    return boot


if __name__ == '__main__':
    sys.exit(main())
