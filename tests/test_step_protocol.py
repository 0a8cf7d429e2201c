"""The real train step and every stand-in for it implement `TrainStepLike`, and the protocol is what the loop uses:
a member the loop starts to use fails here until the protocol, the real step and each stand-in have it."""
from __future__ import annotations

import ast
import inspect

import pytest

from benchmarks.host_overhead import StubStep
from swinexp.engine import loop
from swinexp.engine.step import TrainStep
from swinexp.engine.step_protocol import TrainStepLike
from tests.test_chips import OverflowingStep

STAND_INS = [StubStep, OverflowingStep]  # every class that stands in for TrainStep in the real loop
LOOP_NAMES = ("train_step",)  # how loop.py names its step (a variable or an attribute)


def protocol_members() -> dict[str, object]:
    """The members written in TrainStepLike's body (not those typing.Protocol adds, such as __subclasshook__)."""
    def own(value: object) -> bool:
        function = value.fget if isinstance(value, property) else value
        return inspect.isfunction(function) and function.__qualname__.startswith(f"{TrainStepLike.__name__}.")

    return {name: value for name, value in vars(TrainStepLike).items() if own(value)}


def shape(function: object) -> list[tuple[str, object, object]]:
    """(name, kind, default) of each parameter: annotations are left out, since a stand-in may spell a type
    another way."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("cls", [TrainStep, *STAND_INS], ids=lambda c: c.__qualname__)
def test_implements_every_member_of_the_protocol_by_name_and_signature(cls: type) -> None:
    assert TrainStepLike not in cls.__mro__, (f"{cls.__qualname__} inherits TrainStepLike: its empty bodies would "
                                              "stand in for a missing member; implement the members instead")
    for name, member in protocol_members().items():
        found = inspect.getattr_static(cls, name, None)
        assert found is not None, f"{cls.__qualname__} has no '{name}', which the loop uses (TrainStepLike)"
        if isinstance(member, property):
            assert isinstance(found, property), f"{cls.__qualname__}.{name} must be a property, as in TrainStepLike"
        else:
            assert shape(found) == shape(member), (f"{cls.__qualname__}.{name}{inspect.signature(found)} differs "
                                                   f"from TrainStepLike.{name}{inspect.signature(member)}")


def test_the_protocol_is_what_the_loop_uses_of_its_train_step() -> None:
    used = set()
    for node in ast.walk(ast.parse(inspect.getsource(loop))):
        if isinstance(node, ast.Attribute) and (
                (isinstance(node.value, ast.Name) and node.value.id in LOOP_NAMES)
                or (isinstance(node.value, ast.Attribute) and node.value.attr in LOOP_NAMES)):
            used.add(node.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in LOOP_NAMES:
            used.add("__call__")
    assert used == set(protocol_members()), (
        f"engine/loop.py uses {sorted(used)} of its train step; TrainStepLike declares "
        f"{sorted(protocol_members())}: make them the same (and implement a new member in every stand-in)")
