"""Typed schemas for the groups swinexp's own code reads (trainer, hardware; `swinexp.app` stores them in Hydra's
ConfigStore), and `Plan`: the composed config as frozen plain values, the one thing that crosses from the door
(`swinexp.app`) into `build` and everything below it. `read` is the only place outside `swinexp.app` that touches
OmegaConf.

Component groups (model, data, data/augment, amp, optimizer, scheduler, tracking) are not typed here: their keys are
checked against the registered builder's signature instead, so every field is written once.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from swinexp.registry import ConfigError


def resource_dir(name: str) -> Path:
    """`conf`: inside the package when installed from a wheel (`swinexp/_conf`, mapped at build time),
    else the repository's top-level folder (a checkout, or an editable install that reads the checkout)."""
    package = Path(__file__).resolve().parent
    packaged = package / f"_{name}"
    return packaged if packaged.is_dir() else package.parent / name


CONF_DIR = resource_dir("conf")      # the one place code finds the config groups
ACCUMULATE_ON = ("device", "cpu")    # trainer.accumulate_on: where the accumulate/clear ops run


@dataclass
class EmaCfg:
    decay: Optional[float] = None               # weights EMA per optimizer step, evaluated as val_ema/*; null = off


@dataclass
class CheckpointCfg:
    every_n_steps: Optional[int] = None         # also checkpoint every N optimizer steps mid-epoch; null = per epoch
    keep_last: int = 3                          # step files kept (older ones deleted); best.ckpt is kept apart


@dataclass
class ProfileCfg:
    enabled: bool = False                       # wrap optimizer steps in mindspore.Profiler; output in <run dir>
    start_step: int = 3                         # first profiled optimizer step (1-based; after compile/warm-up)
    num_steps: int = 2


@dataclass
class TrainerCfg:
    epochs: int = 10                            # full passes over the train set; metrics are logged per epoch
    stop_after_epoch: Optional[int] = None      # stop (FINISHED, resumable) after this epoch of the `epochs` schedule
    accumulation_steps: int = 1                 # micro-batches per optimizer step (gradients averaged over them)
    accumulate_on: str = "device"               # device | cpu: where accumulate/clear ops run (graph mode)
    clip_grad: Optional[float] = None           # bound on the unscaled, accumulated gradient's global L2 norm
    lr_batch_size: Optional[int] = None         # LRs are quoted at this total batch and scaled linearly; null = as is
    ema: EmaCfg = field(default_factory=EmaCfg)
    label_smoothing: float = 0.1                # folded into the soft targets of the cross entropy
    limit_train_batches: Optional[int] = None   # cap on batches per epoch (quick runs); null = whole epoch
    limit_val_batches: Optional[int] = None     # cap on validation batches; null = whole val set
    log_every_n_steps: int = 50                 # the host reads the step outputs (loss, overflow, ...) every N
                                                # optimizer steps, at checkpoints and epoch ends; no sync between
    progress_bar: bool = True                   # tqdm bar per epoch (loss, lr, images/s)
    eval_only: bool = False                     # only evaluate (e.g. model.pretrained=...), logged at step 0
    amp_report: bool = True                     # log the per-cell dtype table and fp32 drift report as artifacts
    deterministic: bool = False                 # bit-repeatable runs: deterministic kernels where the backend has them
    resume: Optional[str] = "auto"              # auto: <run dir>/checkpoints if any | PATH (file or run dir) | null
    resume_force: bool = False                  # resume even if the config group choices differ from the checkpoint's
    checkpoint: CheckpointCfg = field(default_factory=CheckpointCfg)
    max_nonfinite: int = 3                      # consecutive non-finite losses that stop the run (checkpointed)
    max_overflow_at_min_scale: int = 10         # consecutive overflow-skipped optimizer steps at the smallest loss
                                                # scale that stop it (a saturating card never shows a non-finite loss)
    profile: ProfileCfg = field(default_factory=ProfileCfg)
    straggler_factor: float = 1.5               # several ranks: a rank whose step time exceeds this x the other
    straggler_patience: int = 3                 # ranks' median at this many read points in a row is flagged
                                                # (a warning, tag straggler.ranks; engine/rank_times.py)


