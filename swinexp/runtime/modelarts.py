"""Where this process sits in a ModelArts training job, from the variables the platform sets in the container.

`conf/hardware/modelarts_ascend8.yaml` reads them through `${swinexp.modelarts:<key>,<default>}`, so one command
runs on every node; `hardware.platform=modelarts` makes the per-card copies of that command (ModelArts' Ascend jobs
start the boot command once per card) leave the node's msrun launch to one of them (`runtime.launch.not_the_launcher`).

Sources (read 2026-12): Huawei Cloud, ModelArts user guide, "Managing Environment Variables of a Training
Container" (develop-modelarts-0104; "分布式训练作业环境变量"): MA_NUM_HOSTS = number of instances (nodes),
VC_TASK_INDEX = this container's index from 0, VC_WORKER_HOSTS = every node's domain name in order, comma-separated
(node 0 first: the docs take `${VC_WORKER_HOSTS%%,*}` as the master address), MA_NUM_GPUS = accelerator cards of the
container, MA_CURRENT_IP = the container's IP. Per-card copies: the MindSpore model zoo's ModelArts adapter
(`model_utils/moxing_adapter.py`) reads DEVICE_ID, RANK_ID and RANK_SIZE in each copy and lets only the copy with
`DEVICE_ID % min(RANK_SIZE, 8) == 0` do per-node work; CANN also knows the card as ASCEND_DEVICE_ID.
"""
from __future__ import annotations

import os

NUM_NODES_ENV = "MA_NUM_HOSTS"
NODE_RANK_ENV = "VC_TASK_INDEX"
HOSTS_ENV = "VC_WORKER_HOSTS"
CARDS_ENV = "MA_NUM_GPUS"
DEVICE_ENVS = ("DEVICE_ID", "ASCEND_DEVICE_ID")  # the card of this copy, when the platform starts one per card
PLATFORMS = ("modelarts",)


def value(key: str, default: object) -> object:
    """`${swinexp.modelarts:key,default}`: num_nodes, node_rank, num_devices or master_addr from the platform's
    environment, else `default` (outside ModelArts, or when the platform leaves the variable unset)."""
    if key == "master_addr":
        hosts = os.environ.get(HOSTS_ENV, "")
        return hosts.split(",")[0].strip() or default
    env = {"num_nodes": NUM_NODES_ENV, "node_rank": NODE_RANK_ENV, "num_devices": CARDS_ENV}.get(key)
    if env is None:
        raise KeyError(f"swinexp.modelarts knows num_nodes, node_rank, num_devices and master_addr, not '{key}'")
    given = os.environ.get(env, "").strip()
    return int(given) if given.isdigit() and (key != "num_devices" or int(given) > 0) else default


def card() -> tuple[str, int] | None:
    """(variable, value) of the card this copy was started for, or None when the platform started one copy."""
    for name in DEVICE_ENVS:
        given = os.environ.get(name, "").strip()
        if given.isdigit():
            return name, int(given)
    return None
