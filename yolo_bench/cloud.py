"""Boot times through Nova on the all-in-one cloud: ``openstack server create`` to ACTIVE and to
the guest's ready marker, with YOLO off and on, the page cache dropped before each boot.

    python -m yolo_bench.cloud [--repetitions 3] [--cloud aio-demo] [--image debian12-yolo]

Run as root with the all-in-one's venv (tools/aio/boot-times does both). YOLO off is yolofs
stopped on the compute node: the driver then backs instance disks on ``_base``, which is Nova's
own behaviour. Policies are interleaved, repetition by repetition, so that the machine's noise
falls on both alike. Servers are created as a non-admin user with ``--nic none``.
"""

import argparse
import dataclasses
import pathlib
import statistics
import subprocess
import sys
import time

import openstack

REPO = pathlib.Path(__file__).resolve().parent.parent
AIO = REPO / 'tools' / 'aio' / 'aio'
READY_MARKER = 'YOLO-GUEST-READY'
POLICIES = ('off', 'on')


@dataclasses.dataclass
class Boot:
    policy: str
    repetition: int
    active_seconds: float
    ready_seconds: float


def drop_caches():
    subprocess.run(['sync'], check=True)
    pathlib.Path('/proc/sys/vm/drop_caches').write_text('3\n')


def set_policy(policy):
    subprocess.run([str(AIO), 'start-yolofs' if policy == 'on' else 'stop-yolofs'],
                   check=True, stdout=subprocess.DEVNULL)


def wait(what, timeout, probe, interval=1.0):
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError('%s: not within %d s' % (what, timeout))
        time.sleep(interval)


def boot_once(conn, image, flavor, name, timeout):
    """Creates a server, times it to ACTIVE and to ready, deletes it."""
    started = time.monotonic()
    server = conn.compute.create_server(name=name, image_id=image.id, flavor_id=flavor.id,
                                        networks='none')
    try:
        def active():
            current = conn.compute.get_server(server.id)
            if current.status == 'ERROR':
                raise RuntimeError('server %s went to ERROR: %s' % (server.id, current.fault))
            return current.status == 'ACTIVE'
        wait('server ACTIVE', timeout, active)
        active_at = time.monotonic()

        def ready():
            output = conn.compute.get_server_console_output(server.id).get('output', '')
            return READY_MARKER in output
        wait('guest ready', timeout, ready)
        return active_at - started, time.monotonic() - started
    finally:
        conn.compute.delete_server(server.id)
        conn.compute.wait_for_delete(server, wait=timeout)


def wait_for_boot_image(admin, image, timeout):
    def linked():
        properties = admin.image.get_image(image.id).properties or {}
        status = properties.get('yolo_boot_image_status')
        if status in ('failed', 'skipped'):
            raise RuntimeError('image %s has no boot image: %s (%s)' % (
                image.id, status, properties.get('yolo_boot_image_reason')))
        return properties.get('yolo_boot_image_id')
    return wait('boot image of %s' % image.name, timeout, linked, interval=5.0)


def summary(boots):
    lines = ['| YOLO | boots | to ACTIVE (median, s) | to ready (median, s) | min-max (s) |',
             '|---|---|---|---|---|']
    medians = {}
    for policy in POLICIES:
        of_policy = [b for b in boots if b.policy == policy]
        if not of_policy:
            continue
        ready = [b.ready_seconds for b in of_policy]
        medians[policy] = statistics.median(ready)
        lines.append('| %s | %d | %.1f | %.1f | %.1f-%.1f |' % (
            policy, len(of_policy), statistics.median(b.active_seconds for b in of_policy),
            medians[policy], min(ready), max(ready)))
    if len(medians) == 2:
        lines.append('')
        lines.append('YOLO off / on, time to ready: %.2f' % (medians['off'] / medians['on']))
    return '\n'.join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.cloud',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--repetitions', type=int, default=3,
                        help='boots per policy (default: %(default)s)')
    parser.add_argument('--cloud', default='aio-demo',
                        help='clouds.yaml cloud that creates the servers (default: %(default)s)')
    parser.add_argument('--admin-cloud', default='aio-admin',
                        help='clouds.yaml cloud that uploads the image (default: %(default)s)')
    parser.add_argument('--image', default='debian12-yolo',
                        help='public image to boot, uploaded if missing (default: %(default)s)')
    parser.add_argument('--image-file', type=pathlib.Path,
                        help='qcow2 to upload (default: tools/build-test-image.sh)')
    parser.add_argument('--flavor', default='m1.yolo', help='(default: %(default)s)')
    parser.add_argument('--timeout', type=float, default=900.0,
                        help='seconds one boot may take (default: %(default)s)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    admin = openstack.connect(cloud=args.admin_cloud)
    user = openstack.connect(cloud=args.cloud)
    image = admin.image.find_image(args.image)
    if image is None:
        image_file = args.image_file or pathlib.Path(subprocess.run(
            [str(REPO / 'tools' / 'build-test-image.sh')], check=True, capture_output=True,
            text=True).stdout.splitlines()[-1])
        print('==> uploading %s as the public image %s' % (image_file, args.image), flush=True)
        image = admin.image.create_image(name=args.image, filename=str(image_file),
                                         disk_format='qcow2', container_format='bare',
                                         visibility='public', wait=True)
    print('==> waiting for the boot image of %s' % args.image, flush=True)
    wait_for_boot_image(admin, image, args.timeout)
    flavor = user.compute.find_flavor(args.flavor)
    # Untimed: the compute node caches the image in _base and installs its boot image, which
    # every later boot finds there (a host's first boot of an image is another benchmark).
    set_policy('on')
    print('==> warm-up boot (untimed)', flush=True)
    boot_once(user, image, flavor, 'boot-times-warm-up', args.timeout)
    boots = []
    try:
        for repetition in range(1, args.repetitions + 1):
            for policy in POLICIES:
                set_policy(policy)
                drop_caches()
                active, ready = boot_once(user, image, flavor,
                                          'boot-times-%s-%d' % (policy, repetition),
                                          args.timeout)
                boots.append(Boot(policy, repetition, active, ready))
                print('==> YOLO %-3s boot %d: ACTIVE after %.1f s, ready after %.1f s'
                      % (policy, repetition, active, ready), flush=True)
    finally:
        set_policy('on')
    print()
    print(summary(boots))
    return 0


if __name__ == '__main__':
    sys.exit(main())
