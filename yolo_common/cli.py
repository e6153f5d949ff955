"""What the project's command-line tools share: help that shows defaults, and arguments checked
before any work starts (a missing file is a usage error, not a traceback)."""

import argparse
import pathlib
import re


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default."""


def existing_file(value):
    """An argparse type: the path of a file that exists."""
    path = pathlib.Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError('%s: no such file' % value)
    return path


def console_pattern(text):
    """An argparse type: a regular expression over a guest's serial console (bytes)."""
    try:
        return re.compile(text.encode())
    except re.error as e:
        raise argparse.ArgumentTypeError('not a regular expression: %s' % e)
