"""Glance image import plugin ``yolo_boot_image``: marks imported images as awaiting a boot image.

Import plugins run inside glance-api and any exception reverts the import, so this one does only
the cheap, safe part (a property) and never raises; ``yolo-glance-worker`` does the work when the
image becomes active. Enable it in glance-image-import.conf::

    [image_import_opts]
    image_import_plugins = ['yolo_boot_image']
"""

import logging

from taskflow.patterns import linear_flow
from taskflow import task

from yolo_common.contract import PENDING
from yolo_common.contract import STATUS

LOG = logging.getLogger(__name__)


class _MarkPending(task.Task):

    def __init__(self, task_id, task_type, action_wrapper):
        self.action_wrapper = action_wrapper
        super().__init__(name='%s-YoloBootImage-%s' % (task_type, task_id))

    def execute(self):
        try:
            with self.action_wrapper as action:
                action.set_image_extra_properties({STATUS: PENDING})
        except Exception:
            # A boot image only makes boots faster: it must never fail an import.
            LOG.exception('Could not mark image %s as awaiting a boot image',
                          getattr(self.action_wrapper, 'image_id', '?'))


def get_flow(**kwargs):
    return linear_flow.Flow(kwargs.get('task_type')).add(
        _MarkPending(kwargs.get('task_id'), kwargs.get('task_type'),
                     kwargs.get('action_wrapper')))
