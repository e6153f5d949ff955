"""How the worker service reads Glance's notifications."""

from unittest import mock

from yolo_glance import glance as glance_api
from yolo_glance import service


class TestNotifications:

    def notify(self, event_type, payload):
        dispatcher = mock.Mock()
        result = service.NotificationEndpoint(dispatcher).info(
            {}, 'image.localhost', event_type, payload, {})
        assert result == 'handled'
        return dispatcher

    def test_activate_builds_once_active(self):
        self.notify('image.activate', {'id': 'i1', 'status': 'importing', 'owner': 'p1'}) \
            .build.assert_called_once_with('i1', wait_active=True, project='p1')

    def test_delete_deletes(self):
        self.notify('image.delete', {'id': 'i1'}).delete.assert_called_once_with('i1')

    def test_updates_of_active_images_build_but_not_our_own(self):
        self.notify('image.update', {'id': 'i1', 'status': 'active', 'properties': {},
                                     'owner': 'p1'}) \
            .build.assert_called_once_with('i1', project='p1')
        for status in service.OWN_STATUSES:
            dispatcher = self.notify('image.update', {
                'id': 'i1', 'status': 'active',
                'properties': {glance_api.STATUS: status}})
            dispatcher.build.assert_not_called()

    def test_the_filter_selects_image_events(self):
        rule = service.NotificationEndpoint.filter_rule
        assert rule.match({}, 'image.localhost', 'image.activate', {}, {})
        assert not rule.match({}, 'image.localhost', 'image.upload', {}, {})
        assert not rule.match({}, 'image.localhost', 'image.member.create', {}, {})
