"""`python -m swinexp ...` is the `swinexp` command (see swinexp.app.cli)."""
import sys
from pathlib import Path

if __name__ == "__main__":
    if not __package__:  # re-run as a file (sweep jobs, msrun workers): its folder must not shadow top-level modules
        sys.path[0] = str(Path(__file__).resolve().parents[1])
    from swinexp.app.cli import main

    main()
