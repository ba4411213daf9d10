"""Build configuration lives in pyproject.toml; this file only repairs editable installs.

setuptools' editable wheels install data files only when the distribution answers
``has_data()``, a method it never defines (it has ``has_data_files``), so
``pip install -e .`` skipped ``etc/jupyter/jupyter_server_config.d/lumos.dashboard.json``
and Jupyter never loaded the dashboard extension. Answering it installs the file in
editable installs as in wheels.
"""

from setuptools import setup
from setuptools.dist import Distribution


class _Distribution(Distribution):
    def has_data(self) -> bool:
        return self.has_data_files()


setup(distclass=_Distribution)
