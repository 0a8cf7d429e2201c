"""What each chip can compute: the one place swinexp keeps a vendor fact about a card, with the document it rests on.

Everything that depends on the card reads `CHIPS` — the overflow check, the Ascend operator precision mode and HF32
switches each amp policy resolves to, the bf16 check, the dry run, the self-check, the isolated launcher's device
groups and the README's per-chip table (`policy_table`, kept equal by tests/test_chips.py).

Sources, cited per field below by their short names:
- [aclnnMatmul]: CANN operator API pages aclnnMatmul / aclnnMm / aclnnBatchMatMul / aclnnConvolution, parameter
  `cubeMathType`: 0 KEEP_DTYPE "when the input is FLOAT, the Cube unit of the Atlas training series does not support
  it; 0 raises an error"; 1 ALLOW_FP32_DOWN_PRECISION "FLOAT is computed as FLOAT16 on the Atlas training series, as
  HFLOAT32 on the Atlas A2 training series"; BFLOAT16 inputs "only on Atlas A2 training series" (CANN 8.0 / 8.1
  community edition, hiascend.com .../apiref/aolapi/context/aclnnMatmul.md).
- [op_api_util]: MindSpore's `transform/acl_ir/op_api_util.cc`, `kCubeMathType`: precision_mode
  must_keep_origin_dtype -> KEEP_DTYPE; allow_fp32_to_fp16, allow_mix_precision(_fp16/_bf16), allow_fp32_to_bf16 ->
  ALLOW_FP32_DOWN_PRECISION; force_fp16 -> FORCE_FP16; a mode not in that table (force_fp32) falls back to
  (hf32 allowed, SoC keeps dtype): 910 -> FORCE_FP16, 910B MatMul -> KEEP_DTYPE, 910B Conv (HF32 on) -> FORCE_HF32.
- [precision_mode]: MindSpore's default operator precision mode: allow_fp32_to_fp16 on the Atlas training series,
  must_keep_origin_dtype on ascend910b / ascend910_93 (`UpdatePrecisionOptions` in ge_utils.cc and
  `SetAclOpPrecisionMode`; the Chinese page of `mindspore.device_context.ascend.op_precision.precision_mode` says the
  same, its English docstring says force_fp16); `matmul_allow_hf32` default off, `conv_allow_hf32` default on (their
  docstrings in MindSpore 2.10).
- [gpu_op_precision]: MindSpore `mindspore.device_context.gpu.op_precision`: `matmul_allow_tf32` default off,
  `conv_allow_tf32` default on.
- [overflow_mode]: CANN `aclrtFloatOverflowMode` (CANN 9.1.0 runtime API, aclcppdevg_03_1389): the Atlas training
  series supports only the saturation mode; Atlas A2/A3 default to Inf/NaN mode. MindSpore's
  MS_ASCEND_CHECK_OVERFLOW_MODE (SATURATION_MODE | INFNAN_MODE, default INFNAN_MODE) is for Atlas A2 only
  (env_var_list).
- [ms_amp]: MindSpore 2.10 `mindspore/amp.py`: `_ascend_910a_target()` is
  `ascend_soc_supports_feature("amp_loss_scale_train_classic_target")` (true on the first-generation 910 only),
  `_ascend_910b_target()` is `ascend_soc_supports_feature("train_hq_dtype_line")`.
- [hccs]: the first-generation 910 (Atlas training series, 8 cards per server): cards 0-3 and 4-7 form two HCCS
  networks; a job uses 1, 2, 4 or 8 cards, and 2 or 4 of them must lie in one network. CANN's TensorFlow migration
  guide, "Precautions" before distributed training (tfmigr1_000028, TensorFlowCommercial 8.0.0); MindSpore model zoo
  `utils/hccl_tools/README.md` ("the first four chips are a group, and the last four chips are a group"). Physical
  card numbers, as ASCEND_RT_VISIBLE_DEVICES takes them.
- [soc_names]: MindSpore's `SetContextSocVersion` (Ascend device context): aclrtGetSocName Ascend910A/ProA/ProB/
  PremiumA -> ascend910; Ascend910B1..B4 -> ascend910b; Ascend910_93xx -> ascend910_93.
- [versions]: MindSpore's install pages (mindspore-ai/docs install/mindspore_ascend_install_pip*.md, release_list)
  name one CANN per release and no hardware: 2.3.0 CANN 8.0.RC2, 2.4.0 8.0.RC3, 2.5.0 8.0.0, 2.6.0 8.1.RC1; the
  MindSpore Transformers install page adds 2.7.0 8.2.RC1, 2.7.1 8.3.RC1, 2.7.2 8.5.0, 2.9.0 9.0.0 and lists only
  Atlas A2/A3 hardware. No MindSpore page says whether its releases still support the Atlas training series; CANN 8.5.0
  still ships the Atlas training series kernels (Ascend-cann-kernels-910).
"""
from __future__ import annotations

