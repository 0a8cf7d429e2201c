"""MindSpore's compile cache, made safe to share between runs and the jobs of a sweep (`hardware.compile_cache`, on
by default).

MindSpore (`MS_COMPILER_CACHE_ENABLE`) keys its cache by the hash of the entry script's source files only and
matches graphs by the order in which a process compiles them: a job whose constants differ (clip value, shapes,
weight decay) silently runs the graphs of the job that wrote the cache (BENCHMARKS.md has the reproduction). So:

- each configuration gets its own directory, named by a hash of everything that shapes the compiled graphs: the
  resolved config minus HOST_ONLY (the keys only the host reads: seed, data paths and augmentation, tracking,
  checkpointing, ...), swinexp's own source (with the C++ of model.kernels=fused_cpu), the MindSpore version and
  the CPU (its fused kernels are compiled for it);
- a job never writes into a shared directory: it compiles into a private one and, when it exits, renames that to
  the configuration's directory if none exists yet (a rename is atomic, so a reader never sees a half-written
  cache); a job that finds the directory works on a private copy of it.
- only the step graphs go through the cache (`first_call`, around their first call), each named in the cache's
  manifest in the order MindSpore numbered it; a process whose graphs come in another order (a resumed run that
  skips the AMP report, one interrupted before its epoch's validation) compiles from that graph on without it.

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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import mindspore as ms

from swinexp.config import Plan, thaw
from swinexp.runtime.devices import cpu_identity

__all__ = ["HOST_ONLY", "MANIFEST", "cache_key", "compiling", "default_root", "enable", "end_job", "first_call"]

log = logging.getLogger("swinexp")

# dotted config keys that never reach a compiled graph: the random draws are inputs of the step (models/randomness),
# targets and augmentation are made on the host, the rest is bookkeeping
HOST_ONLY = ("seed", "tracking", "debug", "dry_run", "inspect", "optimized_metric",
             "data.root", "data.num_workers", "data.augment", "data.pipeline", "data.crop_pct", "data.crop_mode",
             "data.generator_seed",
             "trainer.stop_after_epoch", "trainer.progress_bar", "trainer.resume", "trainer.resume_force",
             "trainer.checkpoint", "trainer.max_nonfinite", "trainer.profile", "trainer.label_smoothing",
             "hardware.master_addr", "hardware.master_port", "hardware.node_rank", "hardware.log_dir",
             "hardware.compile_cache", "hardware.compile_cache_dir", "hardware.compile_cache_max_gb")


def default_root() -> Path:
    """$XDG_CACHE_HOME/swinexp/compile, else ~/.cache/swinexp/compile."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swinexp" / "compile"


