"""YoloBootFilter and YoloBootTimeWeigher with Nova's scheduler test helpers."""

import dataclasses
import time
from unittest import mock

from nova import objects
from nova.scheduler import weights
from nova.tests.unit.scheduler import fakes

from yolo_nova.model import host_stats
from yolo_nova.model import locality
from yolo_nova.model.parameters import BootTimeParameters
from yolo_nova.scheduler.filters import boot_time_filter
from yolo_nova.scheduler import utils
from yolo_nova.scheduler.weights import boot_time

from tests.unit.nova_base import NoDBTestCase

IMAGE = 'c0ffee00-1111-4222-8333-444455556666'
PARAMS = BootTimeParameters(alpha=8.0, beta=23.0, alpha_yolo=0.5, cpus=2)


def stats(io=0.0, cpu=0.0, boot_images=(), age=0.0, params=PARAMS):
    return host_stats.HostBootState(io, cpu, params, frozenset(boot_images),
                                    time.time() - age).to_stats()


def host(name, host_stats_=None, num_io_ops=0, aggregates=()):
    return fakes.FakeHostState(name, 'node-' + name,
                               {'stats': host_stats_ or {}, 'num_io_ops': num_io_ops,
                                'aggregates': [objects.Aggregate(id=i, metadata=m)
                                               for i, m in enumerate(aggregates)]})


def spec(image_id=IMAGE, rebuild=False):
    hints = {'_nova_check_type': ['rebuild']} if rebuild else {}
    return objects.RequestSpec(image=objects.ImageMeta.from_dict({'id': image_id}),
                               scheduler_hints=hints)


