"""Tenants cannot set or change YOLO's image properties (Glance property protections)."""

import openstack.exceptions
import pytest

from tests.e2e.conftest import connection, demo


def test_a_tenant_cannot_set_yolo_properties(cloud):
    # A decoy boot image, through the API (the openstack client offers no yolo container
    # format): Glance refuses the property.
    with pytest.raises(openstack.exceptions.ForbiddenException, match='yolo_source_image_id'):
        connection('aio-demo').image.create_image(
            name='e2e-decoy', container_format='yolo', disk_format='raw',
            yolo_source_image_id='someone-elses')
    image = demo('image', 'create', '--container-format', 'bare', '--disk-format', 'raw',
                 'e2e-own-image')
    try:
        for prop in ('yolo_boot_image_id=x', 'yolo_boot_image_status=ready',
                     'yolo_max_seconds=100000'):
            changed = demo('image', 'set', '--property', prop, image['id'], parse=False,
                           check=False)
            assert changed.returncode != 0 and '403' in changed.stderr, prop
        # Other properties stay the tenant's to set.
        demo('image', 'set', '--property', 'os_distro=debian', image['id'], parse=False)
    finally:
        demo('image', 'delete', image['id'], parse=False, check=False)
