"""docs/scheduling.md's parameter table is what tools/model-table.py makes of the model's table
(yolo_nova/model/parameters.py, PARAMETERS), as the configuration samples are what
oslo-config-generator makes of the options (test_config_samples.py)."""

import difflib
import importlib.util
import pathlib

import pytest

from yolo_nova.model import parameters

REPO = pathlib.Path(__file__).resolve().parents[2]
DOC = REPO / 'docs' / 'scheduling.md'
REGENERATE = 'python tools/model-table.py --write'


def _generator():
    spec = importlib.util.spec_from_file_location('model_table',
                                                  REPO / 'tools' / 'model-table.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


model_table = _generator()


def test_the_doc_table_is_up_to_date():
    generated = model_table.table()
    documented = model_table.section(DOC.read_text())
    assert documented == generated, (
        '%s: its parameter table is stale: regenerate it with `%s` (or `tox -e genconfig`)\n%s' % (
            DOC.relative_to(REPO), REGENERATE, '\n'.join(difflib.unified_diff(
                documented.splitlines(), generated.splitlines(), 'docs/scheduling.md',
                'generated', lineterm=''))))


def test_the_table_has_a_row_per_parameter_in_order():
    lines = model_table.table().splitlines()
    assert lines[0].startswith('| parameter | meaning | bounds | default | stats key |')
    names = [line.split('|')[1].strip().strip('`') for line in lines[2:]]
    assert names == [p.name for p in parameters.PARAMETERS]


def test_a_row_says_what_the_table_declares():
    rows = {cells[0]: cells for cells in model_table.rows()}
    assert rows['`alpha`'] == [
        '`alpha`', parameters.BY_NAME['alpha'].meaning, '0 to 86400', '5.9', '`yolo_alpha`',
        '`boot_time_alpha`', '`yolo_boot_time_alpha`', 'measured, learned']
    assert rows['`cpus`'][5:] == ['-', '-', 'measured']
    assert rows['`io_exponent`'][5:] == ['`io_exponent`', '-', '-']
    assert rows['`io_pole`'][7] == 'learned'


def test_a_stale_table_is_told_apart_and_rewritten():
    text = 'before\n%s\n\n| old |\n\n%s\nafter\n' % (model_table.BEGIN, model_table.END)
    assert model_table.section(text) == '| old |\n'
    updated = model_table.replace(text, model_table.table())
    assert model_table.section(updated) == model_table.table()
    assert updated.startswith('before\n%s\n\n|' % model_table.BEGIN)
    assert updated.endswith('|\n\n%s\nafter\n' % model_table.END)
    assert model_table.replace(updated, model_table.table()) == updated


def test_writing_the_doc_changes_nothing_when_it_is_up_to_date(tmp_path):
    doc = tmp_path / 'scheduling.md'
    doc.write_text(DOC.read_text())
    assert model_table.main(['--write', '--doc', str(doc)]) == 0
    assert doc.read_text() == DOC.read_text()


@pytest.mark.parametrize('text', [
    'no markers at all\n',
    '%s\n| a |\n' % '<!-- model-table begin -->',
    '<!-- model-table end -->\n<!-- model-table begin -->\n',
])
def test_a_doc_without_its_markers_is_refused(text):
    with pytest.raises(ValueError):
        model_table.section(text)
