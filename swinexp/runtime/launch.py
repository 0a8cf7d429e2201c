"""Multi-process runs through MindSpore's own launcher: `run.py` re-executes itself under `msrun`.

When `hardware.num_devices x hardware.num_nodes > 1` and this process is not an msrun worker yet, the job is
handed to msrun with the same overrides and the same Hydra run directory; msrun starts the workers, and this
process only waits and reports. Inside a worker (`MS_ROLE=MS_WORKER`), `hardware.apply` initialises the
collectives and data-parallel mode.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from swinexp.config import HardwareCfg
from swinexp.registry import ConfigError
from swinexp.runtime import modelarts, node_sync, rank_table, slurm
from swinexp.runtime.watchdog import LAUNCHER_ENV, kill_launched, launched_processes

LOG_TAIL_LINES = 40
CONFIG_ERROR_STATUS = 78  # a worker's exit status for a ConfigError: sysexits.h's EX_CONFIG
CONFIG_ERROR_PREFIX = "ConfigError: "  # the line a worker prints for it, found in its log by the launching process
POLL_S = 1.0
GRACE_S = 15.0     # after a worker died: time msrun gets to take the others down before the launcher does
# Runs msrun armed to die with the launcher: `python -c THIS <launcher pid> msrun ...` (exec keeps the death signal;
# unlike preexec_fn, safe in a process that has threads).
EXEC_DYING_WITH_PARENT = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 9); "  # PR_SET_PDEATHSIG, SIGKILL
                          "os.getppid() == int(sys.argv[1]) or sys.exit(1); os.execv(sys.argv[2], sys.argv[2:])")
WORKER_EXIT = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")
NODE_RANK_ENV = "SWINEXP_NODE_RANK"  # the launching node's rank, for the processes msrun starts
# MindSpore's init() builds HCCL from either (communication/management.py): set only from hardware.rank_table_file.
RANK_TABLE_ENVS = ("RANK_TABLE_FILE", "MINDSPORE_HCCL_CONFIG_PATH")


def world_size(hw: HardwareCfg) -> int:
    return hw.num_devices * hw.num_nodes


def is_worker() -> bool:
    """True inside a process that msrun started: a worker, or the scheduler (which runs the script too)."""
    return os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED")


def is_scheduler() -> bool:
    """msrun's scheduler process: it must only join the cluster (in `init()`), never train or log."""
    return os.environ.get("MS_ROLE") == "MS_SCHED"


def rank() -> int:
    return int(os.environ.get("RANK_ID", "0"))


def launching_node_rank() -> int:
    """Inside a process msrun started: the node rank of the launcher that started that msrun."""
    return int(os.environ.get(NODE_RANK_ENV, "0"))


def is_extra_scheduler() -> bool:
    """msrun starts a scheduler on every node whose address is master_addr: on one host that is also node 1..n-1's,
    which must leave the port to node 0's."""
    return is_scheduler() and launching_node_rank() != 0


def needs_launch(hw: HardwareCfg) -> bool:
    return world_size(hw) > 1 and not is_worker()


def log_dir(hw: HardwareCfg, run_dir: Path) -> Path:
    """msrun's log folder; one per node in a multi-node run (the run dir is shared: the nodes' msrun.out and
    scheduler.log would overwrite each other)."""
    logs = Path(hw.log_dir) if hw.log_dir else run_dir / "msrun"
    return logs / f"node{hw.node_rank}" if hw.num_nodes > 1 else logs


def entry_script() -> Path:
    """The file every job and msrun worker runs: the package's `__main__.py` (`python -m swinexp` run as a file),
    found from the package, not from `sys.argv[0]` (which under another Hydra launcher, e.g. submitit, is that
    launcher's own entry point). It is in every install, editable or wheel."""
    return Path(__file__).resolve().parents[1] / "__main__.py"


def msrun_command(hw: HardwareCfg, script: Path, overrides: list[str], run_dir: Path) -> list[str]:
    """The msrun call for this node: every worker runs `script` with the same overrides and run directory."""
    if not 0 <= hw.node_rank < hw.num_nodes:
        raise ConfigError(f"hardware.node_rank={hw.node_rank} must be in 0..{hw.num_nodes - 1} "
                          f"(hardware.num_nodes={hw.num_nodes})")
    msrun = shutil.which("msrun") or str(Path(sys.executable).with_name("msrun"))
    own = [o for o in overrides if not o.startswith(("hydra.run.dir=", "dry_run"))]
    table = [f"--rank_table_file={hw.rank_table_file}"] if hw.rank_table_file else []
    return [msrun, f"--worker_num={world_size(hw)}", f"--local_worker_num={hw.num_devices}",
            f"--master_addr={hw.master_addr}", f"--master_port={hw.master_port}", f"--node_rank={hw.node_rank}",
            f"--log_dir={log_dir(hw, run_dir)}", "--join=True", *table, str(script), *own, f"hydra.run.dir={run_dir}"]