from dataclasses import dataclass

from swinexp.registry import ConfigError

SATURATION, INF_NAN = "saturation", "inf_nan"


@dataclass(frozen=True)
class Chip:
    """One chip's facts.

    Attributes:
        name: MindSpore's name (`MSContext.get_ascend_soc_version()`: ascend910, ascend910b, ascend910_93), or the
            device target in lower case for gpu and cpu.
        product: the product family, as the vendor names it.
        fp32_cube: MatMul/BatchMatMul/Conv can take fp32 inputs and compute in fp32 [aclnnMatmul].
        bf16: bfloat16 kernels exist [aclnnMatmul].
        overflow_modes: how fp16 overflow shows, default first [overflow_mode]: `saturation` (+-65504, nan -> 0; only
            the float status register tells) or `inf_nan`.
        keep_fp32_precision_mode: the Ascend operator precision mode under which an fp32 graph op stays as fp32 as
            the chip can: must_keep_origin_dtype where the Cube unit computes fp32, allow_fp32_to_fp16 where it
            cannot (Cube ops take fp16 inputs with fp32 accumulation, vector ops keep fp32) [precision_mode,
            op_api_util]. None off Ascend.
        default_precision_mode: what MindSpore sets when nobody asks [precision_mode].
        hf32_defaults: (MatMul, Conv) lowered to HF32 (Ascend) / TF32 (GPU) by default [precision_mode,
            gpu_op_precision]; swinexp turns both off so fp32 means fp32 where the chip has it.
        cube_fp32_as: what an fp32 Cube op computes in under `keep_fp32_precision_mode`.
        hccs_groups: device ids that form one interconnect network (a 2- or 4-card job stays inside one) [hccs];
            None where any set of cards works.
        hccs_card_counts: the card counts a job may use with those networks [hccs].
        software: the MindSpore/CANN releases that support this chip [versions].
    """

    name: str
    product: str
    fp32_cube: bool
    bf16: bool
    overflow_modes: tuple[str, ...]
    keep_fp32_precision_mode: str | None
    default_precision_mode: str | None
    hf32_defaults: tuple[bool, bool]
    cube_fp32_as: str
    hccs_groups: tuple[tuple[int, ...], ...] | None = None
    hccs_card_counts: tuple[int, ...] | None = None
    software: str = ""

    @property
    def saturates(self) -> bool:
        """fp16 overflow saturates by default: `isfinite` cannot see it, the status register must be read."""
        return self.overflow_modes[0] == SATURATION

    @property
    def ascend(self) -> bool:
        return self.keep_fp32_precision_mode is not None

    def row(self) -> str:
        """One line for the self-check and the dry run."""
        cube = "yes" if self.fp32_cube else "no (fp16 inputs, fp32 accumulation)"
        return (f"{self.name} ({self.product}): fp32 Cube {cube}, bf16 {'yes' if self.bf16 else 'no'}, overflow "
                f"{'/'.join(self.overflow_modes)}"
                + (f", fp32 precision mode {self.keep_fp32_precision_mode}" if self.ascend else "")
                + (f"; {self.software}" if self.software else ""))


