"""What the project's command-line tools share: help that shows defaults, and arguments checked
before any work starts (a missing file is a usage error, not a traceback)."""

import argparse
import pathlib


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default."""


def existing_file(value):
    """An argparse type: the path of a file that exists."""
    path = pathlib.Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError('%s: no such file' % value)
    return path