def msrun_env(hw: HardwareCfg, environ: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """The environment of msrun and its workers, and the line to log when a rank table variable was dropped from it.

    A RANK_TABLE_FILE left in the shell (or set by the platform) would make every worker build HCCL from that table,
    whatever this run's hardware says; the workers see one only when hardware.rank_table_file names it.
    """
    env = {k: v for k, v in environ.items() if k not in RANK_TABLE_ENVS}
    env.update({"GLOG_v": environ.get("GLOG_v", "3"), LAUNCHER_ENV: str(os.getpid()), NODE_RANK_ENV: str(hw.node_rank)})
    if hw.rank_table_file is not None:
        env.update(dict.fromkeys(RANK_TABLE_ENVS, str(hw.rank_table_file)))
        return env, None
    dropped = [f"{k}={environ[k]}" for k in RANK_TABLE_ENVS if k in environ]
    return env, (f"rank table: ignoring {', '.join(dropped)} from the environment (hardware.rank_table_file is null; "
                 "set it to use that table)" if dropped else None)


def prepare(hw: HardwareCfg, run_dir: Path) -> HardwareCfg:
    """The checks of a launch that need this node's files, before msrun starts: the rank table (which then gives
    node rank and master address) and, on several nodes, that all of them share `run_dir`."""
    if hw.rank_table_file is not None:
        hw, line = rank_table.resolve(hw, run_dir / rank_table.CONVERTED_FILE)
        print(line, flush=True)
    node_sync.check_shared(run_dir, hw.node_rank, hw.num_nodes, hw.node_sync_timeout_s)
    return hw


def _wait_supervised(proc: subprocess.Popen, msrun_out: Path) -> tuple[int, dict[int, int]]:
    """Wait for msrun; once a worker has died, give msrun GRACE_S to end the job, then end it here.

    Returns:
        msrun's exit status, and node id -> exit code of every worker that died abnormally.
    """
    node_of: dict[int, int] = {}  # worker pid -> node id, learned while they run
    died_at = None
    while proc.poll() is None:
        for pid, env in launched_processes(os.getpid()).items():
            if env.get("MS_ROLE") == "MS_WORKER" and "MS_NODE_ID" in env and "hydra.run.dir=" in env["cmdline"]:
                node_of[pid] = int(env["MS_NODE_ID"])  # the worker itself, not its `tail -f` or data processes
        if died_at is None and WORKER_EXIT.search(msrun_out.read_text(errors="replace")):
            died_at = time.monotonic()
        if died_at is not None and time.monotonic() - died_at > GRACE_S:
            kill_launched(os.getpid())  # a surviving scheduler or worker that waits forever on the dead one
        time.sleep(POLL_S)
    exits = {node_of.get(int(pid), -1): int(code)
             for pid, code in WORKER_EXIT.findall(msrun_out.read_text(errors="replace"))}
    return proc.returncode, exits


def launch(hw: HardwareCfg, script: Path, overrides: list[str], run_dir: Path) -> int:
    """Run the msrun command and return its exit status; on failure print the failing workers' log tails.

    Nothing outlives the launch: whatever is left when msrun ends is killed, and a watchdog process kills it all
    if this process dies first (even by SIGKILL); msrun itself is armed to die with this process.

    Raises:
        ConfigError: a worker stopped on a config mistake (its log holds the `ConfigError: ...` line).
    """
    command = msrun_command(hw, script, overrides, run_dir)
    if not Path(command[0]).exists():
        raise ConfigError("msrun was not found; it is installed with MindSpore beside the Python interpreter "
                          f"({Path(sys.executable).parent}); put that folder on PATH")
    logs = log_dir(hw, run_dir)
    logs.mkdir(parents=True, exist_ok=True)
    print(f"launching {world_size(hw)} workers: {' '.join(command)}", flush=True)
    # msrun echoes every worker's log when it ends; keep it in a file and show only what matters here.
    env, ignored = msrun_env(hw, os.environ)
    if ignored:
        print(ignored, flush=True)
    with open(logs / "msrun.out", "w") as out:
        watchdog = subprocess.Popen([sys.executable, str(Path(__file__).with_name("watchdog.py")), str(os.getpid())])
        armed = [sys.executable, "-c", EXEC_DYING_WITH_PARENT, str(os.getpid()), *command]
        proc = subprocess.Popen(armed, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            status, exits = _wait_supervised(proc, logs / "msrun.out")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            kill_launched(os.getpid())
            watchdog.kill()
            watchdog.wait()
    if status != 0:
        if (message := worker_config_error(logs)) is not None:
            raise ConfigError(message)  # a user mistake: the one line a single run prints, not the logs' tails
        print(failure_report(logs, exits), file=sys.stderr, flush=True)
    return status


def exit_for_config_error(err: ConfigError) -> SystemExit:
    """How a run ends on a user mistake: `ConfigError: <message>` on stderr, no traceback. A worker prints that line
    to its log itself and exits with CONFIG_ERROR_STATUS, so that the launching process can tell it from a crash."""
    line = CONFIG_ERROR_PREFIX + " ".join(str(err).splitlines())
    if not is_worker():
        return SystemExit(line)
    print(line, file=sys.stderr, flush=True)
    return SystemExit(CONFIG_ERROR_STATUS)


def worker_config_error(logs: Path) -> str | None:
    """The message of the first ConfigError line in the worker logs (by rank), or None when no worker printed one."""
    for path in sorted(logs.glob("worker_*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(CONFIG_ERROR_PREFIX):
                return line[len(CONFIG_ERROR_PREFIX):]
    return None


def failure_report(logs: Path, exits: dict[int, int] | None = None) -> str:
    """The tail of every worker log that ends in a Python traceback, or else of the workers killed by a signal
    (`exits`: node id -> exit code, negative = signal), or else of all logs."""
    worker_logs = sorted(logs.glob("worker_*.log"))
    failed = [p for p in worker_logs if "Traceback (most recent call last)" in p.read_text(errors="replace")]
    parts = [f"msrun: the distributed job failed; worker logs are in {logs}"]
    for node, code in sorted((exits or {}).items()):
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        parts.append(f"worker {node} {how}")
        if not failed and (logs / f"worker_{node}.log").exists():
            failed.append(logs / f"worker_{node}.log")
    for path in failed or worker_logs:
        lines = [line for line in path.read_text(errors="replace").splitlines()
                 if not line.startswith(("[WARNING]", "[INFO]"))]
        parts.append(f"----- {path.name} (last {LOG_TAIL_LINES} lines) -----\n" + "\n".join(lines[-LOG_TAIL_LINES:]))
    return "\n".join(parts)


def launch_plan(hw: HardwareCfg, overrides: list[str], run_dir: Path) -> list[str]:
    """The dry run's launch lines, without the hardware: where the node's place comes from, the msrun call of
    every node, and the shared-run-dir check."""
    if world_size(hw) == 1:
        return ["single process: no msrun"]
    lines = []
    script = entry_script()
    placed = slurm.describe() or describe_modelarts(hw)
    if placed:
        lines.append(placed)
    if hw.rank_table_file is not None:
        hw, line = rank_table.resolve(hw, run_dir / rank_table.CONVERTED_FILE, write=False)
        lines.append(line)
        placed = placed or line
    if hw.num_nodes > 1:
        lines.append(f"shared run dir: before msrun the nodes meet in {run_dir / node_sync.SYNC_DIR} (up to "
                     f"{hw.node_sync_timeout_s:g} s); a node with another run dir fails with a ConfigError")
    for node_rank in range(hw.num_nodes):
        per_node = replace(hw, node_rank=node_rank)
        given = ("" if hw.num_nodes == 1 or placed else " hardware.master_addr=<node 0 address>")
        here = " (this node)" if placed and node_rank == hw.node_rank else ""
        lines.append(f"node {node_rank}{here}: python run.py {' '.join(overrides)} hardware.node_rank={node_rank}"
                     f"{given}\n  starts: {' '.join(msrun_command(per_node, script, overrides, run_dir))}")
    return lines


def not_the_launcher(hw: HardwareCfg) -> str | None:
    """Under `hardware.platform=modelarts`: None for the copy that launches msrun for this node (the card whose
    number is 0 modulo hardware.num_devices, or the only copy), else the one line the other copies print before
    they exit with status 0."""
    if hw.platform != "modelarts" or (given := modelarts.card()) is None:
        return None
    name, number = given
    if number % hw.num_devices == 0:
        return None
    return (f"modelarts: this copy ({name}={number}) does not launch; on node {hw.node_rank} the copy with "
            f"{name} % {hw.num_devices} == 0 starts msrun for the node's {hw.num_devices} card(s)")


def describe_modelarts(hw: HardwareCfg) -> str | None:
    """One line for dry runs: what the platform told this process, or None outside `hardware.platform=modelarts`."""
    if hw.platform != "modelarts":
        return None
    names = (modelarts.NUM_NODES_ENV, modelarts.NODE_RANK_ENV, modelarts.HOSTS_ENV, modelarts.CARDS_ENV)
    given = {k: os.environ.get(k, "<unset>") for k in names}
    mine = modelarts.card()
    role = ("one copy per node: it launches" if mine is None
            else f"{mine[0]}={mine[1]}: " + ("launches msrun" if not_the_launcher(hw) is None else "exits (status 0)"))
    return ("modelarts: " + " ".join(f"{k}={v}" for k, v in given.items())
            + f" -> node {hw.node_rank} of {hw.num_nodes}, master_addr={hw.master_addr}; this copy ({role})")
