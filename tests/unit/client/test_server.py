"""``openstack yolo server list`` against in-memory Nova and Glance."""

from osc_lib import exceptions
import pytest

from tests.unit.client import fakes
from yolo_client import server as server_cmd


def cloud(**app_args):
    images = fakes.FakeImages(
        fakes.image('img-ready', yolo_boot_image_status='ready', yolo_boot_image_id='boot-1'),
        fakes.boot_image('boot-1', 'img-ready'),
        fakes.image('img-failed', yolo_boot_image_status='failed'),
        fakes.image('img-secret', os_hidden=True))
    servers = [fakes.server('s1', 'img-ready'), fakes.server('s2', 'img-failed', host='compute2'),
               fakes.server('s3', None, status='SHUTOFF'), fakes.server('s4', 'img-deleted'),
               fakes.server('s5', 'img-secret')]
    return images, fakes.app(images, servers, **app_args)


def run(app, argv=()):
    command = server_cmd.ListServer(app, None)
    return command.take_action(
        command.get_parser('openstack yolo server list').parse_args(list(argv)))


def test_servers_of_all_projects_with_what_yolofs_does_for_them():
    images, app = cloud()
    columns, rows = run(app)
    rows = [tuple(getattr(v, 'machine_readable', lambda: v)() for v in row) for row in rows]
    assert columns == ('ID', 'Name', 'Status', 'Host', 'Image', 'Boot Image Status', 'yolofs')
    assert rows == [
        ('s1', 'vm-s1', 'ACTIVE', 'compute1', 'img-ready', 'ready', 'boot image'),
        ('s2', 'vm-s2', 'ACTIVE', 'compute2', 'img-failed', 'failed', 'passthrough'),
        ('s3', 'vm-s3', 'SHUTOFF', 'compute1', None, None, 'no (volume)'),
        ('s4', 'vm-s4', 'ACTIVE', 'compute1', 'img-deleted', None, 'unknown'),
        ('s5', 'vm-s5', 'ACTIVE', 'compute1', 'img-secret', None, 'passthrough'),
    ]
    app.client_manager.yolo.nova.servers.list.assert_called_once_with(
        search_opts={'all_tenants': True}, limit=-1)
    # The servers' images in two listings, not a GET per server.
    assert [c[0] for c in images.calls] == ['list', 'list']


def test_host_filter_is_nova_s():
    _, app = cloud()
    run(app, ['--host', 'compute2'])
    app.client_manager.yolo.nova.servers.list.assert_called_once_with(
        search_opts={'all_tenants': True, 'host': 'compute2'}, limit=-1)


def test_needs_the_admin_role():
    _, app = cloud(roles=('member',))
    with pytest.raises(exceptions.CommandError, match='needs the admin role'):
        run(app)
    app.client_manager.yolo.nova.servers.list.assert_not_called()


def test_help_says_what_the_column_means_and_where_the_truth_is():
    description = server_cmd.ListServer.__doc__
    assert 'yolofs ctl status' in description
    for value in (server_cmd.BOOT_IMAGE, server_cmd.PASSTHROUGH, server_cmd.VOLUME,
                  server_cmd.UNKNOWN):
        assert '"%s"' % value in description