@dataclass
class HardwareCfg:
    device_target: str = "CPU"                  # CPU | GPU | Ascend
    mode: str = "graph"                         # graph (compiled, fast) | pynative (eager, debuggable)
    jit_level: Optional[str] = None             # ms.jit(jit_level=) of the train/eval steps: O0/O1/O2; null = O0
    cpu_threads: Optional[int] = None           # CPU kernel threads; null = the cores this process may run on
    memory_optimize_level: Optional[str] = None  # O0 | O1 (memory reuse across the graph); null = backend default
    chip: Optional[str] = None                  # ascend910 (Atlas training series: saturation mode, no bf16) |
                                                # ascend910b | ...; null = read from the card at start (Ascend)
    overflow_check: str = "auto"                # auto | isfinite | status_register (amp/overflow.py): how fp16
                                                # overflow is seen; auto = the status register on a saturating card
    compile_cache: bool = True                  # reuse the graphs an identical config compiled (compile_cache.py)
    compile_cache_dir: Optional[str] = None     # where; null = $XDG_CACHE_HOME/swinexp/compile (~/.cache/...)
    compile_cache_max_gb: float = 2.0           # its size cap: the configurations used longest ago go first
    num_devices: int = 1                        # worker processes per node
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"              # msrun scheduler host: node 0's address on a cluster
    master_port: int = 8118                     # msrun scheduler port, the same on every node
    node_rank: int = 0                          # this node's index, 0..num_nodes-1 (set per node)
    log_dir: Optional[str] = None               # msrun worker logs; null = <run dir>/msrun (multi-node: .../node<r>)
    rank_table_file: Optional[str] = None       # Ascend rank table JSON (or its directory) for msrun; null = none:
                                                # then RANK_TABLE_FILE is kept from the workers (rank_table.py)
    rank_table_wait_s: float = 300.0            # how long to wait for the table's status to read 'completed'
    platform: Optional[str] = None              # modelarts: one launcher per node from per-card copies (modelarts.py)
    shared_dir: Optional[str] = None            # a path every node mounts: default run dirs and MLflow store go there
    node_sync_timeout_s: float = 300.0          # multi-node: how long nodes wait for each other in the shared run dir


Composed = DictConfig  # what Hydra composes; only swinexp.app and `read` below hold one


@dataclass(frozen=True)
class Plan:
    """The composed config, resolved to plain values and typed where swinexp reads fields; `build.resolve` validates it.

    Sections are read-only mappings (`section(name)` hands a builder its own mutable copy); `values` is the whole
    config, as logged to MLflow and written to config.yaml. `follows` names the model keys written as a data key
    (`model.num_classes: ${data.num_classes}`), so an error can name the key to change and a counted class number
    reaches both.
    """

    values: Mapping[str, Any]
    trainer: TrainerCfg
    hardware: HardwareCfg
    follows: Mapping[str, str] = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return int(self.values["seed"])

    @property
    def imports(self) -> tuple[str, ...]:
        return tuple(self.values.get("imports") or ())

    def section(self, name: str) -> dict[str, Any]:
        """A group's values as a fresh plain dict (lists, not tuples): builder kwargs to pop and pass on."""
        value = self.values.get(name)
        if not isinstance(value, Mapping):
            raise ConfigError(f"config group '{name}' is missing; add it to the defaults list or pass {name}=<option>")
        return thaw(value)

    def get(self, dotted: str, default: Any = None) -> Any:
        """The value at 'data.img_size', or `default` where a key on the way is absent."""
        node: Any = self.values
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return thaw(node)

    def with_values(self, changes: Mapping[str, Any]) -> Plan:
        """A plan with dotted keys set ({"data.num_classes": 10}), and every model key that follows one of them."""
        values = thaw(self.values)
        for dotted, value in changes.items():
            for key in (dotted, *(k for k, source in self.follows.items() if source == dotted)):
                *parents, leaf = key.split(".")
                node = values
                for part in parents:
                    node = node.setdefault(part, {})
                node[leaf] = value
        trainer = _typed(TrainerCfg, values.get("trainer") or {})
        hardware = _typed(HardwareCfg, values.get("hardware") or {})
        return replace(self, values=freeze(values), trainer=trainer, hardware=hardware)


