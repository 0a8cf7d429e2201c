"""`sweeps/` as Hydra's config group `sweep`, wherever swinexp is installed.

The design card puts the named sweeps in a top-level `sweeps/` folder, but Hydra reads a config group from a folder
of that group's name under a search-path root: `sweeps/` would have to be `<root>/sweep/`, and the repository root
as a search path would make every other top-level folder a group. This config source serves exactly one group,
`sweep`, from the `sweeps` folder (`swinexp.config.resource_dir`: the checkout's, or the wheel's `swinexp/_sweeps`),
and the search-path plugin puts it after swinexp's `conf/`.
"""
from __future__ import annotations

import os

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

GROUP = "sweep"


class SweepsConfigSource(ConfigSource):
    """The files of one folder as the configs of the group `sweep`, and nothing else."""

    @staticmethod
    def scheme() -> str:
        return "swinexp-sweeps"

    def _file(self, config_path: str) -> str | None:
        """The folder's file for 'sweep/<name>(.yaml)', or None for any other path."""
        group, _, name = config_path.partition("/")
        if group != GROUP or not name or "/" in name:
            return None
        return os.path.join(self.path, self._normalize_file_name(name))

    def load_config(self, config_path: str) -> ConfigResult:
        file = self._file(config_path)
        if file is None or not os.path.isfile(file):
            raise ConfigLoadError(f"Config not found : {file or config_path}")
        with open(file, encoding="utf-8") as f:
            header = ConfigSource._get_header_dict(f.read(512))
            f.seek(0)
            return ConfigResult(config=OmegaConf.load(f), path=f"{self.scheme()}://{self.path}",
                                provider=self.provider, header=header)

    def available(self) -> bool:
        return os.path.isdir(self.path)

    def is_group(self, config_path: str) -> bool:
        return config_path in ("", GROUP) and self.available()

    def is_config(self, config_path: str) -> bool:
        file = self._file(config_path)
        return file is not None and os.path.isfile(file)

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        if not self.available():
            return []
        if config_path == "":
            return [GROUP] if results_filter in (None, ObjectType.GROUP) else []
        if config_path != GROUP or results_filter == ObjectType.GROUP:
            return []
        return sorted(f.removesuffix(".yaml") for f in os.listdir(self.path) if f.endswith(".yaml"))


class SweepsSearchPath(SearchPathPlugin):
    """Adds the sweeps folder to every swinexp app's search path (other Hydra apps do not see it)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not any(e.provider == "main" and e.path.rstrip("/").endswith(("conf", "_conf"))
                   for e in search_path.get_path()):
            return
        from swinexp.config import resource_dir  # swinexp's own: the app whose search path this is

        search_path.append("swinexp-sweeps", f"swinexp-sweeps://{resource_dir('sweeps')}")
