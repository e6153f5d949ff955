"""Fleet learning's merge: support, threshold, bounds, what a lying host can and cannot do."""

import json
import re

import pytest

from yolo_common import boot_reports
from yolo_glance import fleet

B = 4096
SIZE = 1024 * B
IMAGE = 'a1b2c3d4-0000-4000-8000-000000000001'


def report(host, extents, boot=None, size=SIZE, image_id=IMAGE):
    report.count = getattr(report, 'count', 0) + 1
    return boot_reports.BootReport(image_id=image_id, host=host, boot=boot or 'b%d' % report.count,
                                   extents=tuple(extents), source_size=size)


PUBLISHED = ((10 * B, 4 * B), (0, 2 * B))


def test_blocks_two_hosts_read_are_merged_after_the_published_extents():
    plan = fleet.plan_merge(PUBLISHED, [report('h1', [(100 * B, 3 * B)]),
                                        report('h2', [(101 * B, 3 * B)])],
                            B, SIZE, max_bytes=SIZE)
    # The blocks both read (101, 102); 100 and 103 had one boot each.
    assert plan.added == ((101 * B, 2 * B, 2),)
    assert plan.trace == PUBLISHED + ((101 * B, 2 * B),)
    assert (plan.hosts, plan.boots, plan.added_bytes) == (2, 2, 2 * B)


def test_one_boots_reads_are_not_enough():
    plan = fleet.plan_merge(PUBLISHED, [report('h1', [(100 * B, 3 * B)])], B, SIZE, SIZE)
    assert plan.added == () and plan.trace == PUBLISHED


def test_a_hosts_boots_count_at_most_host_votes_times():
    reads = [(200 * B, B)]
    one_host = [report('h1', reads) for _ in range(5)]
    # By default a host's boots count once: one host never carries a block alone.
    assert fleet.plan_merge((), one_host, B, SIZE, SIZE).added == ()
    assert fleet.plan_merge((), one_host + [report('h2', reads)], B, SIZE, SIZE).added == (
        (200 * B, B, 2),)
    # Two of its boots may reach a threshold of two...
    assert fleet.plan_merge((), one_host, B, SIZE, SIZE, host_votes=2).added == (
        (200 * B, B, 2),)
    # ...but never one of three: another host must read it too.
    assert fleet.plan_merge((), one_host, B, SIZE, SIZE, threshold=3, host_votes=2).added == ()
    assert fleet.plan_merge((), one_host + [report('h2', reads)], B, SIZE, SIZE,
                            threshold=3, host_votes=2).added == ((200 * B, B, 3),)


def test_a_boot_counts_once_per_block_however_often_it_read_it():
    twice = report('h1', [(300 * B, B), (300 * B + 512, 512), (300 * B, 2 * B)])
    assert fleet.support([twice], B, SIZE) == [(300 * B, 302 * B, 1)]


def test_what_the_boot_image_holds_is_not_added_again():
    reads = [(9 * B, 3 * B)]      # block 9 is outside, 10 and 11 are published
    plan = fleet.plan_merge(PUBLISHED, [report('h1', reads), report('h2', reads)], B, SIZE, SIZE)
    assert plan.added == ((9 * B, B, 2),)


def test_reads_are_widened_to_whole_blocks_and_the_last_block_may_be_short():
    size = 10 * B + 100
    reads = [(B + 1, 10), (10 * B + 50, 20)]
    plan = fleet.plan_merge((), [report('h1', reads, size=size), report('h2', reads, size=size)],
                            B, size, size)
    assert plan.added == ((B, B, 2), (10 * B, 100, 2))


def test_the_bound_takes_the_most_supported_blocks_first_and_cuts_at_a_block():
    hosts = [report('h%d' % n, [(500 * B, 4 * B)] + ([(600 * B, 4 * B)] if n < 3 else []))
             for n in range(4)]
    published_bytes = 6 * B
    plan = fleet.plan_merge(PUBLISHED, hosts, B, SIZE, max_bytes=published_bytes + 6 * B)
    # 500-503: support 4; 600-603: support 3, of which 2 blocks fit.
    assert plan.added == ((500 * B, 4 * B, 4), (600 * B, 2 * B, 3))
    assert sum(length for _, length in plan.trace) == published_bytes + 6 * B
    # No room: nothing added, the published extents kept.
    full = fleet.plan_merge(PUBLISHED, hosts, B, SIZE, max_bytes=published_bytes)
    assert full.trace == PUBLISHED and full.added == ()


def test_a_lying_host_can_add_up_to_the_bound_but_remove_nothing():
    honest = [report('h1', [(700 * B, B)]), report('h2', [(700 * B, B)])]
    # A liar under many names claims the whole file.
    liars = [report('liar-%d' % n, [(0, SIZE)]) for n in range(50)]
    bound = 6 * B + 64 * B
    plan = fleet.plan_merge(PUBLISHED, honest + liars, B, SIZE, max_bytes=bound)
    assert plan.trace[:len(PUBLISHED)] == PUBLISHED
    assert sum(length for _, length in plan.trace) <= bound
    # Reports that read nothing of what is published cannot take it out.
    assert fleet.plan_merge(PUBLISHED, liars[:1], B, SIZE, bound).trace == PUBLISHED


def test_reports_of_another_base_file_size_are_not_counted():
    reads = [(100 * B, B)]
    plan = fleet.plan_merge((), [report('h1', reads, size=SIZE * 2),
                                 report('h2', reads, size=SIZE * 2)], B, SIZE, SIZE)
    assert plan.added == () and plan.boots == 0


