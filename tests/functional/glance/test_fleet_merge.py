"""The worker merges what compute hosts' boots read outside a boot image into its next version.

Glance is the in-memory fake (fakes.py) and the profiling boot a fixed trace; the downloads,
the raw conversion, yolofs' build, verify and inspect, and the signatures are real.
"""

import json
import types

from oslo_config import cfg
import oslo_messaging
from oslo_messaging import opts as messaging_opts

from tests.functional.glance.fakes import fake_learner
from tests.functional.glance.fakes import MiB
from tests.functional.glance.fakes import publish_signed
from tests.functional.glance.fakes import raw_disk
from yolo_common import boot_reports
from yolo_common import contract
from yolo_common import images
from yolo_common import learning
from yolo_common import signing
from yolo_common import yolofs
from yolo_glance import conf as yolo_conf
from yolo_glance import fleet
from yolo_glance import glance as glance_api
from yolo_glance import service
from yolo_nova.virt import fleet_reports
from yolo_testing.wait import wait as wait_until

SIZE = 4 * MiB


def report(source, host, extents, boot='boot-1', size=SIZE):
    return boot_reports.BootReport(image_id=source, host=host, boot=boot,
                                   extents=tuple(extents), source_size=size)


def extents_of(path):
    info = json.loads(yolofs.run('inspect', '--json', '--extents', path).stdout)
    return sorted((e['source_offset'], e['length']) for e in info['extents'])


def linked(glance, source):
    return glance.images[glance.images[source][glance_api.BOOT_IMAGE_ID]]


def small(make_worker, **kwargs):
    """A worker for these small boot images: a relative's shared bytes count from a block."""
    worker = make_worker(**kwargs)
    worker.profiling.min_boot_bytes = 4096
    return worker


def built(glance, make_worker, **kwargs):
    source = glance.add(raw_disk(SIZE))
    worker = small(make_worker, **kwargs)
    assert worker.build(source) == 'ready'
    return source, worker


def test_blocks_two_hosts_read_make_the_next_version(glance, make_worker, tmp_path):
    source, worker = built(glance, make_worker)
    first = linked(glance, source)
    reports = [report(source, 'h1', [(2 * MiB, 16384), (3 * MiB, 4096)]),
               report(source, 'h2', [(2 * MiB + 4096, 12288)])]
    assert worker.merge(source, reports) == 'merged'
    second = linked(glance, source)
    assert second['id'] != first['id'] and first['id'] not in glance.images   # superseded
    assert second[contract.VERSION] == '2'
    assert (second[contract.MERGED_HOSTS], second[contract.MERGED_BOOTS],
            second[contract.MERGED_BYTES]) == ('2', '2', '12288')
    # What both read (3 blocks); the block only h1 read is not in it.
    assert extents_of(second['file']) == [(0, 65536), (MiB, 8192), (2 * MiB + 4096, 12288)]
    assert int(second[contract.COVERED_BYTES]) == 65536 + 8192 + 12288
    # The profiling boot's figures are carried over; it is signed and matches the image.
    assert second[contract.BOOT_SECONDS] == first[contract.BOOT_SECONDS]
    assert worker._ours(second, source)
    raw = tmp_path / 'raw'
    raw.write_bytes(raw_disk(SIZE))
    yolofs.run('verify', second['file'], raw)
    assert not (tmp_path / 'work' / source).exists()


def test_what_the_boot_image_holds_already_makes_no_new_version(glance, make_worker):
    source, worker = built(glance, make_worker)
    first = linked(glance, source)['id']
    held = [report(source, h, [(0, 65536)]) for h in ('h1', 'h2')]
    one_boot = [report(source, 'h1', [(2 * MiB, 4096)])]
    downloads = glance.downloads
    assert worker.merge(source, held) == 'unchanged'
    assert worker.merge(source, one_boot) == 'unchanged'
    assert worker.merge(source, []) == 'unchanged'
    assert linked(glance, source)['id'] == first
    # Only the boot image was fetched to read its extents, once: the image was not downloaded.
    assert glance.downloads - downloads == 1


def test_a_merge_adds_at_most_the_bound(glance, make_worker):
    source, worker = built(glance, make_worker,
                           merging=fleet.MergeOptions(max_growth=0.25))
    # 73,728 bytes held: a quarter more is 18,432, four whole blocks.
    reports = [report(source, h, [(2 * MiB, 64 * 4096)] + ([(3 * MiB, 4096)] if h < 'h3' else []),
                      boot=h) for h in ('h1', 'h2', 'h3')]
    assert worker.merge(source, reports) == 'merged'
    second = linked(glance, source)
    assert int(second[contract.MERGED_BYTES]) == 4 * 4096
    # The most read first: 2 MiB (three hosts) before 3 MiB (two).
    assert extents_of(second['file']) == [(0, 65536), (MiB, 8192), (2 * MiB, 4 * 4096)]


