"""Ascend rank tables (the cluster's RANK_TABLE_FILE): checked before msrun starts, then handed to it.

A rank table lists every server (node) of the job and its cards: `{"status": "completed", "server_count": "2",
"server_list": [{"server_id": "10.0.0.1", "device": [{"device_id": "0", "device_ip": ..., "rank_id": "0"}, ...]},
...]}` (MindSpore's "rank table Startup" tutorial; CANN's HCCL guide adds `host_ip` per server in version 1.2).
msrun takes it as `--rank_table_file` (Ascend only) and exports RANK_TABLE_FILE to the workers; HCCL builds its
communicators from it. The table fixes this node's rank (the server that is this host) and the scheduler's host
(server 0); swinexp's hardware.num_nodes / num_devices must agree with it, and so must the rank order, because
msrun numbers workers node_rank x num_devices + local index and swinexp shards the data by that number.
"""
from __future__ import annotations

import ipaddress
import json
import re
import socket
from dataclasses import dataclass, replace
from pathlib import Path

from swinexp.config import HardwareCfg
from swinexp.registry import ConfigError

HOSTNAME = re.compile(r"^[A-Za-z0-9.-]+$")  # a server_id such as 'node_0' is a name, not an address


@dataclass(frozen=True)
class Server:
    server_id: str
    address: str | None   # host_ip, or server_id when it is an IP or a host name
    rank_ids: tuple[int, ...]


def load(path: str) -> list[Server]:
    """The servers of the rank table at `path`, in order, after the checks that need only the file."""
    where = f"hardware.rank_table_file='{path}'"
    if not path:
        raise ConfigError(f"{where} is empty: this preset reads it from RANK_TABLE_FILE, which is not set; export "
                          "RANK_TABLE_FILE=<rank table JSON> or pass hardware.rank_table_file=PATH")
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{where} does not exist; point it at the cluster's rank table JSON, or launch without one "
                          "(hardware=ascend8)")
    try:
        table = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where} is not JSON ({err.msg} at line {err.lineno}); fix or regenerate the file") from None
    if not isinstance(table, dict) or not isinstance(table.get("server_list"), list) or not table["server_list"]:
        raise ConfigError(f"{where} has no server_list; swinexp reads the rank table format with server_list "
                          "(version 1.0 / 1.2): regenerate it in that format")
    if table.get("status", "completed") != "completed":
        raise ConfigError(f"{where} has status '{table['status']}', not 'completed': the cluster has not finished "
                          "writing it; start the job once it is complete")
    servers = []
    for i, entry in enumerate(table["server_list"]):
        devices = entry.get("device") if isinstance(entry, dict) else None
        try:
            rank_ids = tuple(int(d["rank_id"]) for d in devices or [])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{where}: server {i} has a device without an integer rank_id; fix the file") from None
        server_id = str(entry.get("server_id", ""))
        address = entry.get("host_ip") or (server_id if _is_address(server_id) else None)
        servers.append(Server(server_id, address, rank_ids))
    count = table.get("server_count")
    if count is not None and str(count) != str(len(servers)):
        raise ConfigError(f"{where} says server_count={count} but its server_list has {len(servers)} server(s); "
                          "fix or regenerate the file")
    return servers


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
    """Index of the server that is this host; None when no server gives an address (server_ids such as 'node_0')."""
    if all(s.address is None for s in servers):
        return None
    for node, server in enumerate(servers):
        if server.address is not None and is_local(server.address):
            return node
    listed = ", ".join(f"{s.server_id}" + (f" ({s.address})" if s.address != s.server_id else "") for s in servers)
    raise ConfigError(f"hardware.rank_table_file='{path}': this host ({socket.gethostname()}) is none of its servers "
                      f"[{listed}]; run on a node the table lists, or use the rank table of this job")


def resolve(hw: HardwareCfg) -> tuple[HardwareCfg, str]:
    """`hw` with node_rank and master_addr taken from its rank table (when the servers have addresses), after every
    check; and one line saying what the table gave, for the dry run and the launch log."""
    path = str(hw.rank_table_file)
    servers = load(path)
    check(servers, hw, path)
    hw = replace(hw, rank_table_file=str(Path(path).resolve()))  # msrun and its workers may run elsewhere
    node = this_node(servers, path)
    if node is None:
        return hw, (f"rank table {path}: {len(servers)} server(s) x {hw.num_devices} device(s); its server_ids are "
                    f"not addresses, so node {hw.node_rank} (hardware.node_rank) and master_addr={hw.master_addr}")
    master = servers[0].address or hw.master_addr
    return replace(hw, node_rank=node, master_addr=master), (
        f"rank table {path}: {len(servers)} server(s) x {hw.num_devices} device(s); this host is server {node} "
        f"('{servers[node].server_id}'), master_addr={master} (server 0)")


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
