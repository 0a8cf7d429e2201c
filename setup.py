"""Packages for setuptools (metadata is in pyproject.toml): the code, plus conf/ and sweeps/ mapped into swinexp."""
from pathlib import Path

from setuptools import find_namespace_packages, setup

CONF = "conf"  # repository folder, shipped as the package swinexp._conf (swinexp.config.resource_dir)
# every folder of conf/ as a package of its own: setuptools warns, once per folder, about a folder under a listed
# package that is not listed itself (the yaml files would be shipped either way)
RESOURCES = ["swinexp._conf", *sorted("swinexp._conf." + ".".join(d.relative_to(CONF).parts)
                                      for d in Path(CONF).rglob("*") if d.is_dir() and d.name != "__pycache__")]
# namespace packages: hydra_plugins has no __init__.py (Hydra's plugin discovery scans it)
CODE = find_namespace_packages(include=["swinexp*", "hydra_plugins*"], exclude=["*__pycache__"])

SWEEPS = "sweeps"  # the named sweeps, shipped as swinexp._sweeps (served as the group `sweep`, hydra_plugins)

setup(packages=[*CODE, *RESOURCES, "swinexp._sweeps"], package_dir={"swinexp._conf": CONF, "swinexp._sweeps": SWEEPS})