def test_the_sweep_adds_overlapping_spans_and_merges_equal_neighbours():
    assert fleet._sweep([(0, 10, 1), (5, 15, 1), (15, 20, 1)]) == [
        (0, 5, 1), (5, 10, 2), (10, 20, 1)]
    assert fleet._minus([(0, 100, 1)], [(10, 20), (30, 40)]) == [
        (0, 10, 1), (20, 30, 1), (40, 100, 1)]
    assert fleet._minus([(15, 35, 2)], [(10, 20), (30, 40)]) == [(20, 30, 2)]


# -- the payload --------------------------------------------------------------------------

def test_a_report_goes_through_a_notification_unchanged():
    sent = report('h1', [(0, 512), (B, B)])
    assert boot_reports.BootReport.from_payload(sent.to_payload()) == sent
    with_flavor = boot_reports.BootReport(IMAGE, 'h1', 'b', ((0, B),), SIZE, flavor='m1.small')
    assert boot_reports.BootReport.from_payload(with_flavor.to_payload()) == with_flavor


def test_a_merge_says_which_flavors_it_counted():
    reads = [(100 * B, B)]
    reports = [boot_reports.BootReport(IMAGE, 'h%d' % n, 'b', tuple(reads), SIZE, flavor=f)
               for n, f in enumerate(['m1.small', 'm1.large', None, 'm1.small'])]
    assert fleet.plan_merge((), reports, B, SIZE, SIZE).flavors == ('m1.large', 'm1.small')


@pytest.mark.parametrize('change, reason', [
    (dict(image_id='../../etc/passwd'), 'not an image id'),
    (dict(host=''), 'host'),
    (dict(host='h' * 300), 'host'),
    (dict(extents=[]), 'no extents'),
    (dict(extents=[[0, 0]]), 'not within'),
    (dict(extents=[[-B, B]]), 'not within'),
    (dict(extents=[[SIZE - B, 2 * B]]), 'not within'),
    (dict(extents=[[0, True]]), 'not [offset, length]'),
    (dict(extents=[[0, 1.5]]), 'not [offset, length]'),
    (dict(extents=[[0, B, 3]]), 'not [offset, length]'),
    (dict(extents=[[n * B, 1] for n in range(boot_reports.MAX_EXTENTS + 1)]), 'more than'),
    (dict(source_size=0), 'source_size'),
    (dict(source_size='1'), 'source_size'),
    (dict(flavor=''), 'flavor'),
    (dict(flavor=7), 'flavor'),
])
def test_a_bad_payload_is_refused_with_its_reason(change, reason):
    payload = dict(report('h1', [(0, B)]).to_payload(), **change)
    with pytest.raises(boot_reports.BadReport, match=re.escape(reason)):
        boot_reports.BootReport.from_payload(payload)
    with pytest.raises(boot_reports.BadReport):
        boot_reports.BootReport.from_payload(['not', 'a', 'mapping'])


def test_a_report_naming_more_than_a_gigabyte_is_refused():
    size = 4 << 30
    payload = report('h1', [(0, 1 << 30), (2 << 30, B)], size=size).to_payload()
    with pytest.raises(boot_reports.BadReport, match='bytes named'):
        boot_reports.BootReport.from_payload(payload)


# -- the store ------------------------------------------------------------------------------

def test_the_store_keeps_the_last_boots_of_each_host_once_each(tmp_path):
    store = fleet.ReportStore(tmp_path / 'reports', host_votes=2)
    first = report('h1', [(0, B)], boot='boot-1')
    assert store.add(first) and not store.add(first)
    store.add(report('h1', [(B, B)], boot='boot-2'))
    store.add(report('h1', [(2 * B, B)], boot='boot-3'))
    # Kept on disk: another store (the worker restarted) reads them.
    kept = fleet.ReportStore(tmp_path / 'reports', host_votes=2).reports(IMAGE)
    assert sorted(r.boot for r in kept) == ['boot-2', 'boot-3']
    store.forget(IMAGE)
    assert store.reports(IMAGE) == []


def test_the_store_drops_the_hosts_heard_from_longest_ago_and_old_reports(tmp_path):
    now = [1000.0]
    store = fleet.ReportStore(tmp_path, max_hosts=2, max_age_seconds=100,
                              clock=lambda: now[0])
    for host in ('h1', 'h2', 'h3'):
        now[0] += 1
        store.add(report(host, [(0, B)]))
    assert sorted(r.host for r in store.reports(IMAGE)) == ['h2', 'h3']
    now[0] += 101
    store.add(report('h4', [(0, B)]))
    assert [r.host for r in store.reports(IMAGE)] == ['h4']


def test_a_damaged_report_file_is_set_aside_and_reports_go_on(tmp_path):
    store = fleet.ReportStore(tmp_path)
    (tmp_path / (IMAGE + '.json')).write_text('{"h1": [{"received": 1, "pay')
    assert store.reports(IMAGE) == []
    assert (tmp_path / (IMAGE + '.json.bad')).exists()
    assert store.add(report('h1', [(0, B)]))
    assert [r.host for r in store.reports(IMAGE)] == ['h1']
    # A kept entry that is not a report (edited by hand) is not counted; the others are.
    kept = json.loads((tmp_path / (IMAGE + '.json')).read_text())
    kept['h2'] = [{'received': kept['h1'][0]['received'], 'payload': {'image_id': IMAGE}}]
    (tmp_path / (IMAGE + '.json')).write_text(json.dumps(kept))
    assert [r.host for r in store.reports(IMAGE)] == ['h1']
