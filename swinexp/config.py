"""Typed schemas for the groups swinexp's own code reads (trainer, hardware), stored in Hydra's ConfigStore.

Component groups (model, data, data/augment, amp, optimizer, scheduler, tracking) are not typed here: their keys are
checked against the registered builder's signature instead, so every field is written once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf


def resource_dir(name: str) -> Path:
    """`conf` or `sweeps`: inside the package when installed from a wheel (`swinexp/_conf`, mapped at build time),
    else the repository's top-level folder (a checkout, or an editable install that reads the checkout)."""
    package = Path(__file__).resolve().parent
    packaged = package / f"_{name}"
    return packaged if packaged.is_dir() else package.parent / name


CONF_DIR = resource_dir("conf")      # the one place code finds the config groups
SWEEPS_DIR = resource_dir("sweeps")
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
    profile: ProfileCfg = field(default_factory=ProfileCfg)


@dataclass
class HardwareCfg:
    device_target: str = "CPU"                  # CPU | GPU | Ascend
    mode: str = "graph"                         # graph (compiled, fast) | pynative (eager, debuggable)
    jit_level: Optional[str] = None             # MindSpore graph kernel level O0/O1/O2; null = backend default
    cpu_threads: Optional[int] = None           # CPU kernel threads; null = the cores this process may run on
    memory_optimize_level: Optional[str] = None  # O0 | O1 (memory reuse across the graph); null = backend default
    chip: Optional[str] = None                  # ascend910 (Atlas training series: saturation mode, no bf16) |
                                                # ascend910b | ...; null = read from the card at start (Ascend)
    overflow_check: str = "auto"                # auto | isfinite | status_register (amp/overflow.py): how fp16
                                                # overflow is seen; auto = the status register on a saturating card
    compile_cache: bool = False                 # reuse the graphs an identical config compiled (compile_cache.py)
    compile_cache_dir: Optional[str] = None     # where; null = $XDG_CACHE_HOME/swinexp/compile (~/.cache/...)
    num_devices: int = 1                        # worker processes per node
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"              # msrun scheduler host: node 0's address on a cluster
    master_port: int = 8118                     # msrun scheduler port, the same on every node
    node_rank: int = 0                          # this node's index, 0..num_nodes-1 (set per node)
    log_dir: Optional[str] = None               # msrun worker logs; null = <run dir>/msrun (multi-node: .../node<r>)
    rank_table_file: Optional[str] = None       # Ascend rank table JSON handed to msrun; null = none (rank_table.py)
    platform: Optional[str] = None              # modelarts: one launcher per node from per-card copies (modelarts.py)
    shared_dir: Optional[str] = None            # a path every node mounts: default run dirs and MLflow store go there
    node_sync_timeout_s: float = 300.0          # multi-node: how long nodes wait for each other in the shared run dir


def load_option(group_dir: Path, name: str) -> DictConfig:
    """`<group_dir>/<name>.yaml` merged over the sibling options its `defaults:` list extends (e.g. `- base_swin`),
    as Hydra composes it; for code that needs one option's values outside a composed run (create_model, the bench).
    """
    node = OmegaConf.load(group_dir / f"{name}.yaml")
    bases = [entry for entry in node.pop("defaults", []) if entry != "_self_"]
    return OmegaConf.merge(*(load_option(group_dir, base) for base in bases), node)


def register_resolvers() -> None:
    """`${swinexp.floordiv:a,b}` in configs, e.g. a per-device batch that keeps the total batch fixed;
    `${swinexp.help_groups:}`, the config groups `--help` lists; `${swinexp.slurm_node_rank:0}` and
    `${swinexp.slurm_master_addr:127.0.0.1}`: SLURM's values, else the default; `${swinexp.min:a,b}`, e.g. a
    screen that stops at epoch 10 or at the end of a shorter run; `${swinexp.modelarts:node_rank,0}`: ModelArts'
    values (runtime/modelarts.py), else the default; `${swinexp.under:root,path}`: root/path, or path if root is
    null."""
    if not OmegaConf.has_resolver("swinexp.help_groups"):
        OmegaConf.register_new_resolver("swinexp.help_groups", help_groups)
    if not OmegaConf.has_resolver("swinexp.floordiv"):
        OmegaConf.register_new_resolver("swinexp.floordiv", lambda a, b: int(a) // int(b))
    if not OmegaConf.has_resolver("swinexp.slurm_node_rank"):  # multi-node presets inside a SLURM job
        from swinexp.runtime import slurm

        OmegaConf.register_new_resolver("swinexp.slurm_node_rank", lambda default: slurm.node_rank(int(default)))
        OmegaConf.register_new_resolver("swinexp.slurm_master_addr", lambda default: slurm.master_addr(str(default)))
    if not OmegaConf.has_resolver("swinexp.min"):
        OmegaConf.register_new_resolver("swinexp.min", lambda a, b: min(int(a), int(b)))
    if not OmegaConf.has_resolver("swinexp.modelarts"):  # hardware=modelarts_ascend8: the platform's values
        from swinexp.runtime import modelarts

        OmegaConf.register_new_resolver("swinexp.modelarts", modelarts.value)
    if not OmegaConf.has_resolver("swinexp.under"):  # hydra.run.dir below hardware.shared_dir when it is set
        OmegaConf.register_new_resolver("swinexp.under", lambda root, path: f"{root}/{path}" if root else path)


def register_schemas() -> None:
    cs = ConfigStore.instance()
    cs.store(group="trainer", name="base_trainer", node=TrainerCfg)
    cs.store(group="hardware", name="base_hardware", node=HardwareCfg)


def register_sweeps(directory: Path = SWEEPS_DIR) -> None:
    """Offer each `sweeps/<name>.yaml` as `+sweep=<name>` (a global-package config that sets the sweep params)."""
    cs = ConfigStore.instance()
    for path in sorted(Path(directory).glob("*.yaml")):
        cs.store(group="sweep", name=path.stem, node=OmegaConf.load(path), package="_global_")


HIDDEN_GROUPS = ("model/formulation",)  # chosen by the hardware preset, not by the user
SCHEMA_PREFIX = "base_"                 # typed schemas (base_trainer, ...) that presets extend, not options to pick


def help_groups() -> str:
    """`group: option, ...` lines for `--help`: the user-facing groups of the running Hydra app, with the options of
    every config directory on its search path (`-cd` included), without schemas or internal groups."""
    from hydra.core.global_hydra import GlobalHydra

    hydra = GlobalHydra.instance().hydra
    assert hydra is not None, "help_groups is resolved by Hydra's --help, inside a running app"
    lines = []
    for group in sorted(hydra.list_all_config_groups()):
        if group.split("/")[0] == "hydra" or group in HIDDEN_GROUPS:
            continue
        options = [o for o in sorted(hydra.config_loader.get_group_options(group)) if not o.startswith(SCHEMA_PREFIX)]
        if options:
            lines.append(f"{group}: {', '.join(options)}")
    return "\n".join(lines)
