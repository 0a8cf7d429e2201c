"""Ascend rank tables (the cluster's RANK_TABLE_FILE): read as the platforms write them, waited for until complete,
checked before msrun starts, then handed to it in the one format MindSpore documents.

The formats, each as its source shows it (read 2026-12):

- **server_list** ("version 1.0"; MindSpore's tutorial "rank table Startup", parallel/rank_table.md):
  `{"status": "completed", "version": "1.0", "server_count": "2", "server_list": [{"server_id": "10.0.0.1",
  "device": [{"device_id": "0", "device_ip": ..., "rank_id": "0"}, ...]}, ...]}`; `device_id` is the card's
  *physical* number on its server. CANN's HCCL guide ("rank table configuration") adds `host_ip` per server (1.2).
- **MindCluster / Ascend Operator** (MindCluster docs, appendix "hccl.json File Description", mxdlug_appendices_009):
  the same server_list, mounted as `/user/serverid/devindex/config/hccl.json`; per server `server_id` is the node,
  `host_ip` the node's address and `container_ip` the Pod's; top-level `status` is what the operator has written
  so far, `completed` once done.
- **ModelArts "template 2"** (`group_list`; the file CCE's ring controller writes, `/user/config/jobstart_hccl.json`,
  and what RANK_TABLE_FILE names on ModelArts, the *directory* `/user/config`; as read and converted by ModelArts'
  davincirun, see github.com/Wh1isper/davincirunsdk `rank_table.py`, `common.py`): `{"status": "completed",
  "group_count": "1", "group_list": [{"group_name": ..., "device_count": "16", "instance_count": "2",
  "instance_list": [{"pod_name": "<job>-1", "server_id": "10.19.1.79", "devices": [{"device_id": "0",
  "device_ip": ...}, ...]}, ...]}]}`: no rank ids; instances are ranked by the number that ends their pod_name, and
  each instance's devices in order. `server_id` there is the node, not the container, so it gives no address.

msrun takes the table as `--rank_table_file` (Ascend only) and exports RANK_TABLE_FILE to the workers (MindSpore
2.10, `parallel/cluster/process_entity/_api.py`); MindSpore's `init()` accepts MINDSPORE_HCCL_CONFIG_PATH or
RANK_TABLE_FILE (`communication/management.py`), and HCCL builds its communicators from it. So a template-2 table is
converted to server_list and msrun gets the converted file. The table fixes this node's rank and the scheduler's host
(server 0); swinexp's hardware.num_nodes / num_devices must agree with it, and so must the rank order, because msrun
numbers workers node_rank x num_devices + local index and swinexp shards the data by that number.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from swinexp.config import HardwareCfg
from swinexp.registry import ConfigError

HOSTNAME = re.compile(r"^[A-Za-z0-9.-]+$")  # a server_id such as 'node_0' is a name, not an address
POD_INDEX = re.compile(r"-(\d+)$")  # a template-2 pod_name ends in the instance's index: '<job>-worker-3'
TABLE_FILES = ("jobstart_hccl.json", "hccl.json")  # inside a directory: ModelArts' file, then MindCluster's
COMPLETED = "completed"
POLL_S = 1.0
CONVERTED_FILE = "rank_table.json"  # the server_list form of a template-2 table, written for msrun
VISIBLE_ENV = "ASCEND_RT_VISIBLE_DEVICES"  # physical card ids this process may use; unset = all


@dataclass(frozen=True)
class Device:
    device_id: int  # the card's physical number on its server
    device_ip: str
    rank_id: int


@dataclass(frozen=True)
class Server:
    server_id: str
    address: str | None   # container_ip, host_ip, or server_id when it is an IP or a host name
    devices: tuple[Device, ...]
    pod_name: str | None = None  # template 2: the Kubernetes pod, which is this container's host name

    @property
    def rank_ids(self) -> tuple[int, ...]:
        return tuple(d.rank_id for d in self.devices)


@dataclass(frozen=True)
class Table:
    file: Path            # the file read (inside the directory hardware.rank_table_file named, if it did)
    layout: str           # "server_list" or "group_list" (template 2: msrun gets it converted)
    servers: list[Server]


def locate(path: str) -> Path | None:
    """The table file `path` names: itself, or in a directory the first of TABLE_FILES; None while a directory holds
    none of them yet."""
    given = Path(path)
    if not given.is_dir():
        return given
    return next((given / name for name in TABLE_FILES if (given / name).is_file()), None)


def read(path: str, wait_s: float, clock: Callable[[], float] = time.monotonic) -> Table:
    """The table at `path` (a file, or a directory holding one), once the platform has marked it `completed`.

    Waits up to `wait_s` seconds, polling every POLL_S, for the file to appear in a directory and for its status to
    read `completed`: platforms start the job while they still write it.
    """
    where = f"hardware.rank_table_file='{path}'"
    if not path:
        raise ConfigError(f"{where} is empty: this preset reads it from RANK_TABLE_FILE, which is not set; export "
                          "RANK_TABLE_FILE=<rank table JSON> or pass hardware.rank_table_file=PATH")
    if not Path(path).exists():
        raise ConfigError(f"{where} does not exist; point it at the cluster's rank table JSON (or the directory "
                          "holding it), or launch without one (hardware=ascend8)")
    deadline = clock() + wait_s
    while True:
        file = locate(path)
        table = _load_json(file, where) if file is not None else None
        status = None if table is None else str(table.get("status", COMPLETED))
        if status == COMPLETED:
            break
        if clock() >= deadline:
            if file is None:
                raise ConfigError(f"{where} is a directory without {' or '.join(TABLE_FILES)} after waiting "
                                  f"{wait_s:g} s (hardware.rank_table_wait_s); point it at the table file, or raise "
                                  "hardware.rank_table_wait_s if the platform writes it later")
            raise ConfigError(f"{where}: {file} still has status '{status}', not '{COMPLETED}', after waiting "
                              f"{wait_s:g} s: the cluster has not finished writing it; raise "
                              "hardware.rank_table_wait_s, or start the job once the table is complete")
        time.sleep(POLL_S)
    where = where if file == Path(path) else f"{where} ({file})"
    if isinstance(table.get("group_list"), list):
        return Table(file, "group_list", _from_group_list(table, where))
    return Table(file, "server_list", _from_server_list(table, where))


def load(path: str, wait_s: float = 0.0) -> list[Server]:
    """The servers of the rank table at `path`, in rank order, after the checks that need only the file."""
    return read(path, wait_s).servers


def _load_json(file: Path, where: str) -> dict[str, Any]:
    try:
        table = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where} is not JSON ({err.msg} at line {err.lineno}); fix or regenerate the file") from None
    if not isinstance(table, dict):
        raise ConfigError(f"{where} is not a rank table (a JSON object with server_list or group_list); regenerate it")
    return table


def _devices(entries: object, where: str, what: str, rank_from: int | None = None) -> tuple[Device, ...]:
    """A server's devices; template 2 has no rank_id, so `rank_from` numbers them from there."""
    try:
        return tuple(Device(int(d["device_id"]), str(d.get("device_ip", "")),
                            int(d["rank_id"]) if rank_from is None else rank_from + i)
                     for i, d in enumerate(entries or []))  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError, AttributeError):
        needs = "an integer device_id and rank_id" if rank_from is None else "an integer device_id"
        raise ConfigError(f"{where}: {what} has a device without {needs}; fix the file") from None