def test_reports_of_another_base_file_are_not_merged(glance, make_worker):
    source, worker = built(glance, make_worker)
    other_size = [report(source, h, [(2 * MiB, 4096)], size=2 * SIZE) for h in ('h1', 'h2')]
    assert worker.merge(source, other_size) == 'unchanged'


def test_nothing_to_merge_into(glance, make_worker):
    worker = make_worker()
    assert worker.merge('missing', []) == 'gone'
    never_built = glance.add(raw_disk(SIZE))
    assert worker.merge(never_built, [report(never_built, 'h1', [(0, 4096)])]) == 'no_boot_image'


def test_a_planted_newer_version_is_not_kept(glance, make_worker, signer):
    source, worker = built(glance, make_worker)
    ours = linked(glance, source)['id']
    # Someone in the worker's project publishes a "version 9", signed with another key.
    planted = publish_signed(glance, signing.Signer.generate(), source,
                             **{contract.VERSION: '9'})
    reports = [report(source, h, [(2 * MiB, 4096)], boot=h) for h in ('h1', 'h2')]
    assert worker.merge(source, reports) == 'merged'
    second = linked(glance, source)
    assert second[contract.VERSION] == '2' and planted not in glance.images
    assert ours not in glance.images


def test_a_merged_boot_image_loads_in_yolofs_and_serves_the_merged_blocks(
        glance, make_worker, tmp_path):
    """Installed on a host as Nova would (yolofs verifies it against the base file), the new
    version serves what the reports named from memory."""
    source, worker = built(glance, make_worker)
    reports = [report(source, h, [(2 * MiB, 8192)], boot=h) for h in ('h1', 'h2')]
    assert worker.merge(source, reports) == 'merged'
    base_dir = tmp_path / '_base'
    base_dir.mkdir()
    base = base_dir / 'base'
    base.write_bytes(raw_disk(SIZE))
    store = tmp_path / 'store'
    with yolofs.Mount(source=base_dir, mountpoint=tmp_path / 'mnt', boot_images=store,
                      control_socket=tmp_path / 'control.sock',
                      log_path=tmp_path / 'yolofs.log') as mount:
        mount.client.install('base', linked(glance, source)['file'], source)
        with open(mount.mountpoint / 'base', 'rb') as f:
            f.seek(2 * MiB)
            assert f.read(8192) == raw_disk(SIZE)[2 * MiB:2 * MiB + 8192]
        stats = mount.client.stats('base')['base']
    assert stats['bytes_memory'] >= 8192 and stats['bytes_passthrough'] == 0, stats


def boot_on_host(tmp_path, host, source, boot_image, reads):
    """A boot on compute host ``host``: ``boot_image`` installed in its yolofs, the ``reads``
    ((offset, length)) made through the mount; returns yolofs' record of the boot and a
    reporter of the host, and the mount (stopped)."""
    base_dir = tmp_path / host / '_base'
    base_dir.mkdir(parents=True, exist_ok=True)
    name = images.base_file_name(source)
    (base_dir / name).write_bytes(raw_disk(SIZE))
    with yolofs.Mount(source=base_dir, mountpoint=tmp_path / host / 'mnt',
                      boot_images=tmp_path / host / 'store',
                      control_socket=tmp_path / host / 'control.sock',
                      log_path=tmp_path / host / 'yolofs.log', record_idle_secs=1) as mount:
        mount.client.install(name, boot_image, source)
        with open(mount.mountpoint / name, 'rb') as f:
            for offset, length in reads:
                f.seek(offset)
                f.read(length)
        [boot] = wait_until('the boot window to end', 30,
                            lambda: mount.client.stats(name)[name]['boots'])
        status = mount.client.status()
        files = types.SimpleNamespace(client=mount.client,
                                      base_path=lambda n: str(base_dir / n))
        yield boot, status, files


