"""The worker's Glance client wrapper."""

from unittest import mock

from glanceclient import exc as glance_exc
import pytest

from yolo_glance import glance as glance_api


def test_transient_glance_errors_are_retried_per_call():
    client = mock.Mock()
    client.images.get.side_effect = [glance_exc.HTTPInternalServerError('database is locked'),
                                     {'id': 'i1', 'status': 'active'}]
    assert glance_api.Glance(client).get('i1') == {'id': 'i1', 'status': 'active'}
    assert client.images.get.call_count == 2
    client.images.get.side_effect = glance_api.NotFound()
    with pytest.raises(glance_api.NotFound):
        glance_api.Glance(client).get('i2')   # not transient: not retried
