"""Every YAML in every group composes, mirrors its builder's parameters, and builds its component."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from mindspore import nn
from omegaconf import DictConfig, OmegaConf
from PIL import Image

from swinexp import REGISTRIES
from swinexp.build import build_experiment, check_trainer, resolve
from swinexp.config import load_option, read
from swinexp.registry import ConfigError
from swinexp.runtime import hardware
from tests.conftest import CONF_DIR

# Arguments the framework passes at build time rather than the YAML: they must not appear in the files.
RUNTIME_ARGS = {"data/augment": {"img_size", "num_classes", "label_smoothing"}, "optimizer": {"model"},
                "scheduler": {"base_lr", "epochs", "steps_per_epoch"}}


def group_options() -> list[tuple[str, str]]:
    """Every selectable option; `base_*` files are what the options of their group extend, not options."""
    return sorted((str(p.parent.relative_to(CONF_DIR)), p.stem) for p in CONF_DIR.rglob("*.yaml")
                  if p.parent != CONF_DIR and "hydra" not in p.relative_to(CONF_DIR).parts
                  and not p.stem.startswith("base_"))


def _tiny_model() -> nn.Cell:
    return nn.Dense(2, 2)


@pytest.mark.parametrize("group", sorted(REGISTRIES))
def test_every_registered_name_has_a_yaml_and_back(group: str) -> None:
    files = {p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("base_")}
    assert files == set(REGISTRIES[group]), f"conf/{group}/*.yaml and the {group} registry differ"


@pytest.mark.parametrize("group,option", [g for g in group_options() if g[0] in REGISTRIES])
def test_yaml_mirrors_builder_parameters_one_to_one(group: str, option: str) -> None:
    keys = set(load_option(CONF_DIR / group, option)) - {"name"}  # the option as composed, its bases included
    params = set(inspect.signature(REGISTRIES[group].get(option)).parameters) - RUNTIME_ARGS.get(group, set())
    assert keys == params, f"conf/{group}/{option}.yaml keys differ from its builder's parameters"


@pytest.mark.parametrize("group,option", group_options())
def test_option_composes_and_builds(compose: Callable[..., DictConfig], group: str, option: str,
                                    tmp_path: Path) -> None:
    overrides, smoke = [f"{group}={option}"], True
    if group == "model/formulation":  # chosen by the hardware presets, not directly
        overrides = [f"hardware={ {'cpu': 'cpu', 'ascend': 'ascend8', 'gpu': 'gpu8'}[option] }"]
    if group == "optimizer/kernel":  # chosen by hardware=cpu, not directly
        overrides = ["hardware=cpu"]
    if group == "experiment":
        smoke = False  # an experiment replaces the groups the smoke overrides would pin
        overrides.append("data.root=unused")  # composing needs no data
    if group == "data" and option != "synthetic":
        smoke = False  # the smoke overrides set synthetic-only keys
        for split in ("train", "test" if option == "cifar10_folder" else "val"):  # imagenet: two stand-in classes
            for name in ("a", "b"):
                (tmp_path / "folder" / split / name).mkdir(parents=True)
                Image.new("RGB", (20, 20)).save(tmp_path / "folder" / split / name / "0.jpg")
        overrides += [f"data.root={tmp_path / 'folder'}", "data.num_classes=2", "data.batch_size=1",
                      "data.img_size=32"]
    if group == "model":  # the variant's own input size: swin_tiny needs 224 (56-28-14-7 maps), base_384 needs 384
        overrides.append(f"data.img_size={inspect.signature(REGISTRIES[group].get(option)).parameters['img_size'].default}")
    if group == "tracking":
        overrides.append(f"tracking.uri=sqlite:///{tmp_path}/mlflow.db" if option == "mlflow" else "")
    cfg = compose(*[o for o in overrides if o], smoke=smoke)
    if group == "trainer":
        check_trainer(read(cfg).trainer)
        assert read(cfg).trainer.epochs >= 1
    elif group == "hardware":
        hardware.validate(OmegaConf.to_object(cfg.hardware))
    elif group == "data/augment":
        transform = REGISTRIES[group].build(read(cfg).section("data")["augment"], img_size=32)
        out = transform(Image.new("RGB", (40, 30)), np.random.default_rng(0))
        assert out.shape == (3, 32, 32) and out.dtype == np.float32
    elif group in ("optimizer", "optimizer/kernel"):  # a kernel preset is merged into `optimizer`
        if group == "optimizer/kernel":
            assert cfg.optimizer.kernel == OmegaConf.load(CONF_DIR / group / f"{option}.yaml").kernel
        optimizer = REGISTRIES["optimizer"].build(read(cfg).section("optimizer"), model=_tiny_model())
        assert isinstance(optimizer, nn.Optimizer)
    elif group == "scheduler":
        lr = REGISTRIES[group].build(read(cfg).section(group), base_lr=1e-3, epochs=3, steps_per_epoch=4)
        assert lr.shape == (12,) and lr.max() <= 1e-3 + 1e-9
    elif group == "experiment":  # a global preset: it must compose and its model must fit its data
        model = REGISTRIES["model"].build(read(cfg).section("model"))
        assert model.num_classes == cfg.data.num_classes
    elif group in ("model/rewrites", "model/formulation"):  # a preset of model switches, merged into `model`
        preset = OmegaConf.load(CONF_DIR / group / f"{option}.yaml")
        assert all(cfg.model[k] == v for k, v in preset.items() if k != "defaults")
        assert REGISTRIES["model"].build(read(cfg).section("model")) is not None
    elif group in ("hparams_search", "sweep"):  # every searched or swept key is a key or a group of the config
        swept = OmegaConf.load(CONF_DIR / group / f"{option}.yaml").hydra.sweeper.params
        assert swept and all(OmegaConf.select(cfg, key) is not None or (CONF_DIR / key).is_dir() for key in swept)
    elif group == "data":
        spec = REGISTRIES[group].build({k: v for k, v in read(cfg).section(group).items() if k != "augment"})
        assert spec.num_classes == cfg.data.num_classes
    else:
        assert REGISTRIES[group].build(read(cfg).section(group)) is not None


@pytest.mark.parametrize("preset,formulation", [("cpu", "cpu"), ("cpu2", "cpu"), ("ascend8", "ascend"),
                                               ("ascend8x2", "ascend"), ("gpu8", "gpu")])
def test_hardware_preset_picks_its_formulation_and_the_command_line_wins(
        compose: Callable[..., DictConfig], preset: str, formulation: str) -> None:
    switches = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "formulation" / f"{formulation}.yaml"))
    cfg = compose(f"hardware={preset}")
    assert {key: cfg.model[key] for key in switches} == switches
    cfg = compose(f"hardware={preset}", "model.rel_pos_bias=onehot", "model/rewrites=official")
    assert (cfg.model.qkv, cfg.model.patch_merging, cfg.model.rel_pos_bias) == ("fused", "slice", "onehot")
    assert cfg.model.custom_bprop == switches["custom_bprop"]


@pytest.mark.parametrize("threads,expected", [(None, "cores"), (3, 3)])
def test_cpu_kernels_run_one_thread_per_core_of_the_process_unless_told(monkeypatch: pytest.MonkeyPatch,
                                                                      threads: int | None, expected) -> None:
    import os

    import mindspore as ms

    calls: list[int] = []
    monkeypatch.setattr(ms.device_context.cpu.op_tuning, "threads_num", calls.append)
    hardware.set_cpu_threads(threads)
    assert calls == [len(os.sched_getaffinity(0)) if expected == "cores" else expected]


def test_model_follows_the_data(compose: Callable[..., DictConfig]) -> None:
    cfg = compose("data.num_classes=4", "data.img_size=32")
    assert cfg.model.num_classes == 4 and cfg.model.img_size == 32


def test_unknown_model_key_names_key_and_component(compose: Callable[..., DictConfig]) -> None:
    with pytest.raises(ConfigError, match=r"model.embed_dims is not a parameter of model 'swin_micro'.*"
                                          r"Did you mean 'model.embed_dim'"):
        build_experiment(resolve(compose("+model.embed_dims=64")))


def test_missing_mandatory_data_root_says_how_to_set_it(compose: Callable[..., DictConfig]) -> None:
    cfg = compose("data=imagefolder", smoke=False)
    with pytest.raises(ConfigError, match=r"data.root"):
        build_experiment(resolve(cfg))


def test_mistyped_trainer_key_fails_at_compose(compose: Callable[..., DictConfig]) -> None:
    with pytest.raises(Exception, match="epochz"):
        compose("trainer.epochz=3")
    with pytest.raises(Exception, match="trainer.epochs"):
        compose("trainer.epochs=many")


def test_bad_group_option_lists_the_available_options(compose: Callable[..., DictConfig]) -> None:
    with pytest.raises(Exception, match=r"(?s)model/swin_tiyn.*swin_micro.*swin_tiny"):
        compose("model=swin_tiyn")


def test_inconsistent_head_and_data_is_rejected(compose: Callable[..., DictConfig]) -> None:
    with pytest.raises(ConfigError, match="model.num_classes=7 but data 'synthetic' has 10 classes"):
        build_experiment(resolve(compose("model.num_classes=7")))


@pytest.mark.parametrize("model,native", [("swin_micro", 64), ("swin_tiny", 224), ("swin_base", 224),
                                          ("swin_base_384", 384)])
def test_the_model_decides_the_resolution_unless_the_data_sets_it(compose: Callable[..., DictConfig], model: str,
                                                                   native: int) -> None:
    """`python run.py model=swin_tiny` trains at 224 px (the embedded data drawn at that size) without another key;
    an explicit data.img_size is what the model follows."""
    plan = read(compose(f"model={model}", smoke=False))
    assert plan.get("data.img_size") == plan.get("model.img_size") == native
    plan = read(compose(f"model={model}", "data.img_size=448", smoke=False))
    assert plan.get("data.img_size") == plan.get("model.img_size") == 448
    assert plan.follows["model.img_size"] == "data.img_size"  # an error about it names the key to change


def test_the_mission_command_resolves_at_the_models_resolution(compose: Callable[..., DictConfig]) -> None:
    plan = resolve(compose("model=swin_tiny", "amp=o1_manual", "hardware=ascend8", smoke=False), backend=False)
    assert (plan.get("model.img_size"), plan.get("data.img_size"), plan.hardware.num_devices) == (224, 224, 8)
