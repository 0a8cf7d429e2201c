"""The process's memory allocator: jemalloc (or tcmalloc, mimalloc) in place of glibc's malloc, when installed.

MindSpore's graph compiler allocates and frees millions of small node objects; under glibc's malloc the cold
compile of swin_tiny's train step spends ~18 % of its samples in malloc itself (`_int_malloc`, `malloc_consolidate`,
`unlink_chunk`) and runs on scattered memory. With jemalloc preloaded the same first train step took 6.4-6.7 s
instead of 9.8-10.1 s on the 2-core reference host, the step from the compile cache 1.7 s instead of 2.1-2.3 s,
the steady step ~8 % less, and the peak memory at batch 16 stayed the same (BENCHMARKS.md).

An allocator is chosen when a process starts (`LD_PRELOAD`), so the command's door, `preload_or_exit`, re-executes
the process once with the library preloaded, before Hydra composes anything or MindSpore is imported (same pid,
same arguments; ~0.25 s). Child processes (data workers, sweep jobs, msrun's workers) inherit it through the
environment. `SWINEXP_ALLOCATOR` chooses: `auto` (default: the first of jemalloc, tcmalloc, mimalloc found, else
the system's malloc), `system`, one of those names, or a library's path. Linux only; elsewhere nothing changes.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path

__all__ = ["ENV_VAR", "LIBRARIES", "AllocatorError", "current", "environment_of_a_new_shell", "in_use", "library_for",
           "preload_or_exit", "reexec_with", "search_dirs"]

ENV_VAR = "SWINEXP_ALLOCATOR"
# set for the re-executed process only: if its preload did not take, it must not re-execute again
_REEXECUTED = "SWINEXP_ALLOCATOR_REEXECUTED"
# in the order `auto` tries them; the file names Debian/Ubuntu, Fedora and conda install
LIBRARIES = {"jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
             "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so"),
             "mimalloc": ("libmimalloc.so.2", "libmimalloc.so")}
_INSTALL = {"jemalloc": "apt-get install libjemalloc2 / dnf install jemalloc / conda install jemalloc",
            "tcmalloc": "apt-get install libtcmalloc-minimal4 / dnf install gperftools-libs / conda install gperftools",
            "mimalloc": "apt-get install libmimalloc2.0 / dnf install mimalloc / conda install mimalloc"}


class AllocatorError(ValueError):
    """SWINEXP_ALLOCATOR names something that cannot be used; the message says what to set or install."""


def search_dirs() -> list[Path]:
    """Where shared libraries are installed: this Python's prefix (conda, venvs of it), then the system's."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    dirs = [Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib"]
    for root in ("/usr/local/lib", "/usr/lib", "/lib"):
        dirs += [Path(root) / multiarch] if multiarch else []
        dirs.append(Path(root))
    dirs += [Path("/usr/lib64"), Path("/lib64")]
    return list(dict.fromkeys(dirs))


def _find(name: str, dirs: Sequence[Path]) -> Path | None:
    return next((d / f for f in LIBRARIES[name] for d in dirs if (d / f).is_file()), None)


def library_for(setting: str, dirs: Sequence[Path] | None = None) -> Path | None:
    """The library `setting` (a SWINEXP_ALLOCATOR value) asks for; None for the system's malloc.

    Raises AllocatorError for an unknown name, a named allocator that is not installed, or a path that is no file.
    """
    dirs = search_dirs() if dirs is None else dirs
    setting = setting.strip() or "auto"
    if setting == "system":
        return None
    if setting == "auto":
        return next((found for name in LIBRARIES if (found := _find(name, dirs))), None)
    if setting in LIBRARIES:
        if found := _find(setting, dirs):
            return found
        raise AllocatorError(f"{ENV_VAR}={setting}: none of {', '.join(LIBRARIES[setting])} is in "
                             f"{', '.join(map(str, dirs))}. Install it ({_INSTALL[setting]}), give the library's path "
                             f"({ENV_VAR}=/path/to/{LIBRARIES[setting][0]}), or set {ENV_VAR}=auto or system.")
    if "/" in setting:
        path = Path(setting).expanduser()
        if path.is_file():
            return path.resolve()
        raise AllocatorError(f"{ENV_VAR}={setting}: no such file. Give the path of an installed allocator library "
                             f"(e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2), or set {ENV_VAR}=auto or system.")
    raise AllocatorError(f"{ENV_VAR}={setting!r} is not an allocator: use auto (the default), system, "
                         f"{', '.join(LIBRARIES)}, or a library's path.")


