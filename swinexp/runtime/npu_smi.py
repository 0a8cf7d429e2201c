"""Reading the job's own Ascend cards through `npu-smi`, the driver's command-line tool, for the system metrics.

Two calls per sample: `npu-smi info` (every card at once) and `npu-smi info -t usages -i <id>` (one card). What this
module relies on, with the documents it comes from:
- [npu-smi info]: a table of two rows per card between `+===...===+` rules; the first row is `| <NPU ID> <Name> |
  <Health> | <Power(W)> <Temp(C)> <Hugepages used> / <total> |`, the second `| <Chip> [<Device>] | <Bus-Id> |
  <AICore(%)> <Memory-Usage(MB) used> / <total> [...] |`. Health is one of OK, Warning, Alarm, Critical, UNKNOWN
  (device missing or not started). Ascend docs, "npu-smi info: querying basic information" (hiascend.com
  .../re/npu/npusmi_007.html, driver 23.0 to 25.5; Atlas 200I A2 driver guide atlasdg_11_0151). On the training
  cards (910, 910B) the second row adds an `HBM-Usage(MB)` column after Memory-Usage: the card's HBM, the memory a
  training job fills (the 910B's Memory-Usage reads 0 / 0); 910B cards have 64 GB of HBM (HDK A2 DCMI reference,
  dcmi_get_device_hbm_info: "Atlas 800T A2 training server: 64G on-chip memory"). The same command then lists the
  processes on each card in a second table (`Process id`, `Process name`, `Process memory(MB)`), which is skipped.
- [npu-smi usages]: `npu-smi info -t usages -i <id>` prints `Key : value` lines per chip, among them
  `Aicore Usage Rate(%)`, `Aicpu Usage Rate(%)`, `Ctrlcpu Usage Rate(%)`, `Memory Usage Rate(%)` and, on cards with
  HBM, `HBM Capacity(MB)` and `HBM Usage Rate(%)` (hiascend.com .../re/npu/npusmi_019.html, "querying statistics of
  all chips"). `npu-smi info -t common -i <id>` repeats the AI Core rate and temperature, so it is not called.
- [device ids]: `npu-smi`'s NPU ID is the physical card number that ASCEND_RT_VISIBLE_DEVICES lists; a process sees
  the cards of that list as devices 0..n-1, and msrun gives its local worker k device k (DEVICE_ID; MindSpore's
  `parallel/cluster/process_entity/_api.py`). The training series has one chip per NPU ID (chip 0).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

NPU_SMI = "npu-smi"
TIMEOUT_S = 5.0  # one call; a driver that hangs must not hold the sampling thread (or the run's end) for longer
HEALTH = {"OK": 0.0, "Warning": 1.0, "Alarm": 2.0, "Critical": 3.0, "UNKNOWN": 4.0}  # worse is larger [npu-smi info]
USED_TOTAL = re.compile(r"(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")
USAGE_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z ]*?\(%\)|[A-Za-z][A-Za-z ]*?\(MB\))\s*:\s*(\S+)\s*$")


class NpuSmiError(RuntimeError):
    """npu-smi did not answer in time, failed, or printed what this parser does not know."""


@dataclass(frozen=True)
class Card:
    """One card's row pair of `npu-smi info` [npu-smi info]."""

    npu: int
    name: str
    health: str
    power_w: float
    temp_c: float
    aicore_pct: float
    hbm_used_mb: float
    hbm_total_mb: float


def available() -> bool:
    """npu-smi is on PATH (a host with Ascend cards and their driver)."""
    return shutil.which(NPU_SMI) is not None


def run(*args: str, timeout_s: float | None = None) -> str:
    """npu-smi's output for `args`; NpuSmiError when it fails or takes longer than `timeout_s` (TIMEOUT_S)."""
    try:  # its own process group: a wrapper script that hangs is killed with its children
        proc = subprocess.Popen([NPU_SMI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as err:
        raise NpuSmiError(f"cannot run {NPU_SMI}: {err}") from err
    try:
        out, err = proc.communicate(timeout=timeout_s or TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise NpuSmiError(f"`{NPU_SMI} {' '.join(args)}` did not answer within {timeout_s or TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        raise NpuSmiError(f"`{NPU_SMI} {' '.join(args)}` exited with status {proc.returncode}: {err.strip()[:200]}")
    return out


def parse_info(text: str) -> dict[int, Card]:
    """The cards of an `npu-smi info` table by NPU ID; NpuSmiError when it holds none or a row is not understood."""
    header = next((line for line in text.splitlines() if "AICore(%)" in line), None)
    if header is None:
        raise NpuSmiError("npu-smi info printed no card table (no 'AICore(%)' column)")
    hbm_column = "HBM-Usage(MB)" in header
    rows = [_cells(line) for line in _card_table(text)]
    cards = {}
    for first, second in zip(rows[::2], rows[1::2]):
        try:
            npu, name = first[0].split()[0], " ".join(first[0].split()[1:])
            power, temp = first[2].split()[:2]
            aicore = second[2].split()[0]
            used, total = USED_TOTAL.findall(second[2])[-1 if hbm_column else 0]
            cards[int(npu)] = Card(int(npu), name, first[1].strip(), _number(power), _number(temp), _number(aicore),
                                   float(used), float(total))
        except (IndexError, ValueError) as err:
            raise NpuSmiError(f"npu-smi info: a card row is not in the documented layout ({first} / {second})") from err
    if not cards:
        raise NpuSmiError("npu-smi info listed no card")
    return cards


def parse_usages(text: str) -> dict[str, float]:
    """The first chip's `Key(%)` / `Key(MB)` values of `npu-smi info -t usages -i <id>` [npu-smi usages]."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if (match := USAGE_LINE.match(line)) and match.group(1) not in values:
            try:
                values[match.group(1)] = float(match.group(2))
            except ValueError:
                continue  # 'NA' where a card lacks the unit
    if "Aicore Usage Rate(%)" not in values:
        raise NpuSmiError("npu-smi info -t usages printed no 'Aicore Usage Rate(%)' line")
    return values


def job_cards(workers: int | None = None, environ: Mapping[str, str] = os.environ) -> list[int]:
    """The physical card numbers of this job on this host [device ids].

    `workers` (hardware.num_devices, where the caller knows it): devices 0..workers-1. Else, inside an msrun worker:
    devices 0..MS_WORKER_NUM-1 (on several nodes that count is the world's; cards npu-smi does not list are left out
    when sampled); in one process: its DEVICE_ID (default 0). Mapped through ASCEND_RT_VISIBLE_DEVICES where set.
    """
    visible = [int(d) for d in environ.get("ASCEND_RT_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if workers is None and environ.get("MS_ROLE") == "MS_WORKER":
        workers = int(environ.get("MS_WORKER_NUM", "1"))
    local = list(range(workers)) if workers is not None else [int(environ.get("DEVICE_ID", "0") or 0)]
    return [visible[d] for d in local if d < len(visible)] if visible else local


def _card_table(text: str) -> list[str]:
    """The card rows: between the table's `+===` rules, up to the process table."""
    rows, inside = [], False
    for line in text.splitlines():
        if "Process id" in line or "Process name" in line:
            break
        if line.startswith("+="):
            inside = True
        elif line.startswith("+"):
            continue
        elif inside and line.startswith("|"):
            rows.append(line)
    return rows


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _number(text: str) -> float:
    return float("nan") if text in ("NA", "-") else float(text)