class TestYoloBootFilter(NoDBTestCase):

    def setUp(self):
        super().setUp()
        self.filt = boot_time_filter.YoloBootFilter()

    def passing(self, hosts, spec_obj=None):
        return [h.host for h in self.filt.filter_all(hosts, spec_obj or spec())]

    def test_absolute_limit(self):
        self.flags(max_predicted_boot_time=40, max_boot_time_ratio=0, group='yolo')
        hosts = [host('idle', stats()), host('busy', stats(io=0.6))]
        # idle: 8 + 23 = 31 s; busy: e^0.6 * 8 / 0.4 + 23 = 59.4 s.
        self.assertEqual(['idle'], self.passing(hosts))
        self.assertTrue(self.filt.host_passes(hosts[0], spec()))
        self.assertFalse(self.filt.host_passes(hosts[1], spec()))

    def test_ratio_to_the_best_candidate(self):
        self.flags(max_boot_time_ratio=1.5, group='yolo')
        hosts = [host('a', stats(io=0.1)), host('b', stats(io=0.3)), host('c', stats(io=0.7))]
        self.assertEqual(['a', 'b'], self.passing(hosts))

    def test_hosts_without_data_pass_by_default_and_never_set_the_best(self):
        self.flags(max_boot_time_ratio=1.2, group='yolo')
        hosts = [host('unknown'), host('a', stats(io=0.2)), host('b', stats(io=0.5))]
        self.assertEqual(['unknown', 'a'], self.passing(hosts))
        self.flags(pass_hosts_without_data=False, group='yolo')
        self.assertEqual(['a'], self.passing(hosts))

    def test_stale_and_garbled_stats_count_as_no_data(self):
        self.flags(pass_hosts_without_data=False, group='yolo')
        garbled = stats()
        garbled['yolo_alpha'] = 'fast'
        partial = stats()
        del partial['yolo_cpus']
        hosts = [host('stale', stats(age=600)), host('garbled', garbled),
                 host('partial', partial), host('fresh', stats(age=30))]
        self.assertEqual(['fresh'], self.passing(hosts))

    def test_out_of_range_reports_count_as_no_data_and_never_raise(self):
        self.flags(pass_hosts_without_data=False, max_boot_time_ratio=0,
                   max_predicted_boot_time=0, group='yolo')
        reports = {'io_exponent': '1e308', 'alpha': '1e300', 'beta': 'inf', 'alpha_yolo': 'nan',
                   'cpus': str(1 << 40), 'io_utilisation': '1e308', 'runnable': '-1e308',
                   'idlest_cpu_utilisation': '-1e308', 'cpu_contention': '-1'}
        hosts = []
        for key, value in reports.items():
            report = stats(io=0.5)
            report['yolo_' + key] = value
            hosts.append(host(key, report))
        hosts.append(host('sane', stats(io=0.5)))
        # A utilisation out of range is clamped, a negative run queue ignored: both still predict.
        self.assertEqual(['io_utilisation', 'runnable', 'idlest_cpu_utilisation', 'sane'],
                         self.passing(hosts))
        weigher = boot_time.YoloBootTimeWeigher()
        self.assertEqual(len(hosts), len(weigher.weigh_objects(
            [weights.WeighedHost(h, 0.0) for h in hosts], spec())))
        # Nor through aggregates.
        huge = host('a', stats(), aggregates=[{'yolo_boot_time_alpha': '1e308'}])
        self.flags(max_predicted_boot_time=40, group='yolo')
        self.assertTrue(self.filt.host_passes(huge, spec()))

    def test_saturated_host_is_clamped_not_crashing(self):
        self.flags(max_predicted_boot_time=1000, max_boot_time_ratio=0, group='yolo')
        hosts = [host('saturated', stats(io=1.0, cpu=1.0)), host('over', stats(io=3.5))]
        self.assertEqual([], self.passing(hosts))
        self.flags(max_predicted_boot_time=0, group='yolo')
        self.assertEqual(['saturated', 'over'], self.passing(hosts))

    def test_no_host_is_discarded_only_for_lacking_the_boot_image(self):
        # Under I/O contention, a boot served from the boot image is 8x faster: but each host
        # is judged as if it held it; the weigher prefers the one that does.
        self.flags(max_boot_time_ratio=1.5, group='yolo')
        hosts = [host('with', stats(io=0.8, boot_images=[IMAGE])), host('without', stats(io=0.8)),
                 host('other-image', stats(io=0.8, boot_images=['another']))]
        self.assertEqual(['with', 'without', 'other-image'], self.passing(hosts))
        weighed = boot_time.YoloBootTimeWeigher().weigh_objects(
            [weights.WeighedHost(h, 0.0) for h in hosts], spec())
        self.assertGreater(weighed[0], weighed[1])
        self.assertEqual(weighed[1], weighed[2])
        # Another image requested: no host has its boot image, all are equally slow.
        self.assertEqual(['with', 'without', 'other-image'],
                         self.passing(hosts, spec('11111111-2222-4333-8444-555566667777')))

    def test_boots_in_progress_slow_a_host(self):
        self.flags(max_boot_time_ratio=1.5, group='yolo')
        hosts = [host('quiet', stats(), num_io_ops=0), host('booting', stats(), num_io_ops=3)]
        # quiet: 31 s; booting: 4 * 8 + 2 * 23 = 78 s.
        self.assertEqual(['quiet'], self.passing(hosts))

    def test_rebuilds_are_never_filtered(self):
        self.flags(max_predicted_boot_time=1, group='yolo')
        hosts = [host('a', stats()), host('b', stats(io=0.9))]
        self.assertEqual(['a', 'b'], self.passing(hosts, spec(rebuild=True)))
        self.assertFalse(self.filt.RUN_ON_REBUILD)

    def test_volume_backed_requests_have_no_prediction(self):
        # Such a server boots from its volume, not from an image on the host's disk: however
        # loaded a host's disk, no host is filtered or preferred for it.
        self.flags(max_boot_time_ratio=1.5, max_predicted_boot_time=1,
                   pass_hosts_without_data=False, group='yolo')
        volume_spec = objects.RequestSpec(image=objects.ImageMeta.from_dict({}),
                                          scheduler_hints={})
        hosts = [host('a', stats(io=0.8, boot_images=[IMAGE])), host('b', stats(io=0.1))]
        self.assertEqual(['a', 'b'], self.passing(hosts, volume_spec))
        self.assertTrue(self.filt.host_passes(hosts[0], volume_spec))
        self.assertIsNone(utils.requested_image(volume_spec))
        self.assertEqual([(None, None)] * 2, utils.predictions(hosts, None))
        self.assertEqual([0.0, 0.0], boot_time.YoloBootTimeWeigher().weigh_objects(
            [weights.WeighedHost(h, 0.0) for h in hosts], volume_spec))
        # A volume made of an image: the request carries the image's metadata, and is_bfv.
        from_image = objects.RequestSpec(image=objects.ImageMeta.from_dict({'id': IMAGE}),
                                         is_bfv=True, scheduler_hints={})
        self.assertEqual(['a', 'b'], self.passing(hosts, from_image))
        self.assertIsNone(utils.requested_image(from_image))


class TestAggregateParameters(NoDBTestCase):

    def setUp(self):
        super().setUp()
        self.filt = boot_time_filter.YoloBootFilter()

    def test_aggregate_metadata_overrides_what_hosts_report(self):
        self.flags(max_predicted_boot_time=40, max_boot_time_ratio=0, group='yolo')
        # Reported: 8 + 23 = 31 s. The aggregate says this hardware boots with beta 35 s.
        slow_hw = host('a', stats(), aggregates=[{'yolo_boot_time_beta': '35'}])
        self.assertFalse(self.filt.host_passes(slow_hw, spec()))
        self.assertTrue(self.filt.host_passes(host('b', stats()), spec()))

    def test_an_aggregates_alpha_grows_with_the_thesis_pole(self):
        self.flags(max_predicted_boot_time=100, max_boot_time_ratio=0, group='yolo')
        # The host learned that its I/O part barely grows (pole 0): 8 e^0.9 + 23 = 42.7 s at
        # x 0.9. An aggregate's alpha of 8 s comes with the thesis' pole: 8 e^0.9 / 0.1 + 23.
        learned = dataclasses.replace(PARAMS, io_pole=0.0)
        self.assertTrue(self.filt.host_passes(host('a', stats(io=0.9, params=learned)), spec()))
        set_by_operator = host('b', stats(io=0.9, params=learned),
                               aggregates=[{'yolo_boot_time_alpha': '8'}])
        self.assertFalse(self.filt.host_passes(set_by_operator, spec()))

    def test_disagreeing_aggregates_take_the_cautious_value_and_garbage_is_ignored(self):
        self.flags(max_predicted_boot_time=40, max_boot_time_ratio=0, group='yolo')
        both = host('a', stats(), aggregates=[{'yolo_boot_time_alpha': '5'},
                                              {'yolo_boot_time_alpha': '20'}])
        self.assertFalse(self.filt.host_passes(both, spec()))   # 20 + 23 = 43 s
        garbage = host('b', stats(), aggregates=[{'yolo_boot_time_alpha': 'fast'},
                                                 {'yolo_boot_time_beta': '-3'}])
        self.assertTrue(self.filt.host_passes(garbage, spec()))  # reported 31 s stands
        # For a rate, the cautious value is the smallest: the slower link.
        links = host('c', stats(), aggregates=[{'yolo_glance_bytes_per_second': '1e9'},
                                               {'yolo_glance_bytes_per_second': '12.5e6'}])
        state = host_stats.from_stats(links.stats, max_age=300)
        self.assertEqual(12.5e6, utils.with_aggregate_parameters(
            links, state).params.glance_bytes_per_second)


