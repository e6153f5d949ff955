"""Cost of YoloBootFilter + YoloBootTimeWeigher per host per scheduling request.

Builds N fake hosts with YOLO stats (Nova's FakeHostState), then runs the filter's filter_all and
the weigher through Nova's weight handler, as nova-scheduler does for every request, many times.
Reports CPU time (process time, so other load on the machine does not count) per host per
request, for the filter, the weigher and both.

Usage: python3 bench/scripts/scheduler_bench.py [--hosts 1000] [--requests 200]
"""

import argparse
import os
import random
import time

import checkout  # noqa: F401 (makes the checkout importable)
os.environ.setdefault('OS_NOVA_DISABLE_EVENTLET_PATCHING', '1')

import nova.tests.unit  # noqa: E402,F401  (selects Nova's threading backend first)
from nova import objects  # noqa: E402,H306
from nova.scheduler import weights  # noqa: E402
from nova.tests.unit.scheduler import fakes  # noqa: E402

from yolo_nova.model import host_stats  # noqa: E402
from yolo_nova.model.parameters import BootTimeParameters  # noqa: E402
from yolo_nova.scheduler.filters import boot_time_filter  # noqa: E402
from yolo_nova.scheduler.weights import boot_time  # noqa: E402

IMAGE = '0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e'


def make_hosts(count, rng):
    params = BootTimeParameters(alpha=8.0, beta=23.0, alpha_yolo=0.5, cpus=32)
    hosts = []
    for i in range(count):
        images = {IMAGE} if rng.random() < 0.5 else set()
        images |= {'image-%d' % rng.randrange(50) for _ in range(20)}
        state = host_stats.HostBootState(rng.random(), rng.random(), params,
                                         frozenset(images), time.time())
        hosts.append(fakes.FakeHostState('host%d' % i, 'node%d' % i, {
            'stats': state.to_stats(), 'num_io_ops': rng.randrange(4)}))
    return hosts


def per_host_us(function, hosts, requests):
    function()  # warm up
    started = time.process_time()
    for _ in range(requests):
        function()
    return (time.process_time() - started) / requests / len(hosts) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--hosts', type=int, default=1000)
    parser.add_argument('--requests', type=int, default=200)
    args = parser.parse_args()
    objects.register_all()
    rng = random.Random(1)
    hosts = make_hosts(args.hosts, rng)
    spec = objects.RequestSpec(image=objects.ImageMeta.from_dict({'id': IMAGE}),
                               scheduler_hints={})
    flt = boot_time_filter.YoloBootFilter()
    handler = weights.HostWeightHandler()
    weigher = [boot_time.YoloBootTimeWeigher()]

    def filter_only():
        return flt.filter_all(hosts, spec)

    def weigh_only():
        return handler.get_weighed_objects(weigher, hosts, spec)

    def both():
        return handler.get_weighed_objects(weigher, flt.filter_all(hosts, spec), spec)

    print('%d hosts, %d requests, CPU time per host per request:' % (args.hosts, args.requests))
    for name, function in (('filter', filter_only), ('weigher', weigh_only),
                           ('filter + weigher', both)):
        print('  %-17s %6.1f us' % (name, per_host_us(function, hosts, args.requests)))


if __name__ == '__main__':
    main()
