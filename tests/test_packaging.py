"""The distribution's package list against the source tree: a package left out of
``pyproject.toml`` is missing from every non-editable install (wheels, Docker images,
Binder), where editable installs and this test suite still find it."""

from __future__ import annotations

import os
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_source_package_is_in_the_distribution() -> None:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        tool = tomllib.load(f)["tool"]["setuptools"]
    listed = set(tool["packages"])
    dirs = tool["package-dir"]
    on_disk = set()
    for name, top in dirs.items():
        for here, subdirs, files in os.walk(os.path.join(ROOT, top)):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            if "__init__.py" not in files:
                continue
            rel = os.path.relpath(here, os.path.join(ROOT, top))
            pkg = name if rel == "." else name + "." + rel.replace(os.sep, ".")
            # A sub-directory mapped on its own (lumos.kernelext) is walked under its own name.
            if not any(pkg != other and (pkg + ".").startswith(other + ".") and len(other) > len(name)
                       for other in dirs):
                on_disk.add(pkg)
    assert on_disk - listed == set(), "packages missing from pyproject.toml's [tool.setuptools] packages"
    assert listed - on_disk == set(), "packages listed in pyproject.toml with no __init__.py"
