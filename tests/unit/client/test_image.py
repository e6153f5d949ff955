"""``openstack yolo image list|show|rebuild`` against an in-memory Glance."""

import json
from unittest import mock

from osc_lib import exceptions
import pytest

from tests.unit.client import fakes
from yolo_client import image as image_cmd
from yolo_glance import service
from yolo_glance import worker as worker_mod

MiB = 1 << 20
MEASURED = {'yolo_boot_image_bytes': str(65 * MiB), 'yolo_covered_bytes': str(64 * MiB),
            'yolo_coverage': '0.0312', 'yolo_source_raw_size': str(2048 * MiB),
            'yolo_boot_seconds': '24.8', 'yolo_build_seconds': '3.50',
            'yolo_window_ended_by': 'ready'}


def glance():
    return fakes.FakeImages(
        fakes.image('img-ready', 'debian', yolo_boot_image_status='ready',
                    yolo_boot_image_id='boot-1'),
        fakes.boot_image('boot-1', 'img-ready', size=65 * MiB, **MEASURED),
        fakes.image('img-failed', 'broken', yolo_boot_image_status='failed',
                    yolo_boot_image_reason='image data is qcow2, not the declared raw'),
        fakes.image('img-new', 'fresh'),
        # A tenant's hidden image (not a boot image) is listed too.
        fakes.image('img-hidden', 'old-release', os_hidden=True,
                    yolo_boot_image_status='skipped', yolo_boot_image_reason='ISO image'))


def run(command_class, argv, app):
    command = command_class(app, None)
    return command.take_action(command.get_parser('openstack yolo').parse_args(argv))


def machine(value):
    return getattr(value, 'machine_readable', lambda: value)()


def test_list_every_image_with_its_boot_image_in_two_listings():
    images = glance()
    columns, rows = run(image_cmd.ListImage, [], fakes.app(images))
    rows = {r[0]: dict(zip(columns, map(machine, r))) for r in rows}
    assert columns == ('ID', 'Name', 'Boot Image Status', 'Boot Image ID', 'Boot Image Size',
                       'Coverage', 'Build Time', 'Reason', 'Warm', 'Hosts Holding')
    assert set(rows) == {'img-ready', 'img-failed', 'img-new', 'img-hidden'}   # no boot-1
    assert rows['img-ready'] == {
        'ID': 'img-ready', 'Name': 'debian', 'Boot Image Status': 'ready',
        'Boot Image ID': 'boot-1', 'Boot Image Size': 65 * MiB, 'Coverage': 0.0312,
        'Build Time': 3.5, 'Reason': None, 'Warm': None, 'Hosts Holding': None}
    assert rows['img-failed']['Boot Image Status'] == 'failed'
    assert rows['img-failed']['Reason'] == 'image data is qcow2, not the declared raw'
    assert rows['img-failed']['Boot Image Size'] is None
    assert rows['img-new']['Boot Image Status'] is None
    assert rows['img-hidden']['Reason'] == 'ISO image'
    # The hidden boot images come from one more listing, not a GET per image.
    assert [c[0] for c in images.calls] == ['list', 'list']
    assert [c[1]['os_hidden'] for c in images.calls] == [False, True]


def test_list_formats_for_tables_and_json():
    app = fakes.app(glance())
    command = image_cmd.ListImage(app, None)
    parser = command.get_parser('openstack yolo image list')
    command.run(parser.parse_args(['-f', 'json']))
    listed = {r['ID']: r for r in json.loads(app.stdout.getvalue())}
    assert listed['img-ready']['Coverage'] == 0.0312
    assert listed['img-ready']['Boot Image Size'] == 65 * MiB
    app.stdout.seek(0)
    app.stdout.truncate()
    command.run(parser.parse_args(['-f', 'table', '-c', 'Name', '-c', 'Boot Image Size',
                                   '-c', 'Coverage', '-c', 'Build Time']))
    table = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip('|').split('|')]
        for line in app.stdout.getvalue().splitlines() if line.startswith('|'))}
    assert table['debian'] == ['65.0 MiB', '3.1%', '3.5 s']
    assert table['fresh'] == ['', '', '']


def test_show_by_name_with_what_the_worker_measured():
    columns, data = run(image_cmd.ShowImage, ['debian'], fakes.app(glance()))
    shown = dict(zip(columns, map(machine, data)))
    assert shown['ID'] == 'img-ready'
    assert shown['Boot Image Status'] == 'ready'
    assert shown['Boot Image Glance Status'] == 'active'
    assert shown['Boot Image Size'] == 65 * MiB
    assert shown['Covered Bytes'] == 64 * MiB
    assert shown['Raw Image Size'] == 2048 * MiB
    assert shown['Profiling Boot Time'] == 24.8
    assert shown['Window Ended By'] == 'ready'