def test_hosts_boot_reports_reach_the_worker_over_the_bus_and_make_the_next_version(
        glance, make_worker, tmp_path):
    """Two compute hosts' boots read a range the profiling boot did not (a config drive's, a
    network's): each host's nova-compute reports it (virt/fleet_reports.py), over oslo.messaging
    (its in-memory transport; the exchange Nova's), the worker's listener keeps the reports
    and merges them, and the next boot from the new version reads it all from memory."""
    # The guest's reads come with the kernel's readahead: room for them.
    source, worker = built(glance, make_worker, merging=fleet.MergeOptions(max_growth=4.0))
    messaging = cfg.ConfigOpts()
    for group, opts in messaging_opts.list_opts():
        messaging.register_opts(opts, group=group)
    messaging([], project='yolo-test')
    messaging.set_override('control_exchange', 'nova')
    transport = oslo_messaging.get_notification_transport(messaging, url='fake:/')
    worker_conf = cfg.ConfigOpts()
    yolo_conf.register_opts(worker_conf)
    worker_conf([], project='yolo-test')
    dispatcher = service.Dispatcher(worker, glance, reports=fleet.ReportStore(
        tmp_path / 'reports'), merge_interval=0)
    listener = service.notification_listener(worker_conf, dispatcher, transport=transport)
    listener.start()
    try:
        nova_boot = [(0, 65536), (MiB, 8192), (2 * MiB, 16384)]
        for host in ('compute-1', 'compute-2'):
            for boot, status, files in boot_on_host(tmp_path, host, source,
                                                    linked(glance, source)['file'], nova_boot):
                assert [2 * MiB, 16384] in boot['outside'], boot
                reporter = fleet_reports.BootReporter(
                    files, host, 'yolo_boot_reports', notifier=oslo_messaging.Notifier(
                        transport, 'yolo-compute.' + host, driver='messagingv2',
                        topics=['yolo_boot_reports']))
                assert reporter.send_new(status) == 1
        version_2 = wait_until('the merge', 60, lambda: linked(glance, source).get(
            contract.VERSION) == '2' and linked(glance, source))
    finally:
        listener.stop()
        listener.wait()
        dispatcher.shutdown()
    assert (2 * MiB, 16384) in extents_of(version_2['file'])
    assert version_2[contract.MERGED_HOSTS] == '2'
    sample = dispatcher.metrics.registry.get_sample_value
    assert sample('yolo_worker_boot_reports_total', {'outcome': 'accepted'}) == 2
    assert sample('yolo_worker_merges_total', {'outcome': 'merged'}) == 1
    for boot, _, _ in boot_on_host(tmp_path, 'compute-3', source, version_2['file'], nova_boot):
        assert boot['coverage'] == 1.0 and boot['outside'] == [], boot


# -- a new image starts from a relative's boot image ---------------------------------------

def derived(data, changed_blocks):
    child = bytearray(data)
    for block in changed_blocks:
        child[block * 4096] ^= 0xff
    return bytes(child)


def failing_learner(base, work, **options):
    raise learning.LearningFailed('the guest did not boot')


def test_a_snapshot_starts_from_its_parents_boot_image_until_its_own(glance, make_worker):
    parent, _ = built(glance, make_worker)
    # Block 0 changed (a new partition table, say): the rest of the parent's boot set is shared.
    child = glance.add(derived(raw_disk(SIZE), [0]), base_image_ref=parent)
    seen = []

    def learner(base, work, **options):
        # While the child's own profiling boot runs, it links the interim boot image.
        seen.append(linked(glance, child))
        return fake_learner(reads=((0, 4096), (3 * MiB, 4096)))(base, work, **options)

    assert small(make_worker, learner=learner).build(child) == 'ready'
    [interim] = seen
    assert interim[contract.VERSION] == '0' and interim[contract.DERIVED_FROM] == parent
    assert glance.images[child][glance_api.STATUS] == 'ready'
    own = linked(glance, child)
    assert own[contract.VERSION] == '1' and interim['id'] not in glance.images


