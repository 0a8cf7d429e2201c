"""timm-equivalent augmentation: each op against hand-computed pixels, the magnitude mapping, policies, factory."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image

from swinexp.data import create_transform
from swinexp.data.augment import LEVEL_TO_ARG, OPS, AugmentOp, auto_augment_transform, rand_augment_transform, swin
from swinexp.data.auto_augment import POLICIES, RAND_INCREASING_TRANSFORMS, RAND_TRANSFORMS, AugMix, RandAugment
from swinexp.data.erasing import RandomErasing
from swinexp.data.factory import TrainTransform
from swinexp.data.mixup import Mixup
from swinexp.data.transforms import ColorJitter
from swinexp.registry import ConfigError

NEAREST = Image.Resampling.NEAREST
BICUBIC = Image.Resampling.BICUBIC


def _gray(values: np.ndarray) -> Image.Image:
    """An RGB image whose three channels all hold `values` (H, W) uint8."""
    return Image.fromarray(np.repeat(np.asarray(values, np.uint8)[..., None], 3, axis=2))


def _px(img: Image.Image) -> np.ndarray:
    return np.asarray(img)[..., 0].astype(int)


def test_rotate_90_on_a_square_is_a_counter_clockwise_quarter_turn() -> None:
    arr = np.random.default_rng(0).integers(0, 256, (6, 6, 3), dtype=np.uint8)
    out = OPS["Rotate"](Image.fromarray(arr), 90, fillcolor=(1, 2, 3), resample=BICUBIC)
    assert np.array_equal(np.asarray(out), np.rot90(arr))


def test_rotate_fills_uncovered_corners_with_the_fill_colour() -> None:
    out = np.asarray(OPS["Rotate"](Image.new("RGB", (16, 16), (255, 255, 255)), 45, fillcolor=(124, 116, 104),
                                   resample=NEAREST))
    assert tuple(out[0, 0]) == (124, 116, 104) and tuple(out[8, 8]) == (255, 255, 255)


def test_shear_x_shifts_each_row_by_factor_times_its_height() -> None:
    arr = np.zeros((6, 8), np.uint8)
    arr[:, 5] = 255  # a vertical line at x = 5
    out = _px(OPS["ShearX"](_gray(arr), 0.5, fillcolor=(0, 0, 0), resample=NEAREST))
    # output pixel centre (x+.5, y+.5) samples input x + .5 + 0.5 * (y + .5): the line moves left by
    # floor(0.5 * (y + .5) + .5) = 0, 1, 1, 2, 2, 3 pixels in rows 0..5
    assert [int(np.flatnonzero(row == 255)[0]) for row in out] == [5, 4, 4, 3, 3, 2]


def test_shear_y_is_shear_x_transposed() -> None:
    arr = np.zeros((8, 8), np.uint8)
    arr[5, :] = 255
    out = _px(OPS["ShearY"](_gray(arr), 0.5, fillcolor=(0, 0, 0), resample=NEAREST))
    assert [int(np.flatnonzero(col == 255)[0]) for col in out.T][:6] == [5, 4, 4, 3, 3, 2]


def test_translate_rel_moves_content_left_by_pct_of_width_and_fills() -> None:
    arr = np.tile(np.arange(0, 80, 10, dtype=np.uint8), (4, 1))  # columns 0, 10, ..., 70
    out = _px(OPS["TranslateXRel"](_gray(arr), 0.25, fillcolor=(200, 200, 200), resample=NEAREST))
    assert out[0].tolist() == [20, 30, 40, 50, 60, 70, 200, 200]  # 0.25 * 8 = 2 pixels


@pytest.mark.parametrize("name,args,inputs,expected", [
    ("Posterize", (4,), [183, 15, 255, 16], [176, 0, 240, 16]),          # keep the 4 high bits: & 0xF0
    ("PosterizeOriginal", (8,), [183, 1], [183, 1]),                     # 8 bits: unchanged
    ("PosterizeIncreasing", (0,), [183, 255], [0, 0]),                   # 0 bits (M=10, inc1): black
    ("Solarize", (128,), [100, 127, 128, 200], [100, 127, 127, 55]),     # invert where >= 128
    ("SolarizeAdd", (99,), [50, 120, 127, 128, 200], [149, 219, 226, 128, 200]),  # +99 below 128, capped at 255
    ("Invert", (), [0, 100, 255], [255, 155, 0]),
    ("Brightness", (0.5,), [200, 100, 0], [100, 50, 0]),
    ("AutoContrast", (), [50, 100, 150], [0, 127, 255]),                 # (x - 50) * 255 / 100, truncated
])
def test_point_ops_match_hand_computed_values(name: str, args: tuple, inputs: list[int], expected: list[int]) -> None:
    out = OPS[name](_gray(np.array([inputs])), *args, fillcolor=(0, 0, 0), resample=NEAREST)
    assert _px(out)[0].tolist() == expected


def test_equalize_spreads_a_known_histogram_over_the_full_range() -> None:
    values = np.array([10] * 255 + [20] * 255 + [30] * 10).reshape(20, 26)
    # PIL: step = (520 - 10) // 255 = 2; lut[v] = (1 + #pixels below v) // 2 -> 10: 0, 20: 128, 30: 255
    out = _px(OPS["Equalize"](_gray(values)))
    assert {int(v): int(out[values == v][0]) for v in (10, 20, 30)} == {10: 0, 20: 128, 30: 255}


def test_colour_ops_at_identity_and_extreme_factors() -> None:
    img = Image.fromarray(np.array([[[200, 100, 0], [0, 100, 200]]], np.uint8))
    for name in ("Color", "Contrast", "Brightness", "Sharpness"):
        assert np.array_equal(np.asarray(OPS[name](img, 1.0)), np.asarray(img))  # factor 1 is the identity
    gray = np.asarray(OPS["Color"](img, 0.0))
    assert (gray[..., 0] == gray[..., 1]).all() and gray[0, 0, 0] == round(0.299 * 200 + 0.587 * 100)  # ITU-R 601
    assert np.array_equal(np.asarray(OPS["Desaturate"](img, 1.0)), gray)


# timm's arguments at magnitude 9 (positive sign), with hparams translate_const=100, translate_pct default 0.45
TIMM_ARGS_M9 = {
    "AutoContrast": (), "Equalize": (), "Invert": (), "Rotate": (27.0,),
    "Posterize": (3,), "PosterizeIncreasing": (1,), "PosterizeOriginal": (7,),
    "Solarize": (230,), "SolarizeIncreasing": (26,), "SolarizeAdd": (99,),
    "Color": (1.72,), "Contrast": (1.72,), "Brightness": (1.72,), "Sharpness": (1.72,),
    "ColorIncreasing": (1.81,), "ContrastIncreasing": (1.81,), "BrightnessIncreasing": (1.81,),
    "SharpnessIncreasing": (1.81,), "ShearX": (0.27,), "ShearY": (0.27,), "TranslateX": (90.0,),
    "TranslateY": (90.0,), "TranslateXRel": (0.405,), "TranslateYRel": (0.405,),
    # rng=None: the middle of U(0.1, 2 * 0.9)
    "Desaturate": (0.95,), "GaussianBlur": (1.81,), "GaussianBlurRand": (0.95,),
}
SIGNED = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"}


def test_level_to_arg_covers_every_op_with_timms_values_at_m9() -> None:
    assert set(LEVEL_TO_ARG) == set(OPS) == set(TIMM_ARGS_M9)
    for name, expected in TIMM_ARGS_M9.items():
        fn = LEVEL_TO_ARG[name]
        got = fn(9, {"translate_const": 100}, None) if fn else ()
        assert got == pytest.approx(expected), name
        assert all(type(g) is type(e) for g, e in zip(got, expected)), f"{name}: int args must stay int"


def _recording_ops(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple, dict]]:
    calls: list[tuple[str, tuple, dict]] = []
    for name in list(OPS):
        def record(img: Image.Image, *args: Any, _name: str = name, **kw: Any) -> Image.Image:
            calls.append((_name, args, kw))
            return img
        monkeypatch.setitem(OPS, name, record)
    return calls


def test_randaugment_m9_mstd0_passes_timms_argument_to_every_op(monkeypatch: pytest.MonkeyPatch) -> None:
    ra = rand_augment_transform("rand-m9-mstd0-p1.0-inc1", {"translate_const": 100, "img_mean": (124, 116, 104),
                                                            "interpolation": "bicubic"})
    calls = _recording_ops(monkeypatch)
    img = Image.new("RGB", (8, 8))
    signs: dict[str, set[float]] = {}
    for seed in range(12):
        for op in ra.ops:
            op(img, np.random.default_rng(seed))
    for name, args, kw in calls:
        assert kw == {"fillcolor": (124, 116, 104), "resample": BICUBIC}
        if name in SIGNED:  # timm's random sign: +-arg
            assert abs(args[0]) == pytest.approx(TIMM_ARGS_M9[name][0]), name
            signs.setdefault(name, set()).add(float(np.sign(args[0])))
        elif name.endswith("Increasing") and name[:-10] in ("Color", "Contrast", "Brightness", "Sharpness"):
            assert args[0] == pytest.approx(1.81) or args[0] == pytest.approx(0.19), name  # 1 +- 0.81
            signs.setdefault(name, set()).add(float(np.sign(args[0] - 1)))
        else:
            assert args == pytest.approx(TIMM_ARGS_M9[name]), name
    assert len(calls) == 12 * 15  # p1.0: every op fires
    assert all(s == {-1.0, 1.0} for s in signs.values()) and len(signs) == 9


def test_rand_config_string_sets_timms_fields() -> None:
    ra = rand_augment_transform("rand-m9-mstd0.5-inc1", {})
    assert [op.name for op in ra.ops] == list(RAND_INCREASING_TRANSFORMS)
    assert RAND_INCREASING_TRANSFORMS == ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing",
                                          "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing",
                                          "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing",
                                          "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
    assert ra.num_layers == 2 and ra.choice_weights is None
    assert {(op.magnitude, op.prob, op.magnitude_std) for op in ra.ops} == {(9, 0.5, 0.5)}
    plain = rand_augment_transform("rand-n3-m7-p0.2-mmax12-w0", {})
    assert [op.name for op in plain.ops] == list(RAND_TRANSFORMS) and plain.num_layers == 3
    assert {(op.magnitude, op.prob, op.magnitude_max) for op in plain.ops} == {(7, 0.2, 12)}
    assert plain.choice_weights.sum() == pytest.approx(1) and plain.choice_weights[RAND_TRANSFORMS.index("Rotate")] == \
        pytest.approx(0.3 / 1.0)
    assert rand_augment_transform("rand-mstd101", {}).ops[0].magnitude_std == float("inf")
    for bad, message in (("rand-m9-x3", "section 'x3'"), ("rand-inc", "section 'inc'"), ("randm9", "start with")):
        with pytest.raises(ConfigError, match=message):
            rand_augment_transform(bad, {})


def test_magnitude_noise_is_gaussian_and_clipped_to_0_10() -> None:
    op = AugmentOp("Rotate", 1.0, 9, {"magnitude_std": 0.5})
    rng = np.random.default_rng(0)
    draws = np.array([op.sample_magnitude(rng) for _ in range(4000)])
    assert draws.max() == 10.0 and 8.8 < draws.mean() < 9.0 and 0.4 < draws.std() < 0.5  # N(9, .5), top clipped
    uniform = AugmentOp("Rotate", 1.0, 9, {"magnitude_std": float("inf")})
    u = np.array([uniform.sample_magnitude(rng) for _ in range(4000)])
    assert 0 <= u.min() < 0.1 and 8.9 < u.max() <= 9 and 4.3 < u.mean() < 4.7


def test_op_fires_with_its_probability_and_is_reproducible_from_the_rng() -> None:
    img = Image.effect_noise((24, 24), 50).convert("RGB")
    op = AugmentOp("Invert", prob=0.3, magnitude=9)
    fired = sum(not np.array_equal(np.asarray(op(img, np.random.default_rng(s))), np.asarray(img)) for s in range(500))
    assert 120 < fired < 180
    ra = rand_augment_transform("rand-m9-mstd0.5-inc1", {})
    a, b = (np.asarray(ra(img, np.random.default_rng(3))) for _ in range(2))
    assert np.array_equal(a, b)
    assert any(not np.array_equal(a, np.asarray(ra(img, np.random.default_rng(s)))) for s in range(4, 8))


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_runs_at_the_magnitude_extremes(name: str) -> None:
    img = Image.effect_noise((12, 12), 60).convert("RGB")
    for magnitude, hparams in ((0, {}), (10, {}), (30, {"magnitude_max": 30})):  # mmax: M beyond 10 (TF style)
        out = AugmentOp(name, 1.0, magnitude, {"translate_const": 5, **hparams})(img, np.random.default_rng(0))
        assert out.size == img.size and out.mode == "RGB"


def test_unknown_op_name_suggests_the_close_match() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'Rotate'"):
        AugmentOp("Rotat")


def test_autoaugment_policies_follow_timm() -> None:
    assert {len(p) for p in POLICIES.values()} == {25, 3}
    original, originalr = auto_augment_transform("original", {}), auto_augment_transform("originalr-mstd0.5", {})
    assert [(op.name, op.prob, op.magnitude) for op in original.policy[0]] == [("PosterizeOriginal", 0.4, 8),
                                                                              ("Rotate", 0.6, 9)]
    assert originalr.policy[0][0].name == "PosterizeIncreasing" and originalr.policy[0][0].magnitude_std == 0.5
    v0, v0r = auto_augment_transform("v0", {}), auto_augment_transform("v0r", {})
    assert v0.policy[12][0].name == "Posterize" and v0r.policy[12][0].name == "PosterizeIncreasing"
    img = Image.effect_noise((16, 16), 50).convert("RGB")
    assert np.array_equal(np.asarray(v0(img, np.random.default_rng(1))), np.asarray(v0(img, np.random.default_rng(1))))
    with pytest.raises(ConfigError, match="not an AutoAugment policy"):
        auto_augment_transform("v1", {})


def test_create_transform_uses_colour_jitter_only_without_auto_augment() -> None:
    jitter = create_transform(32, is_training=True, color_jitter=0.4)
    assert isinstance(jitter, TrainTransform) and jitter.color == (ColorJitter(0.4, 0.4, 0.4),)
    ra = create_transform(224, is_training=True, color_jitter=0.4, auto_augment="rand-m9-mstd0.5-inc1",
                          interpolation="bicubic")
    (aug,) = ra.color
    assert isinstance(aug, RandAugment)
    # timm's hparams: translate_const = int(0.45 * img_size), fill = round(255 * ImageNet mean)
    assert aug.ops[0].hparams["translate_const"] == 100 and aug.ops[0].hparams["img_mean"] == (124, 116, 104)
    assert create_transform(32, is_training=True, color_jitter=None).color == ()
    assert isinstance(create_transform(32, True, auto_augment="augmix-m5-w4-d2").color[0], AugMix)
    erasing = create_transform(32, True, re_prob=0.25, re_mode="pixel").erasing
    assert erasing == RandomErasing(0.25, mode="pixel", max_count=1)


def test_create_transform_gives_normalized_chw_and_is_reproducible() -> None:
    img = Image.effect_noise((60, 40), 60).convert("RGB")
    train = create_transform(32, True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.5, re_mode="pixel",
                             interpolation="random")
    x = train(img, np.random.default_rng(0))
    assert x.shape == (3, 32, 32) and x.dtype == np.float32
    assert np.array_equal(x, train(img, np.random.default_rng(0)))
    assert train(img).shape == (3, 32, 32)  # timm-style call without a Generator
    eval_x = create_transform(32, False, crop_pct=1.0)(img)
    assert eval_x.shape == (3, 32, 32) and abs(float(eval_x.mean())) < 3


def test_wrong_augment_arguments_name_the_config_key() -> None:
    with pytest.raises(ConfigError, match="data.augment.re_mode='pixels'.*const, rand, pixel"):
        create_transform(32, True, re_mode="pixels")
    with pytest.raises(ConfigError, match="data.augment.interpolation='cubic'"):
        create_transform(32, True, interpolation="cubic")
    with pytest.raises(ConfigError, match="data.augment.mixup_mode='pairs'"):
        swin(32, mixup_mode="pairs")


@pytest.mark.parametrize("mode", ["const", "rand", "pixel"])
def test_random_erasing_fills_one_box_per_mode(mode: str) -> None:
    img = np.full((3, 40, 40), 5.0, np.float32)
    out = RandomErasing(1.0, mode=mode)(img.copy(), np.random.default_rng(1))
    erased = out != 5.0
    ys, xs = np.nonzero(erased.any(axis=0))
    box = erased[:, ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    assert box.all() and erased.sum() == box.size  # one solid rectangle, all channels
    assert 0.02 * 1600 * 0.8 <= box[0].size <= 1600 / 3 * 1.2
    values = out[:, ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    if mode == "const":
        assert (values == 0).all()
    elif mode == "rand":
        assert all(np.unique(values[c]).size == 1 for c in range(3))  # one colour per channel
    else:
        assert values.std() > 0.5 and np.unique(values).size == values.size
    assert np.array_equal(RandomErasing(0.0)(img.copy(), np.random.default_rng(1)), img)


def test_swin_preset_is_the_official_recipe() -> None:
    aug = swin(224, num_classes=1000, label_smoothing=0.1)
    t = aug.transform
    assert t.crop.interpolation == "bicubic" and t.crop.scale == (0.08, 1.0) and t.crop.hflip == 0.5
    assert isinstance(t.color[0], RandAugment) and len(t.color) == 1  # no ColorJitter next to RandAugment
    assert t.erasing == RandomErasing(0.25, mode="pixel", max_count=1)
    assert aug.targets == Mixup(0.8, 1.0, None, 1.0, 0.5, "batch", True, 0.1, 1000)


@pytest.mark.parametrize("mode,max_count", [("const", 1), ("rand", 1), ("pixel", 1), ("pixel", 3), ("rand", 4)])
def test_erasing_draws_applied_equal_timms_random_erasing(monkeypatch: pytest.MonkeyPatch, mode: str,
                                                          max_count: int) -> None:
    torch = pytest.importorskip("torch", reason="the reference extra (torch, timm) is not installed")
    timm_erasing = pytest.importorskip("timm.data.random_erasing")
    from tests.replay import Recorder, Replay

    ours = RandomErasing(0.6, mode=mode, max_count=max_count)
    reference = timm_erasing.RandomErasing(0.6, mode=mode, max_count=max_count, device="cpu")
    img = np.random.default_rng(0).standard_normal((3, 23, 19)).astype(np.float32)
    erased = 0
    for seed in range(16):
        recorder = Recorder(np.random.default_rng([seed, 9]))
        draws = ours.draw(img.shape, recorder)
        fills = [torch.from_numpy(np.ascontiguousarray(ours.fill(draws, r, img.shape)))
                 for r in range(ours.slots) if draws.boxes[r, 2] > 0]
        replay = Replay(recorder, python_randint=True)
        monkeypatch.setattr(timm_erasing, "random", replay)
        monkeypatch.setattr(timm_erasing, "_get_pixels", lambda *args, _fills=fills, **kwargs: _fills.pop(0))
        expected = reference(torch.from_numpy(img.copy())).numpy()
        assert replay.exhausted() and not fills
        assert np.array_equal(ours.erase(img.copy(), draws), expected), (mode, seed)
        erased += bool(draws.boxes[:, 2].any())
    assert 0 < erased < 16


def test_pixel_noise_is_standard_normal_and_keyed() -> None:
    from swinexp.data.erasing import pixel_noise

    index = np.arange(200_000)
    a = pixel_noise(np.array([1, 2]), index)
    assert a.dtype == np.float32 and abs(a.mean()) < 0.01 and abs(a.std() - 1) < 0.01
    assert np.isfinite(a).all() and np.array_equal(a, pixel_noise(np.array([1, 2]), index))
    assert np.corrcoef(a, pixel_noise(np.array([1, 3]), index))[0, 1] < 0.01
