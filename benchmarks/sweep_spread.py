"""The largest per-epoch difference of each metric between the jobs of a sweep (how far apart its curves are).

    python -m benchmarks.sweep_spread --tracking-uri sqlite:////tmp/droppath_sweep.db [--sweep ID|latest]

For a sweep whose jobs compute the same function with the same draws (sweeps/index_rewrites.yaml in fp32), this
is the effect of floating-point reassociation alone.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from mlflow.tracking import MlflowClient

from swinexp.tracking import resolve_uri
from swinexp.tracking.report import children, find_parent, history

METRICS = ("train/loss", "val/loss", "val/top1")


def spread(per_run: list[dict[int, float]]) -> tuple[float, int]:
    """max over the epochs all runs logged of (max - min across runs), and the epoch where it occurs."""
    epochs = sorted(set.intersection(*(set(h) for h in per_run)))
    gaps = [(max(h[e] for h in per_run) - min(h[e] for h in per_run), e) for e in epochs]
    return max(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default=None, help="default: sqlite:///mlflow.db in this directory")
    parser.add_argument("--experiment", default="swinexp")
    parser.add_argument("--sweep", default="latest", help="the sweep's parent run id, or 'latest'")
    args = parser.parse_args()
    client = MlflowClient(resolve_uri(args.tracking_uri, Path.cwd()))
    experiment = client.get_experiment_by_name(args.experiment)
    parent = find_parent(client, experiment.experiment_id, args.sweep)
    runs = children(client, experiment.experiment_id, parent.info.run_id)
    print(f"sweep {parent.info.run_name}: {len(runs)} jobs ({', '.join(r.info.run_name for r in runs)})")
    for metric in METRICS:
        gap, epoch = spread([history(client, r, metric) for r in runs])
        print(f"{metric}: largest difference between jobs {gap:.6g} (epoch {epoch})")


if __name__ == "__main__":
    main()
