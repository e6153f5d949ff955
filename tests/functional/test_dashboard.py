"""The Grafana dashboard (etc/grafana): in Grafana's provisioning format, and naming only
metrics that yolofs and the worker serve."""

import json
import pathlib
import re
import urllib.request

from prometheus_client.openmetrics import exposition
from prometheus_client.openmetrics import parser as openmetrics
import yaml

from yolo_glance import metrics as worker_metrics

GRAFANA = pathlib.Path(__file__).resolve().parents[2] / 'etc' / 'grafana'
METRIC = re.compile(r'\b(yolo(?:fs|_worker)_[a-z_]+)')


def dashboard():
    return json.loads((GRAFANA / 'yolo-dashboard.json').read_text())


def panels():
    return [p for p in dashboard()['panels'] if p['type'] != 'row']


SUFFIXES = {'counter': ('_total',), 'histogram': ('_bucket', '_sum', '_count'), 'gauge': ('',)}


def sample_names(text):
    """The names of the samples a scrape's ``text`` has or would have (a family declared
    without samples yet: a counter never incremented, say)."""
    return {family.name + suffix for family in openmetrics.text_string_to_metric_families(text)
            for suffix in SUFFIXES.get(family.type, ('',))}


def test_the_provisioning_file_names_a_file_provider():
    provisioning = yaml.safe_load((GRAFANA / 'provisioning.yaml').read_text())
    assert provisioning['apiVersion'] == 1
    [provider] = provisioning['providers']
    assert provider['type'] == 'file' and provider['options']['path'].startswith('/')


def test_the_dashboard_is_one_grafana_provisions():
    board = dashboard()
    assert re.fullmatch(r'[a-z0-9-]{1,40}', board['uid'])
    assert board['title'] and isinstance(board['schemaVersion'], int)
    variables = {v['name'] for v in board['templating']['list']}
    assert {'datasource', 'instance'} <= variables
    taken = set()
    for panel in board['panels']:
        grid = panel['gridPos']
        assert 0 <= grid['x'] and grid['x'] + grid['w'] <= 24, panel['title']
        cells = {(grid['x'] + dx, grid['y'] + dy)
                 for dx in range(grid['w']) for dy in range(grid['h'])}
        assert not cells & taken, 'panels overlap at %s' % panel['title']
        taken |= cells
    for panel in panels():
        assert panel['datasource']['uid'] == '${datasource}'
        ref_ids = [t['refId'] for t in panel['targets']]
        assert panel['targets'] and len(set(ref_ids)) == len(ref_ids), panel['title']
        for target in panel['targets']:
            assert target['expr'].count('(') == target['expr'].count(')'), target['expr']
            # Every series a host's panel shows is that host's.
            for name in METRIC.findall(target['expr']):
                if name.startswith('yolofs_'):
                    assert re.search(name + r'\{instance=~"\$instance"', target['expr']), \
                        target['expr']


def test_the_dashboard_names_only_metrics_that_are_served(mount_factory, tmp_path):
    base = tmp_path / '_base'
    base.mkdir()
    (base / 'disk').write_bytes(b'x' * 4096)
    mount = mount_factory(base, metrics_address='127.0.0.1:0', no_kernel_passthrough=True)
    assert (mount.mountpoint / 'disk').read_bytes() == b'x' * 4096
    url = re.search(r'metrics on (http://\S+)', mount.log_path.read_text()).group(1)
    with urllib.request.urlopen(url, timeout=10) as response:
        served = sample_names(response.read().decode())
    served |= sample_names(exposition.generate_latest(worker_metrics.Metrics().registry).decode())
    named = {name for panel in panels() for target in panel['targets']
             for name in METRIC.findall(target['expr'])}
    assert named and named <= served, named - served