def test_an_image_whose_profiling_boot_fails_keeps_its_relatives_shared_bytes(
        glance, make_worker, tmp_path):
    parent, _ = built(glance, make_worker)
    data = derived(raw_disk(SIZE), [1, MiB // 4096])
    child = glance.add(data, base_image_ref=parent)
    assert small(make_worker, learner=failing_learner).build(child) == 'failed'
    image = glance.images[child]
    assert 'did not boot' in image[glance_api.REASON]
    interim = linked(glance, child)
    assert interim[contract.DERIVED_FROM] == parent
    # The parent's extents less the two blocks the child changed, verified against the child.
    assert extents_of(interim['file']) == [(0, 4096), (2 * 4096, 65536 - 2 * 4096),
                                           (MiB + 4096, 4096)]
    raw = tmp_path / 'child.raw'
    raw.write_bytes(data)
    yolofs.run('verify', interim['file'], raw)
    assert worker_signed(make_worker(), interim, child)


def worker_signed(worker, boot_image, source):
    return worker._ours(boot_image, source)


def test_an_image_of_the_same_size_is_a_relative_too(glance, make_worker):
    parent, _ = built(glance, make_worker)
    child = glance.add(derived(raw_disk(SIZE), [5]))
    assert small(make_worker, learner=failing_learner).build(child) == 'failed'
    assert linked(glance, child)[contract.DERIVED_FROM] == parent


def test_no_relative_from_another_projects_private_image_or_with_little_in_common(
        glance, make_worker):
    parent, _ = built(glance, make_worker)
    glance.images[parent]['owner'] = 'p2'
    child = glance.add(derived(raw_disk(SIZE), [5]), base_image_ref=parent)
    assert small(make_worker, learner=failing_learner).build(child) == 'failed'
    assert glance_api.BOOT_IMAGE_ID not in glance.images[child]
    # Shared by its owner with everyone: used.
    glance.images[parent]['visibility'] = 'public'
    glance.set_properties(child, remove=[glance_api.STATUS])
    assert small(make_worker, learner=failing_learner).build(child) == 'failed'
    assert linked(glance, child)[contract.DERIVED_FROM] == parent
    # Another disk of the same size, other bytes: nothing in common.
    stranger = glance.add(bytes(SIZE))
    assert small(make_worker, learner=failing_learner).build(stranger) == 'failed'
    assert glance_api.BOOT_IMAGE_ID not in glance.images[stranger]


def test_a_community_image_is_a_relative_only_by_name(glance, make_worker):
    """Anyone may publish a community image of a common size: it is no relative of other
    projects' images unless they name it (a server snapshot's base_image_ref)."""
    parent, _ = built(glance, make_worker)
    glance.images[parent].update(owner='p2', visibility='community')
    child = glance.add(derived(raw_disk(SIZE), [5]))
    assert small(make_worker, learner=failing_learner).build(child) == 'failed'
    assert glance_api.BOOT_IMAGE_ID not in glance.images[child]
    named = glance.add(derived(raw_disk(SIZE), [5]), base_image_ref=parent)
    assert small(make_worker, learner=failing_learner).build(named) == 'failed'
    assert linked(glance, named)[contract.DERIVED_FROM] == parent


def test_a_relative_replaced_meanwhile_is_skipped(glance, make_worker, monkeypatch):
    parent, _ = built(glance, make_worker)
    relative = glance.images[parent][glance_api.BOOT_IMAGE_ID]
    child = glance.add(derived(raw_disk(SIZE), [5]), base_image_ref=parent)
    download = glance.download

    def gone(image_id, path):
        if image_id == relative:
            raise glance_api.NotFound()
        return download(image_id, path)
    monkeypatch.setattr(glance, 'download', gone)
    assert small(make_worker).build(child) == 'ready'
    own = linked(glance, child)
    assert contract.DERIVED_FROM not in own and own[contract.VERSION] == '1'


def test_an_image_on_its_relatives_boot_image_is_built_again(glance, make_worker):
    """A worker that died during the profiling boot left the image linked to its relative's:
    the scan builds it again (once the claim expired), and so does a retry."""
    parent, _ = built(glance, make_worker)
    child = glance.add(derived(raw_disk(SIZE), [5]), base_image_ref=parent)
    worker = small(make_worker, learner=failing_learner)
    assert worker.build(child) == 'failed'
    interim = linked(glance, child)['id']
    glance.set_properties(child, **{glance_api.STATUS: 'building',
                                    glance_api.CLAIM: 'worker-dead 0'})
    usable = worker.usable_ids(worker.published())
    assert interim not in usable and worker.needs_build(glance.get(child), usable)
    assert small(make_worker).build(child) == 'ready'
    own = linked(glance, child)
    assert contract.DERIVED_FROM not in own and interim not in glance.images
    # Of its own line now: built.
    assert not worker.needs_build(glance.get(child), worker.usable_ids(worker.published()))


def test_a_merge_changes_the_link_only(glance, make_worker):
    parent, _ = built(glance, make_worker)
    child = glance.add(derived(raw_disk(SIZE), [5]), base_image_ref=parent)
    worker = small(make_worker, learner=failing_learner)
    assert worker.build(child) == 'failed'
    reason = glance.images[child][glance_api.REASON]
    reports = [report(child, h, [(3 * MiB, 4096)], boot=h) for h in ('h1', 'h2')]
    assert worker.merge(child, reports) == 'merged'
    image = glance.images[child]
    assert (image[glance_api.STATUS], image[glance_api.REASON]) == ('failed', reason)
    merged = linked(glance, child)
    # A merge into the relative's line stays of it: the image's own still replaces it.
    assert merged[contract.VERSION] == '1' and merged[contract.DERIVED_FROM] == parent
    assert (3 * MiB, 4096) in extents_of(merged['file'])


def test_a_merge_never_publishes_more_than_hosts_take(glance, make_worker, monkeypatch):
    from yolo_glance import worker as worker_mod
    monkeypatch.setattr(worker_mod, 'INDEX_ROOM_BYTES', 0)
    source, worker = built(glance, make_worker,
                           merging=fleet.MergeOptions(max_bytes=73728 + 4096))
    first = linked(glance, source)['id']
    reports = [report(source, h, [(3 * MiB, 4096)], boot=h) for h in ('h1', 'h2')]
    # The data would fit; with its header and index, the file would not.
    assert worker.merge(source, reports) == 'unchanged'
    assert linked(glance, source)['id'] == first
