"""runtime.gc_pause: the collector paused around a job's imports, what they created frozen, the collector back on."""
from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from swinexp.runtime.gc_pause import long_lived_imports


@pytest.fixture(autouse=True)
def _collector_as_before() -> Iterator[None]:
    """Each test starts with nothing frozen and leaves the collector as it found it."""
    enabled = gc.isenabled()
    gc.unfreeze()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_no_collection_inside_then_everything_alive_is_frozen_and_collection_resumes() -> None:
    gc.enable()
    with long_lived_imports("no_module_of_that_name"):
        assert not gc.isenabled()
        made = [_Node() for _ in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(made)
    tracked = {id(o) for g in range(3) for o in gc.get_objects(generation=g)}
    assert not tracked & {id(n) for n in made}  # out of every generation: no collection walks them again


def test_an_exception_inside_still_freezes_and_re_enables() -> None:
    gc.enable()
    with pytest.raises(ImportError), long_lived_imports("no_module_of_that_name"):
        raise ImportError("no module named x")
    assert gc.isenabled() and gc.get_freeze_count() > 0


def test_a_collector_the_caller_had_disabled_stays_disabled() -> None:
    gc.disable()
    with long_lived_imports("no_module_of_that_name"):
        pass
    assert not gc.isenabled()


def test_a_module_imported_already_leaves_the_collector_alone() -> None:
    """A sweep's second job in the same process: freezing would keep the first job's garbage for good."""
    gc.enable()
    with long_lived_imports("gc"):
        assert gc.isenabled()
    assert gc.get_freeze_count() == 0