def _from_server_list(table: dict[str, Any], where: str) -> list[Server]:
    if not isinstance(table.get("server_list"), list) or not table["server_list"]:
        raise ConfigError(f"{where} has no server_list (nor a ModelArts group_list); swinexp reads the rank table "
                          "formats of MindSpore/CANN (server_list), MindCluster and ModelArts (group_list): "
                          "regenerate it in one of them")
    servers = []
    for i, entry in enumerate(table["server_list"]):
        entry = entry if isinstance(entry, dict) else {}
        devices = _devices(entry.get("device"), where, f"server {i}")
        server_id = str(entry.get("server_id", ""))
        address = (entry.get("container_ip") or entry.get("host_ip")
                   or (server_id if _is_address(server_id) else None))
        servers.append(Server(server_id, address, devices))
    count = table.get("server_count")
    if count is not None and str(count) != str(len(servers)):
        raise ConfigError(f"{where} says server_count={count} but its server_list has {len(servers)} server(s); "
                          "fix or regenerate the file")
    return servers


def _from_group_list(table: dict[str, Any], where: str) -> list[Server]:
    """Template 2 as server_list servers: every group's instances (groups without devices skipped), ranked by the
    index that ends their pod_name (file order where a pod_name has none), their devices numbered in that order."""
    groups = table["group_list"]
    count = table.get("group_count")
    if count is not None and str(count) != str(len(groups)):
        raise ConfigError(f"{where} says group_count={count} but its group_list has {len(groups)} group(s); "
                          "fix or regenerate the file")
    instances = []
    for g, group in enumerate(groups):
        listed = group.get("instance_list") if isinstance(group, dict) else None
        if not isinstance(listed, list):
            raise ConfigError(f"{where}: group {g} has no instance_list; fix or regenerate the file")
        if str(group.get("device_count", "1")) == "0":
            continue  # davincirun skips them too: a group without cards (e.g. a parameter server)
        if "instance_count" in group and str(group["instance_count"]) != str(len(listed)):
            raise ConfigError(f"{where}: group {g} says instance_count={group['instance_count']} but lists "
                              f"{len(listed)} instance(s); fix or regenerate the file")
        instances += [i if isinstance(i, dict) else {} for i in listed]
    if not instances:
        raise ConfigError(f"{where} has a group_list without instances; the platform wrote no cards into it")
    indices = [POD_INDEX.search(str(i.get("pod_name", ""))) for i in instances]
    if all(indices):
        instances = [i for _, i in sorted(zip((int(m.group(1)) for m in indices if m), instances), key=lambda p: p[0])]
    servers, rank = [], 0
    for i, instance in enumerate(instances):
        name = str(instance.get("pod_name", "")) or None
        devices = _devices(instance.get("devices"), where, f"instance {i} ({name})", rank_from=rank)
        rank += len(devices)
        servers.append(Server(str(instance.get("server_id", "")), None, devices, name))
    return servers


