"""The Glance import plugin that marks uploads for the worker."""

from unittest import mock

from yolo_glance import glance as glance_api
from yolo_glance import import_plugin


class TestImportPlugin:

    def run_flow(self, action_wrapper):
        flow = import_plugin.get_flow(task_id='t1', task_type='api_image_import',
                                      action_wrapper=action_wrapper)
        for task in flow:
            task.execute()

    def test_marks_the_image_pending(self):
        wrapper = mock.MagicMock()
        self.run_flow(wrapper)
        wrapper.__enter__.return_value.set_image_extra_properties.assert_called_once_with(
            {glance_api.STATUS: 'pending'})

    def test_never_fails_the_import(self):
        wrapper = mock.MagicMock()
        wrapper.__enter__.side_effect = RuntimeError('image is locked')
        self.run_flow(wrapper)
