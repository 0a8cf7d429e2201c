from __future__ import annotations

import pytest

from swinexp.registry import ConfigError, Registry


def _make() -> Registry:
    reg: Registry = Registry("model")

    @reg.register("swin_tiny")
    def swin_tiny(num_classes: int, embed_dim: int = 96) -> tuple[int, int]:
        return num_classes, embed_dim

    return reg


def test_build_passes_kwargs_and_extras() -> None:
    assert _make().build({"name": "swin_tiny", "embed_dim": 64}, num_classes=10) == (10, 64)


def test_duplicate_name_raises_naming_the_first_registration() -> None:
    reg = _make()
    with pytest.raises(KeyError, match="already registered"):
        reg.register("swin_tiny")(lambda: None)


def test_unknown_name_lists_choices_and_a_close_match() -> None:
    expected = r"model.name='swin_tiyn'.*Choose one of: swin_tiny.*Did you mean 'swin_tiny'"
    with pytest.raises(ConfigError, match=expected):
        _make().build({"name": "swin_tiyn", "num_classes": 3})


def test_unknown_key_names_key_component_and_allowed_keys() -> None:
    with pytest.raises(ConfigError, match=r"model.embed_dims is not a parameter of model 'swin_tiny'.*Did you mean "
                                          r"'model.embed_dim'"):
        _make().build({"name": "swin_tiny", "num_classes": 3, "embed_dims": 5})


def test_missing_key_names_key_and_component() -> None:
    with pytest.raises(ConfigError, match=r"model 'swin_tiny' needs model.num_classes"):
        _make().build({"name": "swin_tiny"})


def test_missing_name_says_what_to_add() -> None:
    with pytest.raises(ConfigError, match="no 'name' key"):
        _make().build({"embed_dim": 3})
