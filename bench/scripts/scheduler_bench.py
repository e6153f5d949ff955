"""YoloBootFilter + YoloBootTimeWeigher at fleet scale: their cost per scheduling request, and the
size of what hosts report.

Builds N hosts (Nova's FakeHostState, a HostState) each reporting YOLO's stats with what it
holds of a catalogue (a Bloom filter, model/locality.py: base files and boot images of
``--held`` images of ``--catalogue``), then runs, as nova-scheduler does for every request, the
filter's ``filter_all`` and the weigher through Nova's weight handler, for a random image each
time. Two cases: every host's report already parsed (the scheduler parses a report once, and
hosts report once a minute) and every report new (each one parsed: the worst case, a refresh in
which every host has reported since the last request). Beside them, for scale, Nova's own
filters and weighers that run without a database on the same hosts. Time is process time (other
load on the machine does not count), per request: p50 and p99.

Also: the size of a host's report and of all hosts' reports, which Nova stores per compute node
and every scheduler reads at every refresh, as the filter and as the comma-joined list of image
ids hosts reported before it; and the filter's false-positive rate, stated and measured.

Usage: python3 bench/scripts/scheduler_bench.py [--hosts 1000] [--requests 200]
       [--catalogue 2000] [--held 500] [--json FILE]
"""

import argparse
import json
import os
import random
import statistics
import time
import uuid

import checkout  # noqa: F401 (makes the checkout importable)
os.environ.setdefault('OS_NOVA_DISABLE_EVENTLET_PATCHING', '1')

import nova.conf  # noqa: E402
import nova.tests.unit  # noqa: E402,F401  (selects Nova's threading backend first)
from nova import objects  # noqa: E402,H306
from nova.scheduler import filters  # noqa: E402
from nova.scheduler import weights  # noqa: E402
from nova.tests.unit.scheduler import fakes  # noqa: E402

from yolo_nova.model import host_stats  # noqa: E402
from yolo_nova.model import locality  # noqa: E402
from yolo_nova.model.parameters import BootTimeParameters  # noqa: E402
from yolo_nova.scheduler.filters import boot_time_filter  # noqa: E402
from yolo_nova.scheduler.weights import boot_time  # noqa: E402

CONF = nova.conf.CONF
# Nova's filters and weighers that need no database, no service group and no instances.
NOVA_FILTERS = ('ComputeCapabilitiesFilter', 'ImagePropertiesFilter',
                'ServerGroupAntiAffinityFilter', 'ServerGroupAffinityFilter')
NOVA_WEIGHERS = ('RAMWeigher', 'CPUWeigher', 'DiskWeigher', 'IoOpsWeigher',
                 'NumInstancesWeigher', 'HypervisorVersionWeigher')


def catalogue(count, rng):
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]


def host_report(held_images, rng, params):
    entries = [locality.base_file_entry(locality.base_file_name(i)) for i in held_images]
    entries += [locality.boot_image_entry(i) for i in held_images]
    state = host_stats.HostBootState(
        rng.random(), rng.random(), params, frozenset(), time.time(),
        held=locality.BloomFilter.of(entries), streams_first_boots=True)
    return state.to_stats()


def make_hosts(args, images, rng):
    hosts, held = [], []
    for i in range(args.hosts):
        # Links of 100 Mbit/s, 1 and 10 Gbit/s to Glance.
        params = BootTimeParameters(alpha=8.0, beta=23.0, alpha_yolo=0.5, cpus=32,
                                    glance_bytes_per_second=rng.choice([12.5e6, 125e6, 1.25e9]))
        holds = rng.sample(images, args.held)
        held.append(holds)
        hosts.append(fakes.FakeHostState('host%d' % i, 'node%d' % i, {
            'stats': host_report(holds, rng, params), 'num_io_ops': rng.randrange(4),
            'free_ram_mb': rng.randrange(1 << 18), 'free_disk_mb': rng.randrange(1 << 22),
            'vcpus_total': 64, 'vcpus_used': rng.randrange(64), 'num_instances': 10,
            'hypervisor_version': 9000000, 'cpu_allocation_ratio': 4.0,
            'ram_allocation_ratio': 1.0, 'disk_allocation_ratio': 1.0}))
    return hosts, held


def request(image_id, size):
    """A new request spec, as each scheduling request has its own (the filter's predictions
    are kept with it for the weigher)."""
    return objects.RequestSpec(
        image=objects.ImageMeta.from_dict({
            'id': image_id, 'size': size, 'disk_format': 'qcow2', 'properties': {}}),
        scheduler_hints={}, instance_group=None, availability_zone=None,
        flavor=objects.Flavor(extra_specs={}, memory_mb=2048, vcpus=2, root_gb=20,
                              ephemeral_gb=0, swap=0),
        num_instances=1, ignore_hosts=None, force_hosts=None, force_nodes=None,
        requested_destination=None)


def timed(function, spec):
    """Process time of ``function(spec)``, in milliseconds."""
    started = time.process_time()
    function(spec)
    return (time.process_time() - started) * 1e3


