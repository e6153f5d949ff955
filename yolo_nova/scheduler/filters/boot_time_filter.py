"""YoloBootFilter: discards hosts where a new VM would boot too slowly."""

import logging as std_logging

from oslo_log import log as logging

from nova.scheduler import filters
from nova.scheduler import utils as scheduler_utils

from yolo_nova.model import prediction
from yolo_nova.scheduler import utils

LOG = logging.getLogger(__name__)
CONF = utils.CONF


class YoloBootFilter(filters.BaseHostFilter):
    """Discard hosts whose predicted boot time is over the absolute or relative limit."""

    # A rebuild stays on its host: there is no other host to prefer.
    RUN_ON_REBUILD = False

    def filter_all(self, filter_obj_list, spec_obj):
        # The relative limit needs every candidate's prediction before deciding on any.
        hosts = list(filter_obj_list)
        image_id = utils.requested_image_id(spec_obj)
        # A volume-backed server boots from its volume: no host's prediction says anything.
        if scheduler_utils.request_is_rebuild(spec_obj) or not image_id:
            return hosts
        predictions = [utils.predict(host, image_id) for host in hosts]
        known = [t for t, _ in predictions if t is not None]
        best = min(known) if known else None
        return [host for host, (predicted, state) in zip(hosts, predictions)
                if self._passes(host, predicted, state, best, image_id)]

    def host_passes(self, host_state, spec_obj):
        image_id = utils.requested_image_id(spec_obj)
        if not image_id:
            return True
        predicted, state = utils.predict(host_state, image_id)
        return self._passes(host_state, predicted, state, predicted, image_id)

    def _passes(self, host_state, predicted, state, best, image_id):
        if predicted is None:
            passes = CONF.yolo.pass_hosts_without_data
            LOG.debug("%(host)s reports no current YOLO data: %(verdict)s",
                      {'host': host_state, 'verdict': 'passes' if passes else 'rejected'})
            return passes
        limit = CONF.yolo.max_predicted_boot_time
        ratio = CONF.yolo.max_boot_time_ratio
        too_slow = bool(limit) and predicted > limit
        far_behind = bool(ratio) and best is not None and predicted > ratio * best
        if not LOG.isEnabledFor(std_logging.DEBUG):
            return not (too_slow or far_behind)
        LOG.debug("%(host)s: predicted boot %(t).1fs (io %(x).2f, cpu %(y).2f, cpu pressure "
                  "%(p)s, boot image %(bi)s, boots in progress %(n)s; best %(best).1fs, limit "
                  "%(limit)s, ratio %(ratio)s): %(verdict)s",
                  {'host': host_state, 't': predicted, 'x': state.io_utilisation,
                   'y': state.cpu_utilisation,
                   'p': 'unknown' if state.cpu_pressure is None
                   else '%.2f' % prediction.clamp(state.cpu_pressure),
                   'bi': image_id in state.boot_images,
                   'n': host_state.num_io_ops, 'best': best, 'limit': limit, 'ratio': ratio,
                   'verdict': 'rejected' if too_slow or far_behind else 'passes'})
        return not (too_slow or far_behind)
