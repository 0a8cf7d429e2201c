"""A grid sweep's identity, the command that defines it, and the directory it lives in.

Two commands define the same sweep when they give the same overrides, in any order and however a value is spelled
(`optimizer.lr=1e-3` and `optimizer.lr=0.001` alike), and the same named sweep values (`hydra.sweeper.params`). Keys
that change neither a job's results nor where it runs are left out (`NOT_IDENTITY`): where it is logged, how it is
reported, test hooks, how a job resumes. The sweep's directory is `multirun/<name>-<digest>`, e.g.
`multirun/amp_ablation-3f9a01c2`, so the same command finds it again and continues the sweep there
(`swinexp.app.sweep_record`). `sweep.fresh=true` starts the next generation, `<name>-<digest>.2`, which later plain
reruns continue. A search (hparams_search=...) keeps its dir per Optuna study: `multirun/<study_name>`.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

FRESH_KEY = "sweep.fresh"  # true: start the sweep anew, in the next generation of its dir
# Keys (and their subkeys) that neither change a job's results nor where it runs. `trainer.stop_after_epoch` is one:
# the same sweep with a later stop continues its screened jobs (as a single run continues a screen). `seeds` is in
# the identity through the seed values it gives a named sweep (`sweep=amp_ablation` and `... seeds=3` are one sweep).
NOT_IDENTITY = ("hydra", "tracking", "debug", "seeds", "sweep.fresh", "sweep.baseline", "sweep.margin",
                "trainer.resume",
                "trainer.resume_force", "trainer.stop_after_epoch", "trainer.progress_bar", "hardware.compile_cache",
                "hardware.compile_cache_dir", "hardware.compile_cache_max_gb", "hardware.master_addr",
                "hardware.master_port", "hardware.log_dir")
DIGEST_CHARS = 8


def changes_results(key: str) -> bool:
    """False for keys in NOT_IDENTITY ('tracking.uri', 'hydra/launcher', '+debug.park_at', ...)."""
    key = key.lstrip("+~").replace("/", ".")
    return not any(key == k or key.startswith(f"{k}.") for k in NOT_IDENTITY)


def normalised(override: Override) -> str:
    """'optimizer.lr=1e-3' -> 'optimizer.lr=0.001'; a sweep keeps its values' order (it numbers the jobs)."""
    key = override.get_key_element()
    if override.is_discrete_sweep():
        return f"{key}={','.join(override.sweep_string_iterator())}"
    if override.is_sweep_override():  # interval(...), tag(...): searches only; as written
        return f"{key}={override.input_line.split('=', 1)[1]}"
    return f"{key}={override.get_value_element_as_str()}"


@dataclass(frozen=True)
class SweepIdentity:
    name: str                      # the named sweep (sweep=amp_ablation), else the swept keys, e.g. 'optimizer.lr'
    overrides: tuple[str, ...]     # normalised, sorted, NOT_IDENTITY keys left out

    @property
    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.overrides).encode()).hexdigest()[:DIGEST_CHARS]

    @property
    def dir_name(self) -> str:
        return f"{self.name}-{self.digest}"


def identity_of(task_overrides: Sequence[str], params: dict[str, str] | None, config_name: str = "config"
                ) -> SweepIdentity:
    """The sweep `task_overrides` (the command line's) and `params` (the sweep file's, resolved) define."""
    given = [f"{k}={v}" for k, v in (params or {}).items()] + list(task_overrides)
    parsed: dict[str, Override] = {}
    for override in OverridesParser.create().parse_overrides(given):  # the command line wins, as in the sweeper
        parsed[override.get_key_element().lstrip("+~")] = override
    kept = {key: o for key, o in parsed.items() if changes_results(key)}
    named = kept.get("sweep")
    swept = [key for key, o in kept.items() if o.is_sweep_override()]
    name = named.get_value_element_as_str() if named is not None else "+".join(swept) or "run"
    extra = [f"--config-name={config_name}"] if config_name != "config" else []
    return SweepIdentity(_safe(name), tuple(sorted(normalised(o) for o in kept.values())) + tuple(extra))


def identity_of_config(config: DictConfig) -> SweepIdentity:
    """The identity of the sweep a composed multirun config (with its `hydra` node) runs."""
    params = OmegaConf.select(config, "hydra.sweeper.params")
    params = OmegaConf.to_container(params, resolve=True) if params is not None else None
    return identity_of(list(config.hydra.overrides.task), params, str(config.hydra.job.config_name))


def generations(base: Path) -> list[Path]:
    """`base`, `base.2`, `base.3`, ...: those on disk, oldest first."""
    found = [(1, base)] if base.is_dir() else []
    if base.parent.is_dir():
        pattern = re.compile(re.escape(base.name) + r"\.(\d+)")
        found += [(int(m.group(1)), p) for p in base.parent.iterdir() if (m := pattern.fullmatch(p.name))]
    return [p for _, p in sorted(found)]


def sweep_dir(root: str, *, _root_: DictConfig) -> str:
    """`${swinexp.sweep_dir:multirun}`: `<root>/<study_name>` for a search; else `<root>/<name>-<digest>`, its newest
    generation, or with sweep.fresh=true the next one."""
    study = OmegaConf.select(_root_, "hydra.sweeper.study_name")
    if study:
        return f"{root}/{study}"
    base = Path(root) / identity_of_config(_root_).dir_name
    found = generations(base)
    if not OmegaConf.select(_root_, FRESH_KEY, default=False):
        return str(found[-1]) if found else str(base)
    return f"{base}.{_generation(found[-1], base) + 1}" if found else str(base)


def _generation(path: Path, base: Path) -> int:
    return 1 if path == base else int(path.name.rsplit(".", 1)[1])


def _safe(name: str) -> str:
    """A directory name: 'model/rewrites+seed' -> 'model.rewrites+seed'."""
    return re.sub(r"[^\w.+=-]+", "_", name.replace("/", "."))[:80]


def without_fresh(overrides: Iterable[str]) -> list[str]:
    """A job's overrides without sweep.fresh, which concerns the sweep, not the job (its resume would warn)."""
    return [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != FRESH_KEY]
