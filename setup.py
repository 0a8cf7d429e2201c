"""Packages for setuptools (metadata is in pyproject.toml): the code, plus conf/ and sweeps/ mapped into swinexp."""
from setuptools import find_namespace_packages, setup

RESOURCES = {"swinexp._conf": "conf", "swinexp._sweeps": "sweeps"}  # package inside the wheel -> repository folder
CODE = find_namespace_packages(include=["swinexp*", "hydra_plugins*"], exclude=["*__pycache__"])  # hydra_plugins: no __init__

setup(packages=[*CODE, *RESOURCES], package_dir=RESOURCES)
