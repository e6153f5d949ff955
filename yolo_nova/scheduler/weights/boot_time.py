"""YoloBootTimeWeigher: prefers hosts where a new VM is predicted to boot faster, with what each
must fetch first: a host that holds the image gains the time its download would take.

With a positive multiplier (the default, ``[yolo] boot_time_weight_multiplier``), the lower a
host's predicted boot time, the higher its weight; a negative multiplier prefers slow hosts; 0
turns the weigher off. Hosts without current YOLO data weigh as the slowest host that has some.
"""

from nova.scheduler import utils as scheduler_utils
from nova.scheduler import weights

from yolo_nova.scheduler import utils

CONF = utils.CONF


class YoloBootTimeWeigher(weights.BaseHostWeigher):
    """Prefer hosts with a lower predicted boot time."""

    def weight_multiplier(self, host_state):
        return scheduler_utils.get_weight_multiplier(
            host_state, 'yolo_boot_time_weight_multiplier',
            CONF.yolo.boot_time_weight_multiplier)

    def weigh_objects(self, weighed_obj_list, weight_properties):
        if not any(self.weight_multiplier(w.obj) for w in weighed_obj_list):
            return [0.0] * len(weighed_obj_list)
        predicted = [p.total if p is not None else None for p, _ in utils.request_predictions(
            weight_properties, [w.obj for w in weighed_obj_list])]
        slowest = max((t for t in predicted if t is not None), default=0.0)
        # Higher weights win: the negated boot time, which Nova then normalises to 0..1.
        return [-(t if t is not None else slowest) for t in predicted]

    def _weigh_object(self, host_state, weight_properties):
        [(predicted, _)] = utils.request_predictions(weight_properties, [host_state])
        return -predicted.total if predicted is not None else 0.0
