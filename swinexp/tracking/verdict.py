"""Is a gap between two arms of a sweep real? Paired-seed intervals and a verdict in words.

Runs are determined by their seed (initial weights, data order, augmentation draws), so two arms that share a seed
are paired: the per-seed difference cancels most of the seed-to-seed spread, and a paired interval is much tighter
than an unpaired one from the same runs. Pure Python plus SciPy's t quantile; no MLflow here (report.py reads the
store and calls `compare`).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy.special import stdtrit  # the Student t quantile, what scipy.stats.t.ppf calls, for a real-valued df

CONFIDENCE = 0.95
MARGIN = 0.5        # points: a gap inside ±MARGIN counts as "equal" (default of `compare` and the report)
MAX_SEEDS = 10_000  # seeds_needed gives up above this: the gap is too small for its noise to ever resolve
METHOD = (f"Method: per arm, the difference to the baseline on each seed both ran (paired: same weights, data order "
          f"and augmentation); mean ± t(0.975, n−1)·sd/√n, a {CONFIDENCE:.0%} Student interval assuming the per-seed "
          "differences are independent and roughly normal; beside it the unpaired Welch interval of the two arms' "
          "means. real: the paired interval excludes 0; equal within ±m: it lies inside ±m; else undecided.")

Seed = str


@dataclass(frozen=True)
class Interval:
    """A gap's estimate and its two-sided interval."""

    mean: float
    lo: float
    hi: float

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2


@dataclass(frozen=True)
class Gap:
    """One arm against the baseline arm at one epoch."""

    arm: str
    baseline: str
    seeds: tuple[Seed, ...]          # the paired seeds the interval uses
    mean: float | None               # mean paired difference (arm − baseline); None without a paired seed
    paired: Interval | None          # None below 2 paired seeds
    unpaired: Interval | None        # Welch, over each arm's valid seeds; None below 2 seeds in either arm
    verdict: str                     # "real", "equal within ±m" or "undecided"
    reason: str                      # why undecided, and what would decide it; '' otherwise
    seeds_needed: int | None         # paired seeds that would resolve the observed gap at the observed noise
    excluded: tuple[str, ...]        # the seeds left out of the pairing, each with why


def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t with `df` degrees of freedom (df may be fractional, as Welch's is)."""
    if df <= 0:
        raise ValueError(f"t quantile needs df > 0, got {df}")
    return float(stdtrit(df, p))


def paired_interval(diffs: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """mean(d) ± t((1+c)/2, n−1)·sd(d)/√n over the per-seed differences `diffs` (at least 2)."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"a paired interval needs 2 or more differences, got {n}")
    mean = statistics.fmean(diffs)
    half = t_quantile((1 + confidence) / 2, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half)


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """mean(a) − mean(b) ± t·√(va/na + vb/nb), with Welch–Satterthwaite degrees of freedom (each side ≥ 2 values)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"a Welch interval needs 2 or more values per arm, got {len(a)} and {len(b)}")
    ea, eb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)  # squared standard errors
    mean = statistics.fmean(a) - statistics.fmean(b)
    if ea + eb == 0:  # both arms constant over their seeds: no spread to widen the gap by
        return Interval(mean, mean, mean)
    df = (ea + eb) ** 2 / (ea**2 / (len(a) - 1) + eb**2 / (len(b) - 1))
    half = t_quantile((1 + confidence) / 2, df) * math.sqrt(ea + eb)
    return Interval(mean, mean - half, mean + half)


def decide(interval: Interval, margin: float = MARGIN) -> str:
    """'real' if the interval excludes 0, 'equal within ±margin' if it lies inside ±margin, else 'undecided'."""
    if interval.lo > 0 or interval.hi < 0:
        return "real"
    if -margin <= interval.lo and interval.hi <= margin:
        return f"equal within ±{margin:g}"
    return "undecided"


