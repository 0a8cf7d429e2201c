"""Packages for setuptools (metadata is in pyproject.toml): the code, plus conf/ mapped into swinexp."""
from setuptools import find_namespace_packages, setup

RESOURCES = {"swinexp._conf": "conf"}  # package inside the wheel -> repository folder
# namespace packages: hydra_plugins has no __init__.py (Hydra's plugin discovery scans it)
CODE = find_namespace_packages(include=["swinexp*", "hydra_plugins*"], exclude=["*__pycache__"])

setup(packages=[*CODE, *RESOURCES], package_dir=RESOURCES)