def test_show_a_link_to_a_missing_boot_image():
    images = fakes.FakeImages(fakes.image('img-1', yolo_boot_image_status='ready',
                                          yolo_boot_image_id='gone'))
    columns, data = run(image_cmd.ShowImage, ['img-1'], fakes.app(images))
    shown = dict(zip(columns, map(machine, data)))
    assert shown['Boot Image Glance Status'] == 'not found'
    assert shown['Coverage'] is None


def test_show_refuses_boot_images_and_ambiguous_names():
    images = glance()
    with pytest.raises(exceptions.CommandError, match='boot image, of image img-ready'):
        run(image_cmd.ShowImage, ['boot-1'], fakes.app(images))
    images.images['img-other'] = fakes.image('img-other', 'debian')
    with pytest.raises(exceptions.CommandError, match='More than one'):
        run(image_cmd.ShowImage, ['debian'], fakes.app(images))
    with pytest.raises(exceptions.CommandError, match='No image'):
        run(image_cmd.ShowImage, ['nothing'], fakes.app(images))


def test_rebuild_needs_the_admin_role():
    images = glance()
    with pytest.raises(exceptions.CommandError, match='needs the admin role.*member, reader'):
        run(image_cmd.RebuildImage, ['debian'], fakes.app(images, roles=('reader', 'member')))
    assert not [c for c in images.calls if c[0] in ('update', 'delete')]


def test_rebuild_deletes_the_workers_boot_images_and_marks_the_image_pending():
    images = glance()
    # A duplicate of the worker's (a race it lost) and a tenant's look-alike.
    images.images['boot-2'] = fakes.boot_image('boot-2', 'img-ready')
    images.images['planted'] = fakes.boot_image('planted', 'img-ready', owner='tenant')
    columns, data = run(image_cmd.RebuildImage, ['debian'], fakes.app(images))
    assert dict(zip(columns, map(machine, data))) == {
        'ID': 'img-ready', 'Name': 'debian', 'Boot Image Status': 'pending',
        'Deleted Boot Images': ['boot-1', 'boot-2']}
    assert 'planted' in images.images
    changes = [c for c in images.calls if c[0] in ('update', 'delete')]
    # The old boot images go before the image asks for a build.
    assert changes == [
        ('delete', 'boot-1'), ('delete', 'boot-2'),
        ('update', 'img-ready',
         ['yolo_boot_image_claim', 'yolo_boot_image_id', 'yolo_boot_image_reason'],
         {'yolo_boot_image_status': 'pending'})]
    rebuilt = images.images['img-ready']
    assert rebuilt['yolo_boot_image_status'] == 'pending'
    assert 'yolo_boot_image_id' not in rebuilt


def test_rebuild_of_a_failed_image_deletes_nothing():
    images = glance()
    run(image_cmd.RebuildImage, ['img-failed'], fakes.app(images))
    assert [c[0] for c in images.calls if c[0] in ('update', 'delete')] == ['update']
    assert images.images['img-failed']['yolo_boot_image_status'] == 'pending'
    assert 'yolo_boot_image_reason' not in images.images['img-failed']


@pytest.mark.parametrize('fields, message', [
    ({'yolo_boot_image_status': 'building', 'yolo_boot_image_claim': 'w1:12 1700000000'},
     'being built'),
    ({'status': 'queued'}, 'is queued'),
])
def test_rebuild_refuses_builds_under_way_and_inactive_images(fields, message):
    images = fakes.FakeImages(fakes.image('img-1', **fields))
    with pytest.raises(exceptions.CommandError, match=message):
        run(image_cmd.RebuildImage, ['img-1'], fakes.app(images))
    assert not [c for c in images.calls if c[0] in ('update', 'delete')]


def test_the_worker_as_it_is_builds_a_rebuilt_image(tmp_path):
    """The request is what the worker already acts on: its scan and the image.update
    notification that Glance sends for the change."""
    images = glance()
    run(image_cmd.RebuildImage, ['debian'], fakes.app(images))
    rebuilt = images.images['img-ready']
    worker = worker_mod.Worker(mock.Mock(), str(tmp_path), profiling=None)
    assert worker.needs_build(rebuilt)
    dispatcher = mock.Mock()
    properties = {k: v for k, v in rebuilt.items() if k.startswith('yolo_')}
    service.NotificationEndpoint(dispatcher).info(
        {}, 'image.localhost', 'image.update',
        {'id': 'img-ready', 'status': 'active', 'properties': properties}, {})
    dispatcher.build.assert_called_once_with('img-ready', project=None)
    # And no old boot image is left for the worker to prefer over the new one.
    assert not list(images.list(filters={'yolo_source_image_id': 'img-ready',
                                         'os_hidden': True, 'owner': 'service'}))


