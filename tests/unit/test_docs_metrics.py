"""Every Prometheus metric the docs name is one that yolofs or the Glance worker serves, so that
an alert or a dashboard built from the docs matches a series.

What is served:

- the worker's metrics: those of ``yolo_glance.metrics.Metrics()``, read from its registry:
  every sample name (``_total`` and ``_created`` of counters; ``_bucket``, ``_count``, ``_sum``
  and ``_created`` of histograms; a gauge's own name);
- yolofs' metrics: the names yolofs/src/metrics.rs registers, read from its source, with the
  suffixes prometheus-client's text encoder writes: a counter's samples are ``NAME_total``, a
  histogram's ``NAME_bucket``, ``NAME_count`` and ``NAME_sum``, a gauge's ``NAME`` (it sends no
  ``_created``).

What the docs name: every ``yolofs_*`` and ``yolo_worker_*`` token (the metrics' two
namespaces) in README.md, docs/**/*.md (the write-ups of docs/evaluation/ among them),
bench/README.md, etc/ (the Grafana dashboard, the systemd units, the configuration samples) and
the release notes. Not metrics, and so not checked:

- names outside those two namespaces: the scheduler's stats keys (``yolo_io_utilisation``,
  ``yolo_boot_images``...), image properties (``yolo_boot_image_id``...), ``[yolo_worker]``
  and other options;
- options of the code's own (oslo.config's ``yolo_nova`` and ``yolo_glance`` namespaces) that
  happen to start with ``yolofs_`` (``yolofs_binary``);
- file names: a token followed by an extension (``yolofs_bench.py``).

A token names a served sample, or a histogram by its family name (``yolofs_read_seconds``: a
query must add one of its suffixes, and all of them are served). A counter is named with its
``_total``: its family name alone is no series, and an alert on it would match nothing.
"""

import collections
import importlib
import pathlib
import re

import pytest

from yolo_glance import metrics as worker_metrics

REPO = pathlib.Path(__file__).resolve().parents[2]
METRICS_RS = REPO / 'yolofs' / 'src' / 'metrics.rs'

TOKEN = re.compile(r'(?<![\w-])((?:yolofs|yolo_worker)_[a-z0-9_]*[a-z0-9])(?!\w|\.[A-Za-z])')
SUFFIXES = {
    'counter': ('_total',),
    'histogram': ('_bucket', '_count', '_sum'),
    'gauge': ('',),
}
# A Rust string literal: its body, escapes included.
STRING = r'"(?:[^"\\]|\\.)*"'
# How metrics.rs registers its metrics (its helpers `single`, `counters`, `gauges`, and a
# histogram's descriptor), each with the type it gives the metric.
RUST_REGISTRATIONS = (
    (re.compile(r'\bcounters\(\s*e,\s*"(\w+)"'), lambda match: 'counter'),
    (re.compile(r'\bgauges\(\s*e,\s*"(\w+)"'), lambda match: 'gauge'),
    (re.compile(r'\bsingle\(\s*e,\s*"(\w+)",\s*' + STRING + r',\s*Const(Counter|Gauge)::'),
     lambda match: match.group(2).lower()),
    (re.compile(r'\bencode_descriptor\(\s*"(\w+)",\s*' + STRING
                + r',\s*None,\s*MetricType::(Counter|Gauge|Histogram)\b'),
     lambda match: match.group(2).lower()),
)


def doc_files():
    files = [REPO / 'README.md', REPO / 'bench' / 'README.md']
    files += sorted((REPO / 'docs').rglob('*.md'))
    files += sorted(p for p in (REPO / 'etc').rglob('*') if p.is_file())
    files += sorted((REPO / 'releasenotes' / 'notes').glob('*.yaml'))
    return files


def yolofs_families(source):
    """{name: type} of the metrics metrics.rs registers."""
    families = {}
    for pattern, kind in RUST_REGISTRATIONS:
        for match in pattern.finditer(source):
            families[match.group(1)] = kind(match)
    return families


def worker_families():
    """{name: (type, sample names)} of the worker's metrics."""
    return {family.name: (family.type, {sample.name for sample in family.samples})
            for family in worker_metrics.Metrics().registry.collect()}