def seeds_needed(mean: float, sd: float, margin: float = MARGIN, confidence: float = CONFIDENCE) -> int | None:
    """The fewest paired seeds n at which a gap of `mean` at per-seed noise `sd` gets a verdict.

    A precision calculation with the observed values plugged in: with h(n) = t((1+c)/2, n−1)·sd/√n the interval's
    half-width, n is the smallest n ≥ 2 with h(n) < |mean| (the interval would exclude 0: real) or
    h(n) ≤ margin − |mean| (it would lie inside ±margin: equal). It assumes the next seeds show the same mean and
    sd; if the true gap is the observed one, about half of such repeats decide (no power margin). None above
    MAX_SEEDS (a gap at the margin's edge never resolves).
    """
    if sd == 0:
        return 2
    for n in range(2, MAX_SEEDS + 1):
        half = t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
        if half < abs(mean) or half <= margin - abs(mean):
            return n
    return None


def _seed_order(seed: Seed) -> tuple[int, float | str]:
    try:
        return (0, float(seed))
    except ValueError:
        return (1, seed)


def gap(arm: str, baseline: str, values: Mapping[str, Mapping[Seed, float]],
        excluded: Mapping[str, Mapping[Seed, str]] | None = None, margin: float = MARGIN) -> Gap:
    """`arm` against `baseline` over the seeds both have a valid value for.

    Args:
        arm: The compared arm's name (a key of `values`).
        baseline: The baseline arm's name.
        values: arm -> seed -> the metric at the screening epoch, valid runs only.
        excluded: arm -> seed -> why that run's value is not in `values` (failed, no value at the epoch, ...).
        margin: Gaps whose interval lies inside ±margin are "equal within ±margin".
    """
    excluded = excluded or {}
    mine, base = values.get(arm, {}), values.get(baseline, {})
    seeds = tuple(sorted(set(mine) & set(base), key=_seed_order))
    left_out = []
    for seed in sorted(set(mine) ^ set(base) | set(excluded.get(arm, {})) | set(excluded.get(baseline, {})),
                       key=_seed_order):
        for name, have in ((arm, mine), (baseline, base)):
            if seed not in have:
                why = excluded.get(name, {}).get(seed, "no run")
                left_out.append(f"seed {seed}: {name} {why}")
    diffs = [mine[s] - base[s] for s in seeds]
    unpaired = (welch_interval(list(mine.values()), list(base.values()))
                if len(mine) >= 2 and len(base) >= 2 else None)
    common = dict(arm=arm, baseline=baseline, seeds=seeds, unpaired=unpaired, excluded=tuple(left_out))
    if len(diffs) < 2:
        reason = (f"only {len(diffs)} paired seed{'' if len(diffs) == 1 else 's'}, and the gap's seed-to-seed noise "
                  "needs 2 or more: run both arms on the same seeds, e.g. seed=0,1,2")
        return Gap(**common, mean=diffs[0] if diffs else None, paired=None, verdict="undecided", reason=reason,
                   seeds_needed=None)
    paired = paired_interval(diffs)
    verdict = decide(paired, margin)
    needed, reason = None, ""
    if verdict == "undecided":
        sd = statistics.stdev(diffs)
        needed = seeds_needed(paired.mean, sd, margin)
        reason = (f"~{needed} paired seeds would resolve a gap of {paired.mean:+.2f} at this noise (sd {sd:.2f})"
                  if needed is not None else
                  f"a gap of {paired.mean:+.2f} at noise sd {sd:.2f} would need more than {MAX_SEEDS} seeds")
    return Gap(**common, mean=paired.mean, paired=paired, verdict=verdict, reason=reason, seeds_needed=needed)


def compare(values: Mapping[str, Mapping[Seed, float]], baseline: str | None = None,
            excluded: Mapping[str, Mapping[Seed, str]] | None = None, margin: float = MARGIN) -> list[Gap]:
    """Every arm against `baseline` (default: the first arm of `values`), in `values`' order.

    Raises:
        ValueError: `baseline` is not one of the arms.
    """
    arms = list(dict.fromkeys([*values, *(excluded or {})]))
    if not arms:
        return []
    baseline = arms[0] if baseline is None else baseline
    if baseline not in arms:
        raise ValueError(f"baseline '{baseline}' is not an arm of this sweep; choose one of: {', '.join(arms)}")
    return [gap(arm, baseline, values, excluded, margin) for arm in arms if arm != baseline]