def server_list(servers: list[Server]) -> dict[str, Any]:
    """The version-1.0 server_list table of `servers`: what msrun and HCCL get for a template-2 table."""
    return {"version": "1.0", "server_count": str(len(servers)), "status": COMPLETED,
            "server_list": [{"server_id": s.server_id, "host_nic_ip": "reserve",
                             "device": [{"device_id": str(d.device_id), "device_ip": d.device_ip,
                                         "rank_id": str(d.rank_id)} for d in s.devices]} for s in servers]}


def write_server_list(servers: list[Server], file: Path) -> Path:
    """Write `server_list(servers)` to `file` whole (a reader never sees half of it); returns `file`."""
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_name(f".{file.name}.{os.getpid()}")
    partial.write_text(json.dumps(server_list(servers), indent=1))
    partial.replace(file)
    return file


def visible_devices() -> set[int] | None:
    """The physical card ids ASCEND_RT_VISIBLE_DEVICES lets this process use; None when it is unset (all)."""
    given = os.environ.get(VISIBLE_ENV, "").strip()
    if not given:
        return None
    try:
        return {int(d) for d in given.split(",") if d.strip()}
    except ValueError:
        raise ConfigError(f"{VISIBLE_ENV}='{given}' is not a comma-separated list of card numbers; fix or unset "
                          "it") from None


def check_visible(server: Server, path: str) -> None:
    """Every card the table gives this node is one the process can use (rank table device_ids are physical)."""
    visible = visible_devices()
    if visible is None:
        return
    if missing := [d.device_id for d in server.devices if d.device_id not in visible]:
        raise ConfigError(f"hardware.rank_table_file='{path}': server '{server.server_id}' (this node) lists "
                          f"device_id(s) {missing}, but {VISIBLE_ENV}={os.environ[VISIBLE_ENV]} hides them from this "
                          f"process; unset {VISIBLE_ENV} or list cards {sorted(d.device_id for d in server.devices)} "
                          "in it, or use the rank table of this job")


