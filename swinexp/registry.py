"""One small registry per component kind; a config node `{name: X, **kwargs}` builds component X.

The registries of swinexp fill themselves when one of them is first read (get, build, `in`, iteration, len): that
imports swinexp's component modules (`COMPONENT_MODULES`) and every installed plugin (entry-point group
`swinexp.plugins`), so a read never sees a partly filled registry and MindSpore loads only for commands that build.
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterable, Iterator, Mapping
from difflib import get_close_matches
from importlib.metadata import entry_points
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T", bound=Callable[..., Any])


class ConfigError(ValueError):
    """A user-facing configuration mistake; the message says what is wrong and how to fix it."""


class Registry(Generic[T]):
    """Maps names to builder callables of one kind (`model`, `optimizer`, ...)."""

    def __init__(self, kind: str, fill: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._fill = fill  # called before every read; swinexp's registries pass fill_registries

    def _read(self) -> dict[str, T]:
        if self._fill is not None:
            self._fill()
        return self._items

    def register(self, name: str) -> Callable[[T], T]:
        def deco(fn: T) -> T:
            if name in self._items:
                raise KeyError(f"{self.kind} '{name}' is already registered by {self._items[name].__module__}")
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> T:
        items = self._read()
        if name not in items:
            hint = get_close_matches(str(name), items, n=1)
            raise ConfigError(
                f"{self.kind}.name='{name}' is not a registered {self.kind}. Choose one of: {', '.join(sorted(self))}"
                + (f". Did you mean '{hint[0]}'?" if hint else "")
            )
        return items[name]

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
        return name in self._read()

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


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


COMPONENT_MODULES = ("swinexp.models", "swinexp.data", "swinexp.amp", "swinexp.optim", "swinexp.tracking")
PLUGIN_GROUP = "swinexp.plugins"  # entry points naming a module of another package that registers components
_filled = False


def fill_registries() -> None:
    """Import the modules that register components, swinexp's own then the plugins'; once per process."""
    global _filled
    if _filled:
        return
    _filled = True  # set first: the imported modules register (not read), and a read during import must not recurse
    try:
        for module in COMPONENT_MODULES:
            importlib.import_module(module)
        for plugin in _plugins():
            try:
                plugin.load()
            except ImportError as err:
                raise ImportError(f"swinexp plugin '{plugin.name} = {plugin.value}' (entry point group "
                                  f"{PLUGIN_GROUP}) failed to import: {err}; fix or uninstall its package") from err
    except BaseException:
        _filled = False
        raise


def _plugins() -> list[Any]:
    found = entry_points()
    if hasattr(found, "select"):  # Python >= 3.10
        return list(found.select(group=PLUGIN_GROUP))
    return list(found.get(PLUGIN_GROUP, []))  # Python 3.9: a dict of group -> entry points


def import_modules(modules: Iterable[str], key: str = "imports") -> None:
    """Import the user's component modules listed in the config (`imports: [my_pkg.models]`) so they register."""
    for module in modules:
        try:
            importlib.import_module(str(module))
        except ModuleNotFoundError as err:
            raise ConfigError(f"{key}: cannot import '{module}' ({err}); install the package that holds it, put its "
                              f"folder on PYTHONPATH, or remove it from {key}") from err


MODELS: Registry[Callable[..., Any]] = Registry("model", fill_registries)
DATASETS: Registry[Callable[..., Any]] = Registry("data", fill_registries)
AUGMENTS: Registry[Callable[..., Any]] = Registry("data.augment", fill_registries)
AMP_POLICIES: Registry[Callable[..., Any]] = Registry("amp", fill_registries)
OPTIMIZERS: Registry[Callable[..., Any]] = Registry("optimizer", fill_registries)
SCHEDULERS: Registry[Callable[..., Any]] = Registry("scheduler", fill_registries)
TRACKERS: Registry[Callable[..., Any]] = Registry("tracking", fill_registries)
