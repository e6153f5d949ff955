"""The package's declared dependencies (its wheel's Requires-Dist, as installed) are exactly
what its code imports: a fresh venv gets everything the product needs and nothing it does not.
"""

import ast
import configparser
import importlib.metadata
import pathlib
import re
import sys

from packaging.requirements import Requirement

REPO = pathlib.Path(__file__).parents[2]
DISTRIBUTION = 'yolo-openstack'
# The services YOLO runs inside (nova-compute, nova-scheduler, glance-api): never pulled in.
HOST_SERVICES = {'nova', 'glance'}
# Needed to build and version the package, imported by no module.
BUILD_ONLY = {'pbr'}
# What runs on compute, scheduler and Glance nodes, and their CLIs: no benchmark, no test code
# (bench/ and testing/ are projects of their own).
PRODUCT_PACKAGES = {'yolo_common', 'yolo_nova', 'yolo_glance', 'yolo_client'}


def normalized(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def wheel_packages():
    setup = configparser.ConfigParser()
    setup.read(REPO / 'setup.cfg')
    return setup['files']['packages'].split()


def imported_distributions(package, own):
    """Distributions (normalized names) whose modules ``package`` imports, outside the
    standard library and the project."""
    providers = importlib.metadata.packages_distributions()
    found = set()
    for path in (REPO / package).rglob('*.py'):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split('.')[0]
                if top in sys.stdlib_module_names or top in own:
                    continue
                assert top in providers, '%s imports %s, which no installed package provides' \
                    % (path.relative_to(REPO), top)
                found.update(normalized(d) for d in providers[top])
    return found


def declared():
    """{extra or None: {normalized distribution}} of the installed wheel's Requires-Dist."""
    by_extra = {}
    for line in importlib.metadata.requires(DISTRIBUTION) or ():
        requirement = Requirement(line)
        extra = None
        if requirement.marker is not None:
            extra = re.search(r'extra\s*==\s*"([^"]+)"', str(requirement.marker)).group(1)
        by_extra.setdefault(extra, set()).add(normalized(requirement.name))
    return by_extra


def test_the_wheel_requires_what_the_code_imports_and_nothing_else():
    packages = wheel_packages()
    assert set(packages) == PRODUCT_PACKAGES
    requires = declared()
    base = requires[None]
    imported = set()
    for package in packages:
        needed = imported_distributions(package, set(packages)) - HOST_SERVICES
        # google-re2 is optional (the worker matches images' patterns as plain text without).
        allowed = base | requires.get('re2', set())
        assert needed <= allowed, '%s imports undeclared %s' % (package, needed - allowed)
        imported |= needed
    assert base - BUILD_ONLY <= imported, 'declared, never imported: %s' % (
        base - BUILD_ONLY - imported)
    assert requires['re2'] == {'google-re2'}
