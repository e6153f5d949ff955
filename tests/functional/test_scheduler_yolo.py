"""YoloBootFilter and YoloBootTimeWeigher inside Nova's real scheduler code.

Nova's HostManager loads both from configuration by class path, as an operator enables them, and
the scheduler manager's host sorting (what SchedulerManager._schedule uses) filters and weighs
several hosts reporting different loads. Only what needs a database is mocked: HostManager's
aggregate and instance caches, and SchedulerManager's constructor (placement and RPC clients).
"""

import time
from unittest import mock

from nova import objects
from nova.scheduler import host_manager
from nova.scheduler import manager
from nova.tests.unit.scheduler import fakes

from tests.unit.nova_base import NoDBTestCase
from yolo_nova.model import host_stats
from yolo_nova.model import locality
from yolo_nova.model.parameters import BootTimeParameters

IMAGE = '0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e'
PARAMS = BootTimeParameters(alpha=8.0, beta=23.0, alpha_yolo=0.5, cpus=2)
# 2 GiB in Glance.
IMAGE_META = {'id': IMAGE, 'size': 2 << 30, 'disk_format': 'qcow2'}


def host(name, io, cpu=0.0, boot_images=(), num_io_ops=0, held=None, streams=True,
         glance_rate=125e6):
    """A host reporting ``boot_images`` as a list (a host from before locality: it holds
    every base file), or what it holds as a Bloom filter: ``held``, a set of 'base' and
    'boot' (of IMAGE)."""
    bloom = None
    if held is not None:
        bloom = locality.BloomFilter.of(
            [locality.base_file_entry(locality.base_file_name(IMAGE))] * ('base' in held)
            + [locality.boot_image_entry(IMAGE)] * ('boot' in held))
    params = BootTimeParameters(**dict(vars(PARAMS), glance_bytes_per_second=glance_rate))
    state = host_stats.HostBootState(io, cpu, params, frozenset(boot_images), time.time(),
                                     held=bloom, streams_first_boots=streams)
    return fakes.FakeHostState(name, name, {'stats': state.to_stats(),
                                            'num_io_ops': num_io_ops})


class TestSchedulingWithYolo(NoDBTestCase):

    def setUp(self):
        super().setUp()
        self.flags(available_filters=[
            'nova.scheduler.filters.all_filters',
            'yolo_nova.scheduler.filters.boot_time_filter.YoloBootFilter'],
            enabled_filters=['YoloBootFilter'],
            weight_classes=['yolo_nova.scheduler.weights.boot_time.YoloBootTimeWeigher'],
            host_subset_size=1, shuffle_best_same_weighed_hosts=False,
            group='filter_scheduler')
        with mock.patch.object(host_manager.HostManager, '_init_aggregates'), \
                mock.patch.object(host_manager.HostManager, '_init_instance_info'):
            self.host_manager = host_manager.HostManager()
        # Loading the filter registered the [yolo] options, as it does in nova-scheduler.
        self.flags(max_boot_time_ratio=1.5, group='yolo')
        with mock.patch.object(manager.SchedulerManager, '__init__', return_value=None):
            self.scheduler = manager.SchedulerManager()
        self.scheduler.host_manager = self.host_manager
        self.spec = objects.RequestSpec(image=objects.ImageMeta.from_dict(IMAGE_META),
                                        scheduler_hints={}, num_instances=1,
                                        ignore_hosts=None, force_hosts=None, force_nodes=None,
                                        requested_destination=None)

    def test_filter_and_weigher_are_loaded_from_configuration(self):
        self.assertEqual(['YoloBootFilter'],
                         [f.__class__.__name__ for f in self.host_manager.enabled_filters])
        self.assertEqual(['YoloBootTimeWeigher'],
                         [w.__class__.__name__ for w in self.host_manager.weighers])

    def test_hosts_from_before_locality_reports_are_filtered_and_ordered(self):
        # Hosts that report their boot images as a list: each holds every base file. The image
        # has a boot image (a host holds it): each is judged as if it held it, and weighed with
        # what it holds. Predictions: e^x * alpha / (1 - x) + beta / (1 - y), see
        # yolo_nova.model.prediction; (held, total).
        hosts = [
            host('contended', io=0.8),                          # 28.6 s, 89.0 + 23 = 112.0 s
            host('busy-booting', io=0.1, num_io_ops=3),         # 4 x 0.6 + 2 x 23 = 48.5 s
            host('idle', io=0.0),                               # 23.5 s, 8 + 23 = 31.0 s
            host('cpu-busy', io=0.0, cpu=0.3),                  # 33.4 s, 8 + 32.9 = 40.9 s
            host('contended-with-image', io=0.8, boot_images=[IMAGE]),  # 5.6 + 23 = 28.6 s
        ]
        sorted_hosts = self.scheduler._get_sorted_hosts(self.spec, hosts, 0)
        # Limit: 1.5 x the best (23.5 s) = 35.3 s.
        self.assertEqual(['contended-with-image', 'idle', 'cpu-busy', 'contended'],
                         [h.host for h in sorted_hosts])

    def test_hosts_are_judged_as_if_they_held_the_image_and_weighed_with_its_fetch(self):
        # Held: as if each held the base file and the boot image; with its fetch: total.
        hosts = [
            # 5.6 + 23 = 28.6 s held and total
            host('contended', io=0.8, held={'base', 'boot'}),
            # held: 4 x 0.6 + 2 x 23 = 48.5 s, over 1.5 x 23.5 s
            host('busy-booting', io=0.1, num_io_ops=3, held={'base'}),
            # held 0.5 + 23 = 23.5 s; total 8 + 23 = 31 s
            host('idle', io=0.0, held={'base'}),
            # held 0.5 + 23 / 0.7 = 33.4 s; total: 5% of 2 GiB fetched first (0.9 s), then a
            # streamed boot of 1.25 times a held one (streamed_boot_factor): 42.6 s
            host('cpu-busy', io=0.0, cpu=0.3, held=set()),
            # held 23.5 s; total: Nova's download of 2 GiB at 100 Mbit/s (171.8 s), its
            # conversion (10.7 s) and a normal boot (31 s): 213.5 s
            host('far', io=0.0, held=set(), streams=False, glance_rate=12.5e6),
        ]
        sorted_hosts = self.scheduler._get_sorted_hosts(self.spec, hosts, 0)
        self.assertEqual(['contended', 'idle', 'cpu-busy', 'far'],
                         [h.host for h in sorted_hosts])

    def test_no_yolo_data_anywhere_changes_nothing(self):
        hosts = [fakes.FakeHostState(name, name, {'stats': {}, 'num_io_ops': 0})
                 for name in ('a', 'b', 'c')]
        sorted_hosts = self.scheduler._get_sorted_hosts(self.spec, hosts, 0)
        self.assertEqual({'a', 'b', 'c'}, {h.host for h in sorted_hosts})
