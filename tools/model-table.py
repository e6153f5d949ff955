#!/usr/bin/env python3
"""The boot-time model's parameter table in docs/scheduling.md, generated from the code's table
(yolo_nova/model/parameters.py, PARAMETERS).

    python tools/model-table.py            # prints the markdown table
    python tools/model-table.py --write    # puts it in docs/scheduling.md, between its markers

tests/unit/test_model_table_doc.py fails when the doc's table differs from what this prints;
``tox -e genconfig`` rewrites it, as it does the configuration samples.
"""

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
DOC = REPO / 'docs' / 'scheduling.md'
BEGIN = '<!-- model-table begin -->'
END = '<!-- model-table end -->'
HEADER = ('parameter', 'meaning', 'bounds', 'default', 'stats key', '`[yolo]` option',
          'aggregate key', 'learned or measured')


def _parameters():
    # The checkout's table, whatever copy of the package is installed.
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from yolo_nova.model import parameters
    return parameters.PARAMETERS


def _code(value):
    return '`%s`' % value if value else '-'


def _cell(text):
    return str(text).replace('|', '\\|')


def _source(parameter):
    kinds = [kind for kind, flag in (('measured', parameter.measured),
                                     ('learned', parameter.learned)) if flag]
    return ', '.join(kinds) or '-'


def rows():
    """One list of cells per parameter, in the table's order."""
    return [[_code(p.name), _cell(p.meaning), '%g to %g' % p.bounds, '%g' % p.default,
             _code(p.stats_key), _code(p.option), _code(p.aggregate_key), _source(p)]
            for p in _parameters()]


def table():
    """The markdown table, a line a parameter, ending with a newline."""
    lines = ['| %s |' % ' | '.join(HEADER), '|%s' % ('---|' * len(HEADER))]
    lines += ['| %s |' % ' | '.join(cells) for cells in rows()]
    return '\n'.join(lines) + '\n'


def _bounds(text):
    begin, end = text.find(BEGIN), text.find(END)
    if begin < 0 or end < begin or text.count(BEGIN) != 1 or text.count(END) != 1:
        raise ValueError('the doc has no single pair of markers %s ... %s' % (BEGIN, END))
    return begin + len(BEGIN), end


def section(text):
    """What the doc ``text`` holds between its markers, as table() prints it."""
    begin, end = _bounds(text)
    return text[begin:end].strip('\n') + '\n'


def replace(text, generated):
    """``text`` with ``generated`` between its markers, a blank line on each side."""
    begin, end = _bounds(text)
    return text[:begin] + '\n\n' + generated + '\n' + text[end:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--write', action='store_true',
                        help='put the table in the doc (%s) instead of printing it'
                        % DOC.relative_to(REPO))
    parser.add_argument('--doc', type=pathlib.Path, default=DOC, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    generated = table()
    if not args.write:
        sys.stdout.write(generated)
        return 0
    text = args.doc.read_text()
    updated = replace(text, generated)
    if updated != text:
        args.doc.write_text(updated)
        print('%s: parameter table updated' % args.doc)
    return 0


if __name__ == '__main__':
    sys.exit(main())
