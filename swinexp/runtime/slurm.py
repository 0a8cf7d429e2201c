"""Where this process sits in a SLURM allocation: node rank and the address of node 0, from SLURM's environment.

`conf/hardware/ascend8x2.yaml` reads them through the `${swinexp.slurm_node_rank:...}` and
`${swinexp.slurm_master_addr:...}` resolvers, so the same command runs on every node of a `srun`/submitit job;
outside SLURM (or when given on the command line) the defaults hold.
"""
from __future__ import annotations

import os
import re

NODE_RANK_ENV = "SLURM_NODEID"
NODELIST_ENVS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list, expanded: 'node[01-03,07],gpu1' -> ['node01', 'node02', 'node03', 'node07',
    'gpu1']; zero padding is kept, and several bracket groups in one name multiply out."""
    hosts: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist):
        match = re.search(r"\[([^\]]*)\]", item)
        if match is None:
            hosts.append(item)
            continue
        head, tail = item[:match.start()], item[match.end():]
        for part in match.group(1).split(","):
            low, _, high = part.partition("-")
            numbers = range(int(low), int(high or low) + 1)
            hosts += [h for n in numbers for h in expand_nodelist(f"{head}{str(n).zfill(len(low))}{tail}")]
    return hosts


def nodelist() -> str | None:
    return next((os.environ[k] for k in NODELIST_ENVS if os.environ.get(k)), None)


def master_addr(default: str) -> str:
    """The first host of the SLURM job's node list (node 0, where msrun's scheduler runs), else `default`."""
    given = nodelist()
    return expand_nodelist(given)[0] if given else default


def node_rank(default: int) -> int:
    """This node's index in the SLURM job (SLURM_NODEID), else `default`."""
    return int(os.environ.get(NODE_RANK_ENV, default))


def describe() -> str | None:
    """One line for dry runs: what SLURM told this process, or None outside SLURM."""
    given = nodelist()
    if given is None and NODE_RANK_ENV not in os.environ:
        return None
    return (f"slurm: {NODE_RANK_ENV}={os.environ.get(NODE_RANK_ENV, '<unset>')} -> this is node "
            f"{node_rank(0)}; {'/'.join(NODELIST_ENVS)}={given} -> master_addr={master_addr('127.0.0.1')}")
