"""Lets the scripts beside it run from a checkout: the product, the benchmarks and the test
support importable ahead of any installed copy."""

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
for path in (REPO, REPO / 'bench', REPO / 'testing'):
    sys.path.insert(0, str(path))