class TestYoloBootTimeWeigher(NoDBTestCase):

    def setUp(self):
        super().setUp()
        self.handler = weights.HostWeightHandler()
        self.weighers = [boot_time.YoloBootTimeWeigher()]

    def order(self, hosts):
        weighed = self.handler.get_weighed_objects(self.weighers, hosts, spec())
        return [w.obj.host for w in weighed], [w.weight for w in weighed]

    def test_faster_hosts_weigh_more(self):
        hosts = [host('slow', stats(io=0.7)), host('fast', stats(io=0.0)),
                 host('mid', stats(io=0.4)), host('imaged', stats(io=0.7, boot_images=[IMAGE]))]
        names, weights_ = self.order(hosts)
        # The boot image makes a busy host (26.4 s) faster than an idle one without (31 s).
        self.assertEqual(['imaged', 'fast', 'mid', 'slow'], names)
        self.assertEqual(4.0, weights_[0])      # the default multiplier
        self.assertEqual(0.0, weights_[-1])

    def test_hosts_without_data_weigh_as_the_slowest(self):
        hosts = [host('unknown'), host('fast', stats()), host('slow', stats(io=0.5))]
        names, weights_ = self.order(hosts)
        self.assertEqual('fast', names[0])
        self.assertEqual(0.0, weights_[1])
        self.assertEqual(0.0, weights_[2])

    def test_negative_multiplier_prefers_slow_hosts_and_zero_disables(self):
        hosts = [host('fast', stats()), host('slow', stats(io=0.5))]
        self.flags(boot_time_weight_multiplier=-1.0, group='yolo')
        self.assertEqual('slow', self.order(hosts)[0][0])
        self.flags(boot_time_weight_multiplier=0.0, group='yolo')
        self.assertEqual([0.0, 0.0], self.order(hosts)[1])


def test_an_image_has_a_boot_image_once_more_hosts_hold_one_than_false_positives_explain():
    image = '0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e'

    entries = ['boot:other-%d' % n for n in range(1000)]
    filters = {False: locality.BloomFilter.of(entries),
               True: locality.BloomFilter.of(entries + [locality.boot_image_entry(image)])}

    def host(holds):
        return host_stats.HostBootState(0.0, 0.0, PARAMS, frozenset(), 0.0,
                                        held=filters[holds], held_false_positives=0.0004)
    # 1,000 hosts whose filters expect 0.4 false positives: one holder may be one of them.
    fleet = [host(False) for _ in range(997)]
    assert not utils.has_boot_image(fleet + [host(True)], image)
    assert utils.has_boot_image(fleet + [host(True)] * 3, image)
    # Two hosts: one is enough.
    assert utils.has_boot_image([host(False), host(True)], image)
    assert not utils.has_boot_image([host(False), host(False)], image)


def test_the_weigher_reuses_the_filters_predictions_of_a_request():
    hosts = [host('with', stats(io=0.8, boot_images=[IMAGE])), host('without', stats(io=0.8))]
    request = spec()
    first = utils.request_predictions(request, hosts)
    with mock.patch.object(utils, 'state_of', side_effect=AssertionError('predicted again')):
        assert utils.request_predictions(request, hosts[1:]) == first[1:]
    # The filter saw the host that holds the boot image; the weigher, given only the other,
    # predicts it as the filter did (the image has a boot image).
    assert utils.predictions(hosts[1:], utils.requested_image(request))[0][0].held \
        > first[1][0].held
    # A host that Nova gave one more boot under way (the next instance of the request) is
    # predicted again, slower.
    hosts[1].num_io_ops += 1
    [(again, _)] = utils.request_predictions(request, hosts[1:])
    assert again.held > first[1][0].held
    # Another request predicts afresh.
    assert utils.request_predictions(spec(), hosts[:1])[0][0] == first[0][0]
