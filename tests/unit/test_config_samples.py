"""The etc/*.conf.sample files are what oslo-config-generator makes of the options in the code.

Each sample is generated in-process from its etc/oslo-config-generator/ file, as ``tox -e
genconfig`` does, and compared with the file. YOLO's namespaces come from setup.cfg's entry points
and the checkout's code, whatever copy of the package is installed. The options of the libraries
a sample also lists (oslo.messaging's and oslo.log's in the worker's) change with their releases,
not with this code: only YOLO's namespaces are compared line by line.
"""

import configparser
import difflib
import importlib
import io
import pathlib
from unittest import mock

from oslo_config import cfg
from oslo_config import generator
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
GENERATOR_CONFIGS = sorted((REPO / 'etc' / 'oslo-config-generator').glob('*.conf'))


def own_namespaces():
    """setup.cfg's ``oslo.config.opts`` entry points: namespace -> list_opts function."""
    setup = configparser.ConfigParser()
    setup.read(REPO / 'setup.cfg')
    functions = {}
    for line in setup['entry_points']['oslo.config.opts'].strip().splitlines():
        name, target = (part.strip() for part in line.split('='))
        module, function = target.split(':')
        functions[name] = getattr(importlib.import_module(module), function)
    return functions


def generate(config_file):
    """The sample oslo-config-generator writes for ``config_file``, and its output file."""
    conf = cfg.ConfigOpts()
    generator.register_cli_opts(conf)
    conf(['--config-file', str(config_file)], default_config_files=[], default_config_dirs=[])
    own = own_namespaces()
    installed = generator._get_raw_opts_loaders

    # oslo-config-generator's lookup of namespaces, with YOLO's read from this checkout.
    def loaders(namespaces):
        return ([(name, own[name]) for name in namespaces if name in own]
                + installed([name for name in namespaces if name not in own]))

    output = io.StringIO()
    with mock.patch.object(generator, '_get_raw_opts_loaders', loaders):
        generator.generate(conf, output_file=output)
    return output.getvalue(), REPO / conf.output_file


def blocks(sample, namespaces):
    """A sample's lines by group and namespace (``# From NAMESPACE``), for the given ones."""
    found = {}
    group = namespace = None
    for line in sample.splitlines():
        if line.startswith('['):
            group, namespace = line, None
        elif line.startswith('# From '):
            namespace = line[len('# From '):]
        elif namespace in namespaces:
            found.setdefault((group, namespace), []).append(line)
    # The blank and '#' lines that close a block depend on what follows it.
    for lines in found.values():
        while lines and lines[-1] in ('', '#'):
            lines.pop()
    return found


def namespaces(sample):
    return {line[len('# From '):] for line in sample.splitlines() if line.startswith('# From ')}


def lines(found):
    """The blocks as one list of lines, each under its group and namespace."""
    return [line for key in sorted(found) for line in ['%s # From %s' % key, *found[key]]]


def test_every_sample_has_a_generator_config():
    samples = {path.name for path in (REPO / 'etc').glob('*.conf.sample')}
    # Not an oslo.config file: Glance's property protections.
    samples.discard('glance-property-protections.conf.sample')
    assert {config.stem + '.conf.sample' for config in GENERATOR_CONFIGS} == samples


@pytest.mark.parametrize('config', GENERATOR_CONFIGS, ids=lambda path: path.stem)
def test_sample_is_up_to_date(config):
    expected, path = generate(config)
    assert path == REPO / 'etc' / (config.stem + '.conf.sample')
    actual = path.read_text() if path.exists() else ''
    own = set(own_namespaces())
    stale = '%s is stale: regenerate the samples with `tox -e genconfig`' % (
        path.relative_to(REPO))
    # Every namespace of the generator config is in the sample, YOLO's line by line.
    assert namespaces(actual) == namespaces(expected), stale
    want, have = lines(blocks(expected, own)), lines(blocks(actual, own))
    assert want == have, stale + '\n' + '\n'.join(
        difflib.unified_diff(have, want, str(path.name), 'generated', lineterm=''))


def test_every_option_yolo_configure_writes_for_the_worker_is_in_its_sample(
        tmp_path, monkeypatch):
    """The worker's configuration file is YOLO's own: its sample documents all of it."""
    from yolo_common import configure
    monkeypatch.setattr('sys.stdin', io.StringIO('pw\n'))
    path = tmp_path / 'yolo-glance-worker.conf'
    assert configure.main([
        'worker', '--config-file', str(path), '--transport-url', 'rabbit://u:p@h:5672/',
        '--auth-url', 'http://k:5000', '--username', 'yolo', '--password-stdin',
        '--region-name', 'RegionOne', '--work-dir', str(tmp_path / 'work'),
        '--yolofs-binary', '/usr/local/bin/yolofs',
        '--signing-key-file', str(tmp_path / 'signing.key')]) == 0
    documented, section = set(), None
    for line in (REPO / 'etc' / 'yolo-glance-worker.conf.sample').read_text().splitlines():
        if line.startswith('['):
            section = line.strip('[]')
        elif line.startswith('#') and ' = ' in line and ' ' not in line.split(' = ')[0]:
            documented.add((section, line[1:].split(' = ')[0]))
    written = configure.ConfigFile(str(path))
    options = {(section, key) for section in ('DEFAULT', 'glance', 'yolo_worker', 'yolo_profiling')
               for _, key, _ in written._options(section)[0]}
    assert options and options <= documented, options - documented
