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
from yolo_nova.model.parameters import BootTimeParameters

IMAGE = '0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e'
PARAMS = BootTimeParameters(alpha=8.0, beta=23.0, alpha_yolo=0.5, cpus=2)


def host(name, io, cpu=0.0, boot_images=(), num_io_ops=0):
    state = host_stats.HostBootState(io, cpu, PARAMS, frozenset(boot_images), time.time())
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
        self.spec = objects.RequestSpec(image=objects.ImageMeta.from_dict({'id': IMAGE}),
                                        scheduler_hints={}, num_instances=1,
                                        ignore_hosts=None, force_hosts=None, force_nodes=None,
                                        requested_destination=None)

    def test_filter_and_weigher_are_loaded_from_configuration(self):
        self.assertEqual(['YoloBootFilter'],
                         [f.__class__.__name__ for f in self.host_manager.enabled_filters])
        self.assertEqual(['YoloBootTimeWeigher'],
                         [w.__class__.__name__ for w in self.host_manager.weighers])

    def test_contended_hosts_are_discarded_and_the_rest_ordered(self):
        # Predictions: e^x * alpha / (1 - x) + beta / (1 - y), see yolo_nova.model.prediction.
        hosts = [
            host('contended', io=0.8),                          # 89.0 + 23 = 112.0 s
            host('busy-booting', io=0.1, num_io_ops=3),         # 4 x 9.8 + 2 x 23 = 85.3 s
            host('idle', io=0.0),                               # 8 + 23 = 31.0 s
            host('cpu-busy', io=0.0, cpu=0.3),                  # 8 + 32.9 = 40.9 s
            host('contended-with-image', io=0.8, boot_images=[IMAGE]),  # 5.6 + 23 = 28.6 s
        ]
        sorted_hosts = self.scheduler._get_sorted_hosts(self.spec, hosts, 0)
        # Limit: 1.5 x the best (28.6 s) = 42.8 s.
        self.assertEqual(['contended-with-image', 'idle', 'cpu-busy'],
                         [h.host for h in sorted_hosts])

    def test_no_yolo_data_anywhere_changes_nothing(self):
        hosts = [fakes.FakeHostState(name, name, {'stats': {}, 'num_io_ops': 0})
                 for name in ('a', 'b', 'c')]
        sorted_hosts = self.scheduler._get_sorted_hosts(self.spec, hosts, 0)
        self.assertEqual({'a', 'b', 'c'}, {h.host for h in sorted_hosts})