def served():
    """The names a doc may use: each sample name, and each histogram's family name."""
    names = set()
    for name, kind in yolofs_families(METRICS_RS.read_text()).items():
        names.update(name + suffix for suffix in SUFFIXES[kind])
        if kind == 'histogram':
            names.add(name)
    for name, (kind, samples) in worker_families().items():
        names.update(samples)
        names.update(name + suffix for suffix in SUFFIXES.get(kind, ()))
        if kind == 'histogram':
            names.add(name)
    return names


def option_names():
    """The names of the code's own options, in every group."""
    names = set()
    for module in ('yolo_nova.conf', 'yolo_glance.conf'):
        for _, opts in importlib.import_module(module).list_opts():
            names.update(opt.dest for opt in opts)
    return names


def named(text):
    """The metric names ``text`` mentions: {name: [line numbers]}."""
    found = collections.defaultdict(list)
    for number, line in enumerate(text.splitlines(), 1):
        for match in TOKEN.finditer(line):
            found[match.group(1)].append(number)
    return found


def unknown_metrics(text, served_names, options):
    """{name: [line numbers]} of the metrics ``text`` names that nothing serves."""
    return {name: lines for name, lines in named(text).items()
            if name not in served_names and name not in options}


def test_yolofs_metrics_are_read_from_its_source():
    source = METRICS_RS.read_text()
    families = yolofs_families(source)
    # Every metric name the source spells out was understood: a new way of registering one
    # must be taught to RUST_REGISTRATIONS, not skipped.
    literals = set(re.findall(r'"(yolofs_\w+)"', source))
    assert literals == set(families), literals ^ set(families)
    assert families['yolofs_up'] == 'gauge'
    assert families['yolofs_read_bytes'] == 'counter'
    assert families['yolofs_boot_image_loads'] == 'counter'
    assert families['yolofs_read_seconds'] == 'histogram'
    assert families['yolofs_touch_safety'] == 'gauge'


def test_worker_metrics_are_read_from_its_registry():
    names = served()
    assert {'yolo_worker_builds_started_total', 'yolo_worker_build_duration_seconds_bucket',
            'yolo_worker_build_duration_seconds', 'yolo_worker_backlog_jobs'} <= names
    assert 'yolo_worker_builds_started' not in names


def test_every_metric_the_docs_name_is_served():
    paths = doc_files()
    assert REPO / 'docs' / 'operations.md' in paths
    assert REPO / 'docs' / 'evaluation' / 'benchmarks.md' in paths
    names, options = served(), option_names()
    wrong = ['%s:%d: %s' % (path.relative_to(REPO), line, name)
             for path in paths
             for name, lines in sorted(unknown_metrics(
                 path.read_text(errors='replace'), names, options).items())
             for line in lines]
    assert not wrong, 'metrics neither yolofs nor the worker serves:\n' + '\n'.join(wrong)


def test_the_docs_name_metrics_at_all():
    # The check above passes on docs it cannot read: the metrics' tables are there to check.
    mentioned = set()
    for path in doc_files():
        mentioned.update(named(path.read_text(errors='replace')))
    assert {'yolofs_read_bytes_total', 'yolo_worker_builds_finished_total'} <= mentioned


@pytest.mark.parametrize('text, wrong', [
    ('`yolofs_store_rejections_total{reason}` counts them', ['yolofs_store_rejections_total']),
    ('alert on `yolofs_read_bytes` (a counter without its suffix)', ['yolofs_read_bytes']),
    ('`yolo_worker_builds_started` (the same)', ['yolo_worker_builds_started']),
    ('`yolofs_read_seconds`, `yolofs_read_seconds_bucket`, `yolofs_fuse_errors_total`', []),
    ('`yolo_worker_build_duration_seconds_sum` and `yolo_worker_backlog_jobs`', []),
    ('[yolo] `yolofs_binary`, bench/scripts/yolofs_bench.py, `yolo_io_utilisation`', []),
    ('yolofs_up.', []),
])
def test_a_doc_naming_an_unserved_metric_fails(text, wrong):
    assert sorted(unknown_metrics(text, served(), option_names())) == wrong
