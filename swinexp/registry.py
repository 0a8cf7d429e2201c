"""One small registry per component kind; a config node `{name: X, **kwargs}` builds component X."""
from __future__ import annotations

import inspect
from difflib import get_close_matches
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

T = TypeVar("T", bound=Callable[..., Any])


class ConfigError(ValueError):
    """A user-facing configuration mistake; the message says what is wrong and how to fix it."""


class Registry(Generic[T]):
    """Maps names to builder callables of one kind (`model`, `optimizer`, ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(fn: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.kind} '{name}' is already registered by {self._items[name].__module__}")
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> T:
        if name not in self._items:
            hint = get_close_matches(str(name), self._items, n=1)
            raise ConfigError(
                f"{self.kind}.name='{name}' is not a registered {self.kind}. Choose one of: {', '.join(sorted(self))}"
                + (f". Did you mean '{hint[0]}'?" if hint else "")
            )
        return self._items[name]

    def build(self, node: Mapping[str, Any], **extra: Any) -> Any:
        """Build from `{name: ..., **kwargs}`; `extra` are runtime arguments the config does not hold."""
        kwargs = dict(node)
        if "name" not in kwargs:
            raise ConfigError(f"the {self.kind} config has no 'name' key; add name: <one of {', '.join(sorted(self))}>")
        name = kwargs.pop("name")
        fn = self.get(name)
        check_kwargs(fn, {**kwargs, **extra}, where=f"{self.kind} '{name}'", path=self.kind)
        return fn(**kwargs, **extra)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def check_kwargs(fn: Callable[..., Any], kwargs: Mapping[str, Any], where: str, path: str) -> None:
    """Raise ConfigError naming unknown or missing keyword arguments of `fn`."""
    params = inspect.signature(fn).parameters
    allowed = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        for key in kwargs:
            if key not in allowed:
                hint = get_close_matches(key, allowed, n=1)
                raise ConfigError(
                    f"{path}.{key} is not a parameter of {where}. Allowed keys: {', '.join(allowed)}"
                    + (f". Did you mean '{path}.{hint[0]}'?" if hint else "")
                )
    missing = [n for n in allowed if params[n].default is inspect.Parameter.empty and n not in kwargs]
    if missing:
        raise ConfigError(
            f"{where} needs {', '.join(f'{path}.{m}' for m in missing)}; set it in the config file "
            f"or on the command line, e.g. {path}.{missing[0]}=..."
        )


MODELS: Registry[Callable[..., Any]] = Registry("model")
DATASETS: Registry[Callable[..., Any]] = Registry("data")
AUGMENTS: Registry[Callable[..., Any]] = Registry("data.augment")
AMP_POLICIES: Registry[Callable[..., Any]] = Registry("amp")
OPTIMIZERS: Registry[Callable[..., Any]] = Registry("optimizer")
SCHEDULERS: Registry[Callable[..., Any]] = Registry("scheduler")
TRACKERS: Registry[Callable[..., Any]] = Registry("tracking")
