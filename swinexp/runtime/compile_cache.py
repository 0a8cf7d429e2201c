"""MindSpore's compile cache, made safe to share between the jobs of a sweep (`hardware.compile_cache=true`).

MindSpore (`MS_COMPILER_CACHE_ENABLE`) keys its cache by the hash of the entry script's source files only and
matches graphs by the order in which a process compiles them: a job whose constants differ (clip value, shapes,
weight decay) silently runs the graphs of the job that wrote the cache (BENCHMARKS.md has the reproduction). So:

- each configuration gets its own directory, named by a hash of everything that shapes the compiled graphs: the
  resolved config minus HOST_ONLY (the keys only the host reads: seed, data paths and augmentation, tracking,
  checkpointing, ...), swinexp's own source and the MindSpore version;
- a job never writes into a shared directory: it compiles into a private one and, when it exits, renames that to
  the configuration's directory if none exists yet (a rename is atomic, so a reader never sees a half-written
  cache); a job that finds the directory works on a private copy of it.

The step functions are compiled as Cells (`engine.step.GraphStep`), whose parameters MindSpore binds to a loaded
graph; a plain jitted function would run a cached graph on uninitialized weights.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import mindspore as ms

from swinexp.config import Plan, thaw
from swinexp.registry import ConfigError

__all__ = ["HOST_ONLY", "cache_key", "compiling", "default_root", "enable"]

log = logging.getLogger("swinexp")

# dotted config keys that never reach a compiled graph: the random draws are inputs of the step (models/randomness),
# targets and augmentation are made on the host, the rest is bookkeeping
HOST_ONLY = ("seed", "tracking", "debug", "dry_run", "inspect", "optimized_metric",
             "data.root", "data.num_workers", "data.augment", "data.pipeline", "data.crop_pct", "data.generator_seed",
             "trainer.stop_after_epoch", "trainer.progress_bar", "trainer.resume", "trainer.resume_force",
             "trainer.checkpoint", "trainer.max_nonfinite", "trainer.profile", "trainer.label_smoothing",
             "hardware.master_addr", "hardware.master_port", "hardware.node_rank", "hardware.log_dir",
             "hardware.compile_cache", "hardware.compile_cache_dir")


def default_root() -> Path:
    """$XDG_CACHE_HOME/swinexp/compile, else ~/.cache/swinexp/compile."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swinexp" / "compile"


def _source_digest() -> str:
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]  # swinexp/
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(plan: Plan) -> str:
    """16 hex digits naming the compiled graphs of `plan`: equal exactly when everything that shapes them is."""
    tree = thaw(plan.values)
    for dotted in HOST_ONLY:
        _drop(tree, dotted)
    payload = json.dumps({"config": tree, "mindspore": ms.__version__, "swinexp": _source_digest()},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _drop(tree: dict, dotted: str) -> None:
    """Remove the key `dotted` ("trainer.checkpoint") from the nested dict `tree`, if it is there."""
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree.get(part)
        if not isinstance(tree, dict):
            return
    tree.pop(leaf, None)


_loading = False  # this process found its configuration's graphs in the cache
# the configuration whose cache this process uses: MindSpore reads MS_COMPILER_CACHE_PATH once, at the process's
# first cached compile, and numbers the graphs from there (MS_COMPILER_CACHE_ENABLE it reads at every compile)
_fixed: Path | None = None


def compiling(graph: str) -> str:
    """What a first call of `graph` does in this process, in a few words for a progress bar."""
    return f"loading {graph} from the compile cache" if _loading else f"compiling {graph}"


def enable(plan: Plan) -> Path | None:
    """Point MindSpore's compile cache at this configuration's graphs; call before the first graph compiles.

    Returns:
        The configuration's cache directory (filled when this process exits, if it was not there yet), or None
        when `hardware.compile_cache` is off.
    """
    global _loading, _fixed
    hw = plan.hardware
    if _fixed is not None:  # a later job of this process (hydra/launcher=basic): its graphs must not go there
        os.environ["MS_COMPILER_CACHE_ENABLE"] = "0"
        _loading = False
        if hw.compile_cache:
            log.warning("hardware.compile_cache: off for this job. MindSpore fixes its cache directory at a "
                        "process's first cached compile, and an earlier job of this process took it (%s); the "
                        "default launcher (hydra/launcher=isolated) runs every job in its own process",
                        _fixed)
        return None
    if not hw.compile_cache:
        return None
    entry = ms.graph.api.entry_script_path  # sys.argv[0] when MindSpore was imported
    if entry is None or not os.path.isfile(entry):
        raise ConfigError(f"hardware.compile_cache=true needs the entry script as a file (MindSpore reads it for "
                          f"its cache), but this process started from {entry or 'no script'} (python -c or an "
                          "interactive shell): run `python run.py ...` or `swinexp ...`, or set "
                          "hardware.compile_cache=false")
    root = Path(hw.compile_cache_dir or default_root()).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    shared = root / cache_key(plan)
    private = Path(tempfile.mkdtemp(prefix=f".{shared.name}-", dir=root))
    found = shared.is_dir()
    if found:
        shutil.copytree(shared, private, dirs_exist_ok=True)
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
    os.environ["MS_COMPILER_CACHE_PATH"] = str(private)
    _loading, _fixed = found, shared
    atexit.register(_publish, private, shared)
    log.info("hardware.compile_cache: %s compiled graphs of this configuration in %s", "loading the" if found
             else "no", shared)
    return shared


def _publish(private: Path, shared: Path) -> None:
    """Make `private` the configuration's cache if it holds graphs and none is there yet; else discard it."""
    try:
        if not shared.exists() and any(private.rglob("*.mindir")):
            os.rename(private, shared)
            return
    except OSError:  # another job published first
        pass
    shutil.rmtree(private, ignore_errors=True)
