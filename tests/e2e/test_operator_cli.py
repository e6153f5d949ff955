"""``openstack yolo``, the operators' view, on the real cloud: the openstackclient plugin as
pip installs it, real keystone tokens and roles."""

from tests.e2e.conftest import admin, demo
from yolo_testing.wait import wait as wait_until


def by_field(rows):
    """``-f json`` of a ShowOne is a dict; of a Lister a list of dicts."""
    return {row['ID']: row for row in rows}


def test_image_list_and_show_report_the_published_boot_image(published_boot_image):
    source, boot_image_id = published_boot_image
    listed = by_field(admin('yolo', 'image', 'list'))
    row = listed[source['id']]
    assert row['Boot Image Status'] == 'ready'
    assert row['Boot Image ID'] == boot_image_id
    assert 0 < row['Coverage'] < 0.5, row
    assert row['Boot Image Size'] > 0
    # Boot images are not images of their own in the listing.
    assert boot_image_id not in listed

    shown = admin('yolo', 'image', 'show', source['id'])
    assert shown['Boot Image ID'] == boot_image_id
    assert shown['Boot Image Glance Status'] == 'active'
    assert shown['Window Ended By'] in ('ready', 'idle', 'max')


def test_operator_actions_are_refused_to_a_non_admin(published_boot_image):
    source, _ = published_boot_image
    for command in (('yolo', 'image', 'rebuild', source['id']), ('yolo', 'server', 'list'),
                    ('yolo', 'host', 'list')):
        proc = demo(*command, parse=False, check=False)
        assert proc.returncode != 0
        assert 'admin' in proc.stderr, proc.stderr
    # Reading is open to every user, as Glance shows them the image.
    assert demo('yolo', 'image', 'show', source['id'])['Boot Image Status'] == 'ready'


def test_host_list_says_what_keeps_each_hosts_boot_images_verified():
    # The driver sets its host's trait at each resource update (every 20 s here); yolofs holds
    # leases on the all-in-one's ext4.
    hosts = [row['Hypervisor Hostname'] for row in admin('hypervisor', 'list')]
    wait_until('every compute host reports its touch safety', 150, lambda: {
        row['Host']: row['Touch Safety'] for row in admin('yolo', 'host', 'list')
    } == dict.fromkeys(hosts, 'leases'))