WARM_ID = '0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e'
COLD_ID = '11111111-2222-4333-8444-555566667777'


class FakePlacement:
    """GET /traits?name=startswith:... and /resource_providers?required=TRAIT."""

    def __init__(self, hosts_by_trait, error=None):
        self.hosts_by_trait, self.error = hosts_by_trait, error
        self.calls = []

    def get(self, url, microversion=None):
        self.calls.append((url, microversion))
        if self.error:
            raise self.error
        if url.startswith('/traits'):
            body = {'traits': sorted(self.hosts_by_trait)}
        else:
            trait = url.split('required=')[1]
            body = {'resource_providers': [{'name': h} for h in self.hosts_by_trait[trait]]}
        return mock.Mock(json=lambda: body)


def warm_glance():
    return fakes.FakeImages(
        fakes.image(WARM_ID, 'debian', yolo_boot_image_id='boot-1', yolo_warm='all',
                    visibility='public'),
        fakes.image(COLD_ID, 'ubuntu', yolo_boot_image_id='boot-2', yolo_warm='aggregate:a1',
                    visibility='public'),
        fakes.image('img-none', 'no boot image', visibility='public'),
        fakes.boot_image('boot-1', WARM_ID), fakes.boot_image('boot-2', COLD_ID))


def test_list_shows_where_each_warm_image_is_and_how_many_hosts_hold_it():
    app = fakes.app(warm_glance())
    placement = FakePlacement({'CUSTOM_YOLO_WARM_0B5D7C1E8D5E4A559A572F5CBD1C3D3E':
                               ['compute1', 'compute2']})
    app.client_manager.yolo.placement = placement
    columns, rows = run(image_cmd.ListImage, [], app)
    rows = {r[0]: dict(zip(columns, map(machine, r))) for r in rows}
    assert (rows[WARM_ID]['Warm'], rows[WARM_ID]['Hosts Holding']) == ('all', 2)
    # Warm in an aggregate no host of which holds it yet: no such trait exists.
    assert (rows[COLD_ID]['Warm'], rows[COLD_ID]['Hosts Holding']) == ('aggregate:a1', 0)
    assert (rows['img-none']['Warm'], rows['img-none']['Hosts Holding']) == (None, None)
    # One listing of the traits, one count per warm image that has one.
    assert [m for _, m in placement.calls] == [None, '1.18']


def test_list_without_placement_leaves_the_count_blank():
    from keystoneauth1 import exceptions as ks_exceptions
    app = fakes.app(warm_glance(), roles=('member',))
    app.client_manager.yolo.placement = FakePlacement({}, error=ks_exceptions.Forbidden())
    columns, rows = run(image_cmd.ListImage, [], app)
    rows = {r[0]: dict(zip(columns, map(machine, r))) for r in rows}
    assert (rows[WARM_ID]['Warm'], rows[WARM_ID]['Hosts Holding']) == ('all', None)


def test_warm_marks_the_images_named_for_every_host_or_an_aggregate():
    images = warm_glance()
    app = fakes.app(images)
    rack = mock.Mock(id=7, uuid='a7')
    rack.name = 'rack-7'
    app.client_manager.yolo.nova_aggregates.list.return_value = [rack]
    _, rows = run(image_cmd.WarmImage, ['img-none', '--aggregate', 'rack-7'], app)
    assert rows == [('img-none', 'no boot image', 'aggregate:a7')]
    assert images.images['img-none']['yolo_warm'] == 'aggregate:a7'
    _, rows = run(image_cmd.WarmImage, ['ubuntu'], app)
    assert images.images[COLD_ID]['yolo_warm'] == 'all'
    with pytest.raises(exceptions.CommandError, match='No host aggregate'):
        run(image_cmd.WarmImage, ['ubuntu', '--aggregate', 'rack-8'], app)


def test_warm_without_images_marks_every_public_image_with_a_boot_image():
    images = warm_glance()
    _, rows = run(image_cmd.WarmImage, [], fakes.app(images))
    assert sorted(r[0] for r in rows) == sorted([WARM_ID, COLD_ID])
    assert {images.images[i]['yolo_warm'] for i in (WARM_ID, COLD_ID)} == {'all'}
    assert 'yolo_warm' not in images.images['img-none']


def test_unwarm_removes_the_mark_and_both_need_admin():
    images = warm_glance()
    run(image_cmd.UnwarmImage, [WARM_ID], fakes.app(images))
    assert 'yolo_warm' not in images.images[WARM_ID]
    for command, argv in ((image_cmd.WarmImage, []), (image_cmd.UnwarmImage, [COLD_ID])):
        with pytest.raises(exceptions.CommandError, match='admin'):
            run(command, argv, fakes.app(warm_glance(), roles=('member',)))