def in_use(maps: Path = Path("/proc/self/maps")) -> Path | None:
    """The allocator library mapped into this process, or None: the system's malloc."""
    try:
        text = maps.read_text()
    except OSError:
        return None
    prefixes = tuple(f"lib{name}" for name in LIBRARIES)
    files = (Path(line[line.index("/"):]) for line in text.splitlines() if "/" in line)  # a mapping's file
    return next((file for file in files if file.name.startswith(prefixes)), None)


def reexec_with(library: Path, environ: MutableMapping[str, str], argv: Sequence[str],
                execv: Callable[[str, Sequence[str]], object] = os.execv) -> None:
    """Run this process again, from the start and with the same arguments, with `library` preloaded."""
    preload = environ.get("LD_PRELOAD", "").strip()
    environ["LD_PRELOAD"] = f"{library}:{preload}" if preload else str(library)
    environ[_REEXECUTED] = str(library)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    execv(sys.executable, [sys.executable, *argv[1:]])


def _drop_preload(library: str, environ: MutableMapping[str, str]) -> None:
    """Take `library` (by the file it names: the loader maps a symlink's target) out of LD_PRELOAD."""
    target = Path(library).resolve()
    kept = [entry for entry in environ.get("LD_PRELOAD", "").replace(" ", ":").split(":")
            if entry and Path(entry).resolve() != target]
    if kept:
        environ["LD_PRELOAD"] = ":".join(kept)
    else:
        environ.pop("LD_PRELOAD", None)


def preload_or_exit(environ: MutableMapping[str, str] | None = None, argv: Sequence[str] | None = None,
                    platform: str = sys.platform, maps: Path = Path("/proc/self/maps"),
                    execv: Callable[[str, Sequence[str]], object] = os.execv) -> None:
    """The door's first step: re-execute with the allocator SWINEXP_ALLOCATOR chooses, unless one is in use already
    (inherited, or preloaded by the user) or the choice is the system's malloc. Exits with the fix on a bad value.

    Returns when the process goes on as it is; on re-execution it does not return.
    """
    environ = os.environ if environ is None else environ
    if not platform.startswith("linux") or not sys.executable:
        return
    tried = environ.pop(_REEXECUTED, None)
    if in_use(maps):
        return
    try:
        library = library_for(environ.get(ENV_VAR, "auto"))
    except AllocatorError as err:
        raise SystemExit(f"AllocatorError: {err}") from None
    if library is None:
        return
    if tried:  # preloaded and still not mapped: the loader refused it (its message is above); go on with malloc
        _drop_preload(tried, environ)
        print(f"swinexp: {tried} could not be preloaded; running on the system's malloc "
              f"(set {ENV_VAR}=system to skip the attempt)", file=sys.stderr, flush=True)
        return
    reexec_with(library, environ, sys.orig_argv if argv is None else argv, execv)


def current() -> str:
    """The allocator this process runs on, for run tags and benchmark titles: a library's file name or 'system'."""
    library = in_use()
    return library.name if library else "system"


def environment_of_a_new_shell(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the allocator it preloads: a child started with it chooses (and
    re-executes) as a command started from the user's shell does."""
    child = dict(os.environ if environ is None else environ)
    if library := in_use():
        _drop_preload(str(library), child)
    return child
