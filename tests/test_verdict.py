"""The verdict statistics (swinexp/tracking/verdict.py) against SciPy's tests and hand-computed fixtures."""
from __future__ import annotations

import pytest
from scipy import stats

from swinexp.tracking.verdict import compare, seeds_needed, t_quantile, welch_interval

# o0 and o2 at epoch 10 of the CIFAR-10 sweep, seeds 0, 1, 2 (o2 − o0 per seed: +0.2, −0.1, 0.0)
O0 = {"0": 31.5, "1": 32.4, "2": 31.8}
O2 = {"0": 31.7, "1": 32.3, "2": 31.8}


@pytest.mark.parametrize("df,tabulated", [(1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)])
def test_t_quantile_matches_the_printed_table(df: int, tabulated: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(tabulated, abs=5e-4)


def test_equal_arms_are_equal_within_the_margin_with_scipys_paired_interval() -> None:
    (gap,) = compare({"amp=o0": O0, "amp=o2": O2})
    ref = stats.ttest_rel(list(O2.values()), list(O0.values())).confidence_interval(0.95)
    assert gap.arm == "amp=o2" and gap.baseline == "amp=o0" and gap.seeds == ("0", "1", "2")
    assert gap.mean == pytest.approx(0.0333, abs=1e-4)
    assert (gap.paired.lo, gap.paired.hi) == pytest.approx((ref.low, ref.high), abs=1e-9)  # about [−0.35, +0.41]
    assert gap.verdict == "equal within ±0.5" and gap.reason == "" and not gap.excluded
    # the same runs unpaired: Welch's interval, as SciPy computes it, and much wider
    welch = stats.ttest_ind(list(O2.values()), list(O0.values()), equal_var=False).confidence_interval(0.95)
    assert (gap.unpaired.lo, gap.unpaired.hi) == pytest.approx((welch.low, welch.high), abs=1e-9)
    assert gap.unpaired.half_width > 2 * gap.paired.half_width


def test_a_planted_three_point_gap_is_real() -> None:
    base = {"1": 40.1, "2": 43.5, "3": 38.0, "4": 41.2}
    arm = {"1": 43.3, "2": 46.4, "3": 41.1, "4": 44.0}  # +3.2, +2.9, +3.1, +2.8 on the same seeds
    gaps = compare({"o0": base, "o1_manual": arm, "o2": dict(base)})
    real, same = gaps
    ref = stats.ttest_rel(list(arm.values()), list(base.values())).confidence_interval(0.95)
    assert real.verdict == "real" and real.mean == pytest.approx(3.0)
    assert (real.paired.lo, real.paired.hi) == pytest.approx((ref.low, ref.high), abs=1e-9)
    # the unpaired interval of the same runs straddles 0: only the pairing makes the gap visible
    assert real.unpaired.lo < 0 < real.unpaired.hi
    assert same.verdict == "equal within ±0.5" and same.paired.lo == same.paired.hi == 0  # identical runs


def test_two_noisy_seeds_are_undecided_and_say_how_many_seeds_would_decide() -> None:
    # differences 0.5 and 2.5: mean 1.5, sd √2, half-width t(0.975, 1)·√2/√2 = 12.71
    (gap,) = compare({"a": {"1": 30.0, "2": 31.0}, "b": {"1": 30.5, "2": 33.5}})
    assert gap.verdict == "undecided" and gap.paired.half_width == pytest.approx(12.706, abs=1e-3)
    # by hand from the t table: n=5: 2.776·√2/√5 = 1.756 ≥ 1.5; n=6: 2.571·√2/√6 = 1.484 < 1.5
    assert gap.seeds_needed == 6
    assert gap.reason == "~6 paired seeds would resolve a gap of +1.50 at this noise (sd 1.41)"


def test_seeds_needed_also_counts_towards_equal_within_the_margin() -> None:
    # a gap of +0.1 at noise 0.3 never gets 'real' soon, but 'equal within ±0.5' once the half-width is ≤ 0.4:
    # n=4: 3.182·0.3/2 = 0.477; n=5: 2.776·0.3/√5 = 0.372
    assert seeds_needed(0.1, 0.3) == 5
    # a gap at the margin's edge can only become 'real': n=17: 2.120/√17 = 0.514; n=18: 2.110/√18 = 0.497
    assert seeds_needed(0.5, 1.0) == 18


def test_failed_and_missing_seeds_are_named_and_left_out_never_averaged() -> None:
    values = {"amp=o0": {"1": 30.0, "2": 31.0, "3": 29.0},
              "amp=o2": {"1": 30.2, "3": 29.1}}  # seed 2 failed, seed 4 of o2 ran but o0's seed 4 has no run
    values["amp=o2"]["4"] = 50.0
    excluded = {"amp=o2": {"2": "FAILED"}}
    (gap,) = compare(values, excluded=excluded)
    assert gap.seeds == ("1", "3")
    assert gap.mean == pytest.approx(0.15)  # (0.2 + 0.1) / 2: neither the failed seed nor the unpaired 50.0
    assert gap.excluded == ("seed 2: amp=o2 FAILED", "seed 4: amp=o0 no run")


def test_fewer_than_two_paired_seeds_is_undecided_with_the_reason() -> None:
    (gap,) = compare({"amp=o0": {"42": 30.0}, "amp=o2": {"42": 31.0}})
    assert gap.verdict == "undecided" and gap.paired is None and gap.unpaired is None and gap.mean == 1.0
    assert gap.seeds_needed is None
    assert gap.reason.startswith("only 1 paired seed, and the gap's seed-to-seed noise needs 2 or more")


def test_a_named_baseline_and_a_wrong_one() -> None:
    gaps = compare({"a": O0, "b": O2}, baseline="b")
    assert [(g.arm, g.baseline) for g in gaps] == [("a", "b")] and gaps[0].mean == pytest.approx(-0.0333, abs=1e-4)
    with pytest.raises(ValueError, match="baseline 'c' is not an arm of this sweep; choose one of: a, b"):
        compare({"a": O0, "b": O2}, baseline="c")


def test_welch_interval_of_constant_arms_is_the_gap_itself() -> None:
    interval = welch_interval([1.0, 1.0], [0.0, 0.0])
    assert (interval.mean, interval.lo, interval.hi) == (1.0, 1.0, 1.0)