CHIPS: dict[str, Chip] = {chip.name: chip for chip in (
    Chip("ascend910", "Atlas training series (first-generation Ascend 910)", fp32_cube=False, bf16=False,
         overflow_modes=(SATURATION,), keep_fp32_precision_mode="allow_fp32_to_fp16",
         default_precision_mode="allow_fp32_to_fp16", hf32_defaults=(False, False), cube_fp32_as="fp16",
         hccs_groups=((0, 1, 2, 3), (4, 5, 6, 7)), hccs_card_counts=(1, 2, 4, 8),
         software="not stated by MindSpore for any release (its install pages name no hardware; MindSpore "
                  "Transformers lists only Atlas A2/A3); CANN 8.5.0 still ships kernels for it: use a MindSpore/CANN "
                  "pair from MindSpore's install page and run the self-check first"),
    Chip("ascend910b", "Atlas A2 training series (Ascend 910B)", fp32_cube=True, bf16=True,
         overflow_modes=(INF_NAN, SATURATION), keep_fp32_precision_mode="must_keep_origin_dtype",
         default_precision_mode="must_keep_origin_dtype", hf32_defaults=(False, True), cube_fp32_as="fp32",
         software="the platform of MindSpore Transformers' install pages: a MindSpore release with the CANN its "
                  "install page names (2.6.0: 8.1.RC1, 2.7.2: 8.5.0, 2.9.0: 9.0.0)"),
    Chip("ascend910_93", "Atlas A3 training series (Ascend 910C)", fp32_cube=True, bf16=True,
         overflow_modes=(INF_NAN, SATURATION), keep_fp32_precision_mode="must_keep_origin_dtype",
         default_precision_mode="must_keep_origin_dtype", hf32_defaults=(False, True), cube_fp32_as="fp32",
         software="listed by MindSpore Transformers (Atlas 900 A3 SuperPoD): a MindSpore release with the "
                  "CANN its install page names (2.7.2: 8.5.0, 2.9.0: 9.0.0)"),
    Chip("gpu", "NVIDIA GPU", fp32_cube=True, bf16=True, overflow_modes=(INF_NAN,), keep_fp32_precision_mode=None,
         default_precision_mode=None, hf32_defaults=(False, True), cube_fp32_as="fp32",
         software="MindSpore's GPU build (CUDA 11.x)"),
    Chip("cpu", "CPU", fp32_cube=True, bf16=False, overflow_modes=(INF_NAN,), keep_fp32_precision_mode=None,
         default_precision_mode=None, hf32_defaults=(False, False), cube_fp32_as="fp32"),
)}
ASCEND_CHIPS = tuple(name for name, chip in CHIPS.items() if chip.ascend)
FIRST_GENERATION = "ascend910"


def check_name(chip: str | None, device_target: str) -> None:
    """hardware.chip names an Ascend card this table knows, on an Ascend device target (or is null)."""
    if chip is None:
        return
    if device_target != "Ascend":
        raise ConfigError(f"hardware.chip={chip} names an Ascend card, but hardware.device_target={device_target}; "
                          "set hardware.chip=null")
    if chip not in ASCEND_CHIPS:
        raise ConfigError(f"hardware.chip='{chip}' is not a known Ascend card; choose one of: "
                          f"{', '.join(ASCEND_CHIPS)} (ascend910 = the first-generation 910 of the Atlas training "
                          "series), or null to read it from the card")


OVERFLOW_CHECKS = ("auto", "isfinite", "status_register")  # hardware.overflow_check; amp/overflow.py implements them


def check_overflow(check: str, device_target: str) -> None:
    """hardware.overflow_check is a known name that this device can have."""
    if check not in OVERFLOW_CHECKS:
        raise ConfigError(f"hardware.overflow_check='{check}' is not valid; choose one of: "
                          f"{', '.join(OVERFLOW_CHECKS)}")
    if check == "status_register" and device_target != "Ascend":
        raise ConfigError(f"hardware.overflow_check=status_register reads an Ascend card's float status register, and "
                          f"hardware.device_target={device_target} has none; use overflow_check=auto (isfinite here)")


def of(device_target: str, chip: str | None) -> Chip | None:
    """The chip a run computes on; None on Ascend while the card has not been read (a dry run without a card)."""
    if device_target != "Ascend":
        return CHIPS[device_target.lower()]
    check_name(chip, device_target)
    return CHIPS[chip] if chip is not None else None