def _source_digest() -> str:
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]  # swinexp/
    for path in sorted([*package.rglob("*.py"), *package.rglob("*.cc")]):  # .cc: model.kernels=fused_cpu
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(plan: Plan) -> str:
    """16 hex digits naming the compiled graphs of `plan`: equal exactly when everything that shapes them is."""
    tree = thaw(plan.values)
    for dotted in HOST_ONLY:
        _drop(tree, dotted)
    payload = json.dumps({"config": tree, "mindspore": ms.__version__, "swinexp": _source_digest(),
                          "cpu": cpu_identity()},  # a graph may call kernels compiled for this CPU (fused_cpu)
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


MANIFEST = "graphs.json"  # the names of a cache's graphs, in the order MindSpore numbered them


@dataclass
class _Session:
    """This process's use of the cache: MindSpore reads MS_COMPILER_CACHE_PATH once, at the process's first cached
    compile, numbers the cached graphs from there and loads graph n for the n-th cached compile, whatever it is;
    MS_COMPILER_CACHE_ENABLE it reads at every compile."""

    shared: Path
    private: Path
    held: list[str] | None  # the graphs the shared cache holds, in order; None: there was none to load
    cached: list[str] = field(default_factory=list)  # the graphs this process compiled or loaded with the cache
    loaded: list[str] = field(default_factory=list)  # of those, the ones MindSpore loaded (wrote no file for)
    max_bytes: int = 2 * 2**30  # hardware.compile_cache_max_gb
    active: bool = True   # False once this process's first job ended
    broken: bool = False  # a graph came where the cache holds another: the rest compiles without the cache

    def loads(self, graph: str) -> bool:
        index = len(self.cached)
        return self.held is not None and index < len(self.held) and self.held[index] == graph


_session: _Session | None = None


def compiling(graph: str) -> str:
    """What a first call of `graph` does in this process, in a few words for a progress bar."""
    s = _session
    loads = s is not None and s.active and not s.broken and s.loads(graph)
    return f"loading {graph} from the compile cache" if loads else f"compiling {graph}"


@contextmanager
def first_call(graph: str | None) -> Iterator[None]:
    """Around the first call of a step graph (None: not a first call, nothing to do): only these graphs go through
    the cache, one by one in the order the cache holds them, so no other compile of the process (an AMP report's
    sub-cells, a resumed run that skips one) can take a cached graph's place and run it."""
    s = _session
    if graph is None or s is None or not s.active or s.broken:
        yield
        return
    if s.held is not None and not s.loads(graph):
        s.broken = True
        place = len(s.cached)
        log.warning("hardware.compile_cache: %s comes as graph %d, where the cache holds %s; it and the rest of "
                    "this process compile without the cache", graph, place,
                    s.held[place] if place < len(s.held) else "nothing")
        yield
        return
    before = _stamps(s.private) if s.held is not None else None
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
    try:
        yield
    finally:
        os.environ["MS_COMPILER_CACHE_ENABLE"] = "0"
    s.cached.append(graph)
    if before is None:
        return
    if _stamps(s.private) == before:
        s.loaded.append(graph)
        log.info("hardware.compile_cache: %s loaded from the cache, not compiled", graph)
    else:  # MindSpore's own check of the cached graph failed (another build, a changed file): it compiled anew
        log.warning("hardware.compile_cache: MindSpore compiled %s instead of loading it from %s; the run is right, "
                    "only its start is slower. If this repeats, delete that directory", graph, s.shared)


def _stamps(private: Path) -> dict[str, tuple[int, int]]:
    """(mtime, size) of each file in `private`: MindSpore writes a graph's file when it compiles the graph, and
    leaves it untouched when it loads it, whatever its log level (GLOG_v) lets it say."""
    return {str(f.relative_to(private)): (f.stat().st_mtime_ns, f.stat().st_size)
            for f in private.rglob("*") if f.is_file()}


def enable(plan: Plan) -> Path | None:
    """Point MindSpore's compile cache at this configuration's graphs; call before the first graph compiles. Only
    the step graphs use it, inside `first_call`.

    Returns:
        The configuration's cache directory (filled when this process exits, if it was not there yet), or None
        when `hardware.compile_cache` is off.
    """
    global _session
    hw = plan.hardware
    if _session is not None:  # a later job of this process (hydra/launcher=basic): its graphs must not go there
        _session.active = False
        if hw.compile_cache:
            log.warning("hardware.compile_cache: off for this job. MindSpore fixes its cache directory at a "
                        "process's first cached compile, and an earlier job of this process took it (%s); the "
                        "default launcher (hydra/launcher=isolated) runs every job in its own process",
                        _session.shared)
        return None
    if not hw.compile_cache:
        return None
    entry = ms.graph.api.entry_script_path  # sys.argv[0] when MindSpore was imported
    if entry is None or not os.path.isfile(entry):
        log.warning("hardware.compile_cache: off, because this process started from %s (python -c or an "
                    "interactive shell) and MindSpore's cache reads the entry script as a file; run `python run.py "
                    "...` or `swinexp ...` to reuse compiled graphs, or set hardware.compile_cache=false",
                    entry or "no script")
        return None
    root = Path(hw.compile_cache_dir or default_root()).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(root)
    shared = root / cache_key(plan)
    private = Path(tempfile.mkdtemp(prefix=f".{shared.name}-{os.getpid()}-", dir=root))
    held = None
    if (shared / MANIFEST).is_file():
        shutil.copytree(shared, private, dirs_exist_ok=True)
        held = json.loads((shared / MANIFEST).read_text())
        os.utime(shared)  # used now: the last to go when the cache is over its size
    os.environ["MS_COMPILER_CACHE_ENABLE"] = "0"  # on only inside first_call
    os.environ["MS_COMPILER_CACHE_PATH"] = str(private)
    _session = _Session(shared, private, held, max_bytes=int(hw.compile_cache_max_gb * 2**30))
    atexit.register(_publish, _session)
    if held is None:
        log.info("hardware.compile_cache: no compiled graphs of this configuration in %s yet; this run compiles "
                 "and fills it (MindSpore's warnings that it cannot open or check a hash file say the same)", shared)
    else:
        log.info("hardware.compile_cache: loading the compiled graphs of this configuration in %s", shared)
    return shared


def _publish(session: _Session) -> None:
    """Make the session's private directory the configuration's cache, with its manifest, if it compiled graphs and
    none is there yet; else discard it."""
    private, shared = session.private, session.shared
    try:
        if session.cached and not session.broken and not shared.exists() and any(private.rglob("*.mindir")):
            (private / MANIFEST).write_text(json.dumps(session.cached))
            os.rename(private, shared)
            _trim(shared.parent, session.max_bytes, keep=shared)
            return
    except OSError:  # another job published first
        pass
    shutil.rmtree(private, ignore_errors=True)


def end_job() -> None:
    """The job that enabled the cache is over: nothing else this process compiles goes through it."""
    if _session is not None:
        _session.active = False


def _trim(root: Path, max_bytes: int, keep: Path) -> None:
    """Remove the configurations used longest ago until the cache holds at most `max_bytes` (never `keep`)."""
    entries = [d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")]
    sizes = {d: sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) for d in entries}
    total = sum(sizes.values())
    for old in sorted(entries, key=lambda d: d.stat().st_mtime):
        if total <= max_bytes:
            return
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)
            total -= sizes[old]
            log.info("hardware.compile_cache: removed %s (used longest ago) to stay under %.1f GB", old,
                     max_bytes / 2**30)


def _remove_abandoned(root: Path, older_than_s: float = 86400.0) -> None:
    """Private copies left by killed processes (no exit handler ran): removed once a day old and their process
    (`.<key>-<pid>-...`) is not running here."""
    now = time.time()
    for private in root.glob(".*-*-*"):
        try:
            if private.is_dir() and now - private.stat().st_mtime > older_than_s and not _running(private):
                shutil.rmtree(private, ignore_errors=True)
        except OSError:  # another process removed it first
            pass


def _running(private: Path) -> bool:
    pid = private.name.split("-")[1]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