def compose(overrides: Sequence[str] = ()) -> Composed:
    """run.py's composed config for `overrides`, for tools that are not a Hydra app (self-check, parity, benchmarks)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return hydra_compose("config", overrides=list(overrides))


def read(cfg: Composed) -> Plan:
    """The composed config as a Plan of plain values; a mandatory value left at ??? is named with the way to set it."""
    try:
        values = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except Exception as err:  # omegaconf's MissingMandatoryValue / InterpolationResolutionError name the key
        key = getattr(err, "full_key", "") or "<key>"
        raise ConfigError(f"{err}. Set it on the command line, e.g. {key}=...") from err
    _data_size_from_model(values)
    return Plan(freeze(values), _typed(TrainerCfg, values.get("trainer") or {}),
                _typed(HardwareCfg, values.get("hardware") or {}), MappingProxyType(_followed_keys(cfg)))


def _data_size_from_model(values: dict[str, Any]) -> None:
    """`data.img_size: null` is the model's native resolution (`model.img_size`, which follows data.img_size only
    when that is set): `python run.py model=swin_tiny` draws and trains at 224 px without another key."""
    data, model = values.get("data"), values.get("model")
    if isinstance(data, dict) and isinstance(model, dict) and "img_size" in data and data["img_size"] is None:
        data["img_size"] = model.get("img_size")


def _followed_keys(cfg: Composed) -> dict[str, str]:
    """{"model.num_classes": "data.num_classes"} for each model key written as an interpolation of a data key."""
    model = cfg.get("model")
    if not isinstance(model, DictConfig):
        return {}
    written = OmegaConf.to_container(model, resolve=False)
    follows = {}
    for key, value in written.items():
        if OmegaConf.is_interpolation(model, key) and (source := re.search(r"data\.[\w.]+", str(value))):
            follows[f"model.{key}"] = source.group(0)
    return follows


def _typed(schema: type, values: Mapping[str, Any]) -> Any:
    """A schema dataclass from plain values (nested schemas too); keys the schema lacks are refused by name."""
    known = {f.name: f for f in fields(schema)}
    if unknown := [k for k in values if k not in known]:
        raise ConfigError(f"{schema.__name__} has no key {unknown[0]!r}; check the spelling against "
                          f"{', '.join(known)}")
    nested = {f.name: f.default_factory for f in fields(schema) if callable(f.default_factory)}
    kwargs = {k: _typed(type(nested[k]()), v) if k in nested and isinstance(v, Mapping) else thaw(v)
              for k, v in values.items()}
    return schema(**kwargs)


def freeze(value: Any) -> Any:
    """Read-only mappings and tuples all the way down."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain dicts and lists again (what a builder or a YAML writer expects)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


def saved(config: Mapping[str, Any] | Path, overrides: Sequence[str] = ()) -> Plan:
    """A run's config.yaml (resolved, untyped; or its path) typed again like a composed config, with `key=value`
    overrides, as a Plan (not validated: `build.resolve` does that where a job needs more than the model).

    Raises:
        ConfigError: an override is not `key=value`, or names a trainer/hardware key the schema lacks.
    """
    if bad := [o for o in overrides if "=" not in o or o.startswith(("+", "~"))]:
        raise ConfigError(f"overrides must be key=value, e.g. data.root=/data/val_set; got {bad}")
    config = OmegaConf.load(config) if isinstance(config, Path) else OmegaConf.create(thaw(config))
    for group, schema in (("trainer", TrainerCfg), ("hardware", HardwareCfg)):  # a config.yaml of an older swinexp
        known = {f.name for f in fields(schema)}
        for key in [k for k in (config.get(group) or {}) if k not in known]:
            del config[group][key]
    typed = OmegaConf.create({"trainer": OmegaConf.structured(TrainerCfg),
                              "hardware": OmegaConf.structured(HardwareCfg)})
    try:
        merged = OmegaConf.merge(typed, config, OmegaConf.from_dotlist(list(overrides)))
    except Exception as err:  # omegaconf's ConfigKeyError / ValidationError name the key
        raise ConfigError(f"{err}; check the override against the run's config.yaml") from err
    return read(merged)


def load_option(group_dir: Path, name: str) -> DictConfig:
    """`<group_dir>/<name>.yaml` merged over the sibling options its `defaults:` list extends (e.g. `- base_swin`),
    as Hydra composes it; for code that needs one option's values outside a composed run (create_model, the bench).
    """
    node = OmegaConf.load(group_dir / f"{name}.yaml")
    bases = [entry for entry in node.pop("defaults", []) if entry != "_self_"]
    return OmegaConf.merge(*(load_option(group_dir, base) for base in bases), node)


def option_values(group_dir: Path, name: str) -> dict[str, Any]:
    """`load_option` as plain resolved values."""
    return OmegaConf.to_container(load_option(group_dir, name), resolve=True)

