"""An amp policy on a chip: what the card is asked to do (operator precision mode, HF32/TF32 switches) and what the
policy then computes there, named so that a user comparing arms knows which ops differ.

The policy decides which cells compute in fp16; the chip decides what an fp32 MatMul or Conv can be. On a
first-generation Ascend 910 the Cube unit has no fp32 path (runtime/chips.py [aclnnMatmul]): every fp32 MatMul,
BatchMatMul and Conv takes fp16 inputs with fp32 accumulation under every policy, o0 included, while vector ops
(LayerNorm, Softmax, GELU, the loss) keep the policy's dtype. Asking that chip to keep fp32 (must_keep_origin_dtype,
KEEP_DTYPE) raises in the first fp32 MatMul, so `auto` resolves to what each chip can do instead.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from mindspore import nn

from swinexp.amp.policies import AUTO, AmpPolicy
from swinexp.registry import ConfigError
from swinexp.runtime.chips import CHIPS, Chip

# cells computed on the Cube unit: they cannot stay fp32 where the chip has no fp32 Cube math
CUBE_CELLS: tuple[type[nn.Cell], ...] = (nn.Dense, nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class Precision:
    """A policy resolved on a chip.

    Attributes:
        policy: the policy as it runs there (o1_manual's fp32 cells without the Cube cells a chip cannot keep fp32).
        chip: the chip's name; None on Ascend before the card is read (a dry run without a card).
        precision_mode: the Ascend operator precision mode to set; None off Ascend.
        matmul_hf32: allow HF32 (Ascend) / TF32 (GPU) for fp32 MatMuls; None leaves the backend's default.
        conv_hf32: the same for convolutions.
        effective: the policy's name as it computes there, e.g. `o0 (fp32 except Cube inputs: fp16 on ascend910)`.
        notes: what the chip changed and why (the dtype table and the dry run print them).
    """

    policy: AmpPolicy
    chip: str | None
    precision_mode: str | None
    matmul_hf32: bool | None
    conv_hf32: bool | None
    effective: str
    notes: tuple[str, ...] = ()


def name_of(policy: AmpPolicy) -> str:
    """The policy's config name (o0, o1, o1_manual, o2, o3)."""
    return policy.level.lower()


def resolve(policy: AmpPolicy, chip: Chip | None) -> Precision:
    """`policy` on `chip` (None: an Ascend card not read yet), or a ConfigError for a mode the chip cannot run."""
    name, mode = name_of(policy), policy.ascend_precision_mode
    if chip is None:
        _check_mode_somewhere(policy)
        return Precision(policy, None, None if mode == AUTO else mode, None, None,
                         f"{name} (Cube precision read from the card at start)")
    if not chip.ascend:
        _check_mode_somewhere(policy)  # the same config must not mean another thing on a card
        hf32 = False if chip.name == "gpu" else None  # GPU: no TF32 for fp32 MatMul/Conv (Conv defaults to TF32)
        return Precision(policy, chip.name, None, hf32, hf32, name)
    if mode == AUTO:  # HF32 exists only where the Cube unit computes fp32 (CANN's allow_hf32 excludes the 910)
        mode, hf32 = chip.keep_fp32_precision_mode, (False if chip.fp32_cube else None)
    else:
        _check_explicit_mode(policy, chip)
        hf32 = None
    effective, notes = name, []
    if not chip.fp32_cube:
        effective = (f"{name} (fp32 except Cube inputs: fp16 on {chip.name})" if policy.level == "O0"
                     else f"{name} (fp32 Cube inputs: fp16 on {chip.name})")
        policy, dropped = _without_cube_cells(policy)
        if dropped:
            notes.append(f"{', '.join(dropped)} left amp.fp32_cells: {chip.name} has no fp32 Cube unit, so they "
                         "compute in the policy's low precision")
        notes.append(f"{chip.name}: every fp32 MatMul/BatchMatMul/Conv takes fp16 inputs with fp32 accumulation "
                     f"(precision_mode={mode}); vector ops keep their dtype")
    if policy.ascend_precision_mode != AUTO:
        effective += f" [ascend precision_mode={mode}]"
    return Precision(policy, chip.name, mode, hf32, hf32, effective, tuple(notes))


def _without_cube_cells(policy: AmpPolicy) -> tuple[AmpPolicy, list[str]]:
    kept = tuple(t for t in policy.fp32_cells if not issubclass(t, CUBE_CELLS))
    dropped = [t.__name__ for t in policy.fp32_cells if issubclass(t, CUBE_CELLS)]
    return (replace(policy, fp32_cells=kept) if dropped else policy), dropped


def _check_explicit_mode(policy: AmpPolicy, chip: Chip) -> None:
    mode = policy.ascend_precision_mode
    if mode == "must_keep_origin_dtype" and not chip.fp32_cube:
        raise ConfigError(f"amp.ascend_precision_mode=must_keep_origin_dtype asks {chip.name} to compute fp32 "
                          "MatMul/Conv in fp32, which its Cube unit cannot (CANN aclnnMatmul: KEEP_DTYPE with FLOAT "
                          f"inputs raises on the {chip.product}); leave amp.ascend_precision_mode=auto "
                          f"({chip.keep_fp32_precision_mode} there: fp16 Cube inputs, fp32 accumulation)")
    if policy.level == "O0" and mode != chip.keep_fp32_precision_mode:
        raise ConfigError(f"amp=o0 is the fp32 reference, but amp.ascend_precision_mode={mode} on {chip.name} "
                          f"{_what_it_does(mode)}; leave amp.ascend_precision_mode=auto "
                          f"({chip.keep_fp32_precision_mode} on {chip.name}), or pick an fp16 policy (amp=o1_manual, "
                          "o2, ...) to compare low precision")


def _check_mode_somewhere(policy: AmpPolicy) -> None:
    """Before the card is known: refuse an o0 mode that is not fp32 on any Ascend chip."""
    mode = policy.ascend_precision_mode
    keeping = {c.keep_fp32_precision_mode for c in CHIPS.values() if c.ascend}
    if policy.level == "O0" and mode != AUTO and mode not in keeping:
        raise ConfigError(f"amp=o0 is the fp32 reference, but amp.ascend_precision_mode={mode} "
                          f"{_what_it_does(mode)}; leave amp.ascend_precision_mode=auto (it resolves per chip)")


def _what_it_does(mode: str) -> str:
    if mode == "force_fp32":
        return ("is not an fp32 mode: MindSpore maps it to FP16 Cube math on a 910 and to HF32 convolutions on a "
                "910B (op_api_util.cc)")
    return "lets the card compute fp32 operators in 16 bits (or HF32)"


def policy_table(policies: dict[str, AmpPolicy], chips: dict[str, Chip] = CHIPS) -> str:
    """A markdown table of what each policy computes on each chip, and how the chip sees fp16 overflow: the
    README's "per chip" table, generated here so that it cannot drift from the capability table."""
    header = "| amp | " + " | ".join(f"`{name}`" for name in chips) + " |"
    lines = [header, "|---" * (len(chips) + 1) + "|"]
    for name, policy in policies.items():
        cells = []
        for chip in chips.values():
            resolved = resolve(policy, chip)
            setting = ([resolved.precision_mode] if resolved.precision_mode else []) + (
                ["HF32 off" if chip.ascend else "TF32 off"] if resolved.matmul_hf32 is False else [])
            cells.append(f"`{resolved.effective}`" + (f" ({', '.join(setting)})" if setting else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| fp16 overflow seen by | " + " | ".join(
        "float status register (saturates)" if chip.saturates else "inf/nan in the gradients"
        for chip in chips.values()) + " |")
    lines.append("| bfloat16 | " + " | ".join("yes" if chip.bf16 else "no" for chip in chips.values()) + " |")
    return "\n".join(lines)
