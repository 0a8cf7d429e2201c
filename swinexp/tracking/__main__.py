"""`python -m swinexp.tracking sync --from OFFLINE_URI --to SERVER_URI [--experiment NAME]`."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from swinexp.registry import ConfigError
from swinexp.tracking import resolve_uri
from swinexp.tracking.sync import sync


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m swinexp.tracking", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    replay = commands.add_parser("sync", help="replay the runs of an offline store into a tracking server; "
                                              "running it again adds nothing twice")
    replay.add_argument("--from", dest="source", required=True,
                        help="the offline store (tracking.fallback_uri), e.g. sqlite:///mlflow-offline.db")
    replay.add_argument("--to", dest="target", required=True, help="the store to replay into (tracking.uri), "
                                                                   "e.g. http://127.0.0.1:5000")
    replay.add_argument("--experiment", default=None, help="only this experiment (default: all)")
    args = parser.parse_args(argv)
    cwd = Path(os.getcwd())
    # keep the output to one line per run: no download bars, no "View run at" line per replayed run
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    try:
        results = sync(resolve_uri(args.source, cwd), resolve_uri(args.target, cwd), args.experiment)
    except ConfigError as err:
        raise SystemExit(f"ConfigError: {err}") from None
    for result in results:
        print(result.summary(), flush=True)
    if not results:
        print(f"nothing to sync: {args.source} holds no runs" + (f" in {args.experiment}" if args.experiment else ""))


if __name__ == "__main__":
    main()