def summary(times):
    ordered = sorted(times)
    return {'p50_ms': statistics.median(ordered),
            'p99_ms': ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            'mean_ms': statistics.fmean(ordered)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--hosts', type=int, default=1000)
    parser.add_argument('--requests', type=int, default=200)
    parser.add_argument('--catalogue', type=int, default=2000)
    parser.add_argument('--held', type=int, default=500)
    parser.add_argument('--json', help='write the figures to this file')
    args = parser.parse_args()
    CONF([], project='nova', default_config_files=[])
    objects.register_all()
    rng = random.Random(1)
    images = catalogue(args.catalogue, rng)
    hosts, held = make_hosts(args, images, rng)
    asked = [(rng.choice(images), rng.randrange(1, 8) << 30) for _ in range(args.requests)]

    flt = boot_time_filter.YoloBootFilter()
    handler = weights.HostWeightHandler()
    yolo_weigher = [boot_time.YoloBootTimeWeigher()]

    def yolo(spec):
        return handler.get_weighed_objects(yolo_weigher, flt.filter_all(hosts, spec), spec)

    def yolo_every_report_new(spec):
        host_stats._parse.cache_clear()
        return yolo(spec)

    nova_filters = [cls() for cls in filters.HostFilterHandler().get_matching_classes(
        ['nova.scheduler.filters.all_filters']) if cls.__name__ in NOVA_FILTERS]
    nova_weighers = [cls() for cls in weights.all_weighers() if cls.__name__ in NOVA_WEIGHERS]
    filter_handler = filters.HostFilterHandler()

    def nova_own(spec):
        passed = filter_handler.get_filtered_objects(nova_filters, hosts, spec)
        return handler.get_weighed_objects(nova_weighers, passed, spec)

    figures = {'hosts': args.hosts, 'requests': args.requests,
               'catalogue': args.catalogue, 'held_per_host': args.held}
    # Nova's filters pass every host; YOLO's, those whose predicted boot is within its limits
    # (the hosts' loads are random).
    figures['hosts_passing'] = {'yolo': len(yolo(request(*asked[0]))),
                                'nova_own': len(nova_own(request(*asked[0])))}
    figures['nova_own_filters'] = sorted(type(f).__name__ for f in nova_filters)
    figures['nova_own_weighers'] = sorted(type(w).__name__ for w in nova_weighers)
    yolo(request(*asked[0]))  # warm up: every report parsed once
    # Interleaved, request by request, so that the machine's state weighs on each alike.
    runs = {'yolo': [], 'yolo_every_report_new': [], 'nova_own': []}
    for image_id, size in asked:
        for name, function in (('yolo', yolo), ('yolo_every_report_new', yolo_every_report_new),
                               ('nova_own', nova_own)):
            runs[name].append(timed(function, request(image_id, size)))
    figures.update({name: summary(times) for name, times in runs.items()})

    report = hosts[0].stats['yolo_held']
    bloom = locality.BloomFilter.decode(report)
    as_list = ','.join(sorted(held[0]))
    figures['report'] = {
        'filter_chars': len(report), 'filter_bits': bloom.bits, 'hashes': bloom.hashes,
        'all_hosts_filter_bytes': sum(len(h.stats['yolo_held']) for h in hosts),
        'list_chars': len(as_list), 'all_hosts_list_bytes': args.hosts * len(as_list),
        'false_positive_rate_stated': locality.false_positive_rate(
            bloom.bits, bloom.hashes, 2 * args.held)}
    others = [i for i in images if i not in set(held[0])]
    figures['report']['false_positive_rate_measured'] = sum(
        locality.boot_image_entry(i) in bloom for i in others) / len(others)

    r = figures['report']
    print('%d hosts, each holding %d of %d images; %d requests' % (
        args.hosts, args.held, args.catalogue, args.requests))
    print("a host's report: %d characters as a filter (%d bits, %d hashes), %d as a list" % (
        r['filter_chars'], r['filter_bits'], r['hashes'], r['list_chars']))
    print('all hosts: %.1f MB as filters, %.1f MB as lists, per scheduler refresh' % (
        r['all_hosts_filter_bytes'] / 1e6, r['all_hosts_list_bytes'] / 1e6))
    print('false positives: %.3f%% stated, %.3f%% measured on the %d images it lacks' % (
        100 * r['false_positive_rate_stated'], 100 * r['false_positive_rate_measured'],
        len(others)))
    print("Nova's own: %s; %s" % (', '.join(figures['nova_own_filters']),
                                  ', '.join(figures['nova_own_weighers'])))
    print('hosts passing the filters: %(yolo)d (YOLO), %(nova_own)d (Nova\'s own)'
          % figures['hosts_passing'])
    print('per request, process time   p50 ms   p99 ms')
    for name in runs:
        print('  %-25s %7.1f  %7.1f' % (name, figures[name]['p50_ms'], figures[name]['p99_ms']))
    print('YOLO / Nova\'s own (p50): %.2f, every report new: %.2f' % (
        figures['yolo']['p50_ms'] / figures['nova_own']['p50_ms'],
        figures['yolo_every_report_new']['p50_ms'] / figures['nova_own']['p50_ms']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(figures, f, indent=1)


if __name__ == '__main__':
    main()
