"""How the worker service reads Glance's notifications."""

from unittest import mock

from yolo_common import boot_reports
from yolo_glance import fleet
from yolo_glance import glance as glance_api
from yolo_glance import metrics as metrics_mod
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


class TestBootReports:

    PAYLOAD = {'image_id': 'c0ffee00-0000-4000-8000-00000000000a', 'host': 'compute-1',
               'boot': 'base@100', 'extents': [[4096, 8192]], 'source_size': 1 << 20}

    def dispatcher(self, tmp_path, worker=None, now=None):
        worker = worker or mock.Mock()
        worker.metrics = metrics_mod.Metrics()
        return service.Dispatcher(worker, None, reports=fleet.ReportStore(tmp_path),
                                  merge_interval=600, clock=lambda: now[0] if now else 0.0)

    def test_a_report_is_kept_once_and_queues_a_merge(self, tmp_path):
        dispatcher = mock.Mock()
        dispatcher.metrics = metrics_mod.Metrics()
        dispatcher.reports = fleet.ReportStore(tmp_path)
        endpoint = service.BootReportEndpoint(dispatcher)
        for _ in range(2):
            assert endpoint.info({}, 'yolo-compute.compute-1', boot_reports.EVENT_TYPE,
                                 self.PAYLOAD, {}) == 'handled'
        dispatcher.merge.assert_called_once_with(self.PAYLOAD['image_id'])
        assert [r.boot for r in dispatcher.reports.reports(self.PAYLOAD['image_id'])] == [
            'base@100']
        assert endpoint.info({}, 'yolo-compute.x', boot_reports.EVENT_TYPE,
                             dict(self.PAYLOAD, extents=[[0, 1 << 21]]), {}) == 'handled'
        sample = dispatcher.metrics.registry.get_sample_value
        assert [sample('yolo_worker_boot_reports_total', {'outcome': o})
                for o in ('accepted', 'duplicate', 'refused')] == [1, 1, 1]
        rule = service.BootReportEndpoint.filter_rule
        assert rule.match({}, 'yolo-compute.x', boot_reports.EVENT_TYPE, {}, {})
        assert not rule.match({}, 'image.localhost', 'image.update', {}, {})

    def test_merges_wait_only_after_one_that_published(self, tmp_path):
        worker = mock.Mock()
        worker.merge.side_effect = ['unchanged', 'merged', 'merged']
        now = [0.0]
        dispatcher = self.dispatcher(tmp_path, worker, now)
        try:
            assert dispatcher.merge('i1').result(10) == 'merge: unchanged'
            assert dispatcher.merge('i1').result(10) == 'merge: merged'
            assert dispatcher.merge('i1') is None
            now[0] += 600
            assert dispatcher.merge('i1').result(10) == 'merge: merged'
        finally:
            dispatcher.shutdown()
        sample = worker.metrics.registry.get_sample_value
        assert sample('yolo_worker_merges_total', {'outcome': 'merged'}) == 2