def check(servers: list[Server], hw: HardwareCfg, path: str) -> None:
    """The table agrees with hardware.num_nodes x hardware.num_devices and numbers ranks as msrun does."""
    where = f"hardware.rank_table_file='{path}'"
    if len(servers) != hw.num_nodes:
        raise ConfigError(f"{where} lists {len(servers)} server(s) but hardware.num_nodes={hw.num_nodes}; set "
                          f"hardware.num_nodes={len(servers)} (or use the rank table of this job)")
    for node, server in enumerate(servers):
        if len(server.rank_ids) != hw.num_devices:
            raise ConfigError(f"{where}: server {node} ('{server.server_id}') lists {len(server.rank_ids)} device(s) "
                              f"but hardware.num_devices={hw.num_devices}; set hardware.num_devices="
                              f"{len(server.rank_ids)} (or use the rank table of this job)")
        for local, rank in enumerate(server.rank_ids):
            if rank != node * hw.num_devices + local:
                raise ConfigError(f"{where}: server {node} device {local} has rank_id={rank}, but msrun numbers "
                                  f"workers node x {hw.num_devices} + local index = {node * hw.num_devices + local} "
                                  "(and swinexp shards the data by it); list each server's devices in rank order")


def this_node(servers: list[Server], path: str) -> int | None:
    """Index of the server that is this host: the pod named like this host (template 2), else the server whose
    address is one of this host's; None when no server gives either (server_ids such as 'node_0')."""
    host = socket.gethostname()
    for node, server in enumerate(servers):
        if server.pod_name is not None and server.pod_name == host:
            return node
    if all(s.address is None for s in servers):
        return None
    for node, server in enumerate(servers):
        if server.address is not None and is_local(server.address):
            return node
    listed = ", ".join(f"{s.server_id}" + (f" ({s.address})" if s.address != s.server_id else "") for s in servers)
    raise ConfigError(f"hardware.rank_table_file='{path}': this host ({host}) is none of its servers "
                      f"[{listed}]; run on a node the table lists, or use the rank table of this job")


def resolve(hw: HardwareCfg, converted: Path | None = None, *, write: bool = True) -> tuple[HardwareCfg, str]:
    """`hw` with node_rank and master_addr taken from its rank table (when it tells this node), after every check;
    and one line saying what the table gave, for the dry run and the launch log.

    Args:
        converted: where a template-2 (group_list) table goes as server_list, the file msrun then gets; None: msrun
            would get the platform's file as it is.
        write: False (the dry run): name `converted` in `hw` without writing it.
    """
    path = str(hw.rank_table_file)
    if hw.rank_table_wait_s < 0:
        raise ConfigError(f"hardware.rank_table_wait_s={hw.rank_table_wait_s} must be >= 0 (seconds)")
    table = read(path, hw.rank_table_wait_s)
    servers = table.servers
    check(servers, hw, path)
    hw = replace(hw, rank_table_file=str(table.file.resolve()))  # msrun and its workers may run elsewhere
    said = f"rank table {path}" + (f" ({table.file})" if table.file != Path(path) else "")
    if table.layout == "group_list" and converted is not None:
        if write:
            write_server_list(servers, converted)
        hw = replace(hw, rank_table_file=str(converted.resolve()))
        said += f" (ModelArts group_list, converted to server_list in {converted})"
    said += f": {len(servers)} server(s) x {hw.num_devices} device(s)"
    node = this_node(servers, path)
    if 0 <= (node if node is not None else hw.node_rank) < len(servers):
        check_visible(servers[node if node is not None else hw.node_rank], path)
    if node is None:
        return hw, (f"{said}; its servers name no address of this host, so node {hw.node_rank} (hardware.node_rank) "
                    f"and master_addr={hw.master_addr}")
    master = servers[0].address or hw.master_addr
    return replace(hw, node_rank=node, master_addr=master), (
        f"{said}; this host is server {node} ('{servers[node].server_id}'), master_addr={master}"
        + (" (server 0)" if servers[0].address else " (hardware.master_addr)"))


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return bool(HOSTNAME.match(name)) and "." in name or name == "localhost"


def is_local(address: str) -> bool:
    """True when `address` (an IP or a host name) is one of this host's addresses: binding to it succeeds."""
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((sockaddr[0], 0))
            return True
        except OSError:
            continue
    return False
