"""What Hydra needs before it composes swinexp's configs, registered when swinexp is imported: the `${swinexp.*:...}`
resolvers the config files use and the typed schemas (`base_trainer`, `base_hardware`) their defaults lists name."""
from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from swinexp.app.sweep_identity import sweep_dir
from swinexp.config import HardwareCfg, TrainerCfg
from swinexp.runtime import modelarts, slurm


def register_schemas() -> None:
    cs = ConfigStore.instance()
    cs.store(group="trainer", name="base_trainer", node=TrainerCfg)
    cs.store(group="hardware", name="base_hardware", node=HardwareCfg)


def register_resolvers() -> None:
    """`${swinexp.floordiv:a,b}` in configs, e.g. a per-device batch that keeps the total batch fixed;
    `${swinexp.help_groups:}`, the config groups `--help` lists; `${swinexp.slurm_node_rank:0}` and
    `${swinexp.slurm_master_addr:127.0.0.1}`: SLURM's values, else the default; `${swinexp.min:a,b}`, e.g. a
    screen that stops at epoch 10 or at the end of a shorter run; `${swinexp.modelarts:node_rank,0}`: ModelArts'
    values (runtime/modelarts.py), else the default; `${swinexp.under:root,path}`: root/path, or path if root is
    null; `${swinexp.or:value,default}`: value, or default where it is null; `${swinexp.sweep_dir:root}`: the
    sweep's dir under root (app/sweep_identity.py)."""
    if not OmegaConf.has_resolver("swinexp.help_groups"):
        OmegaConf.register_new_resolver("swinexp.help_groups", help_groups)
    if not OmegaConf.has_resolver("swinexp.floordiv"):
        OmegaConf.register_new_resolver("swinexp.floordiv", lambda a, b: int(a) // int(b))
    if not OmegaConf.has_resolver("swinexp.slurm_node_rank"):  # multi-node presets inside a SLURM job
        OmegaConf.register_new_resolver("swinexp.slurm_node_rank", lambda default: slurm.node_rank(int(default)))
        OmegaConf.register_new_resolver("swinexp.slurm_master_addr", lambda default: slurm.master_addr(str(default)))
    if not OmegaConf.has_resolver("swinexp.min"):
        OmegaConf.register_new_resolver("swinexp.min", lambda a, b: min(int(a), int(b)))
    if not OmegaConf.has_resolver("swinexp.modelarts"):  # hardware=modelarts_ascend8: the platform's values
        OmegaConf.register_new_resolver("swinexp.modelarts", modelarts.value)
    if not OmegaConf.has_resolver("swinexp.or"):  # a model's native size unless data.img_size is set
        OmegaConf.register_new_resolver("swinexp.or", lambda value, default: default if value is None else value)
    if not OmegaConf.has_resolver("swinexp.sweep_dir"):  # hydra.sweep.dir: one per sweep, found again by a rerun
        OmegaConf.register_new_resolver("swinexp.sweep_dir", sweep_dir)
    if not OmegaConf.has_resolver("swinexp.under"):  # hydra.run.dir below hardware.shared_dir when it is set
        OmegaConf.register_new_resolver("swinexp.under", lambda root, path: f"{root}/{path}" if root else path)



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
