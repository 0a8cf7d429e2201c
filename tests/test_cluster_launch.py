"""Launching where the cards are: rank tables, ModelArts' per-card copies, and the shared run dir of several nodes.

The slow tests run real msrun processes on this host: two "nodes" (two launchers, one worker each) against the
2-worker single-node run, and eight ModelArts-style copies of one command. Only the platform is faked: its
environment variables and a rank table file.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest
from omegaconf import DictConfig, OmegaConf

from swinexp.app.dry_run import dry_run_report
from swinexp.build import resolve
from swinexp.config import HardwareCfg, read
from swinexp.registry import ConfigError
from swinexp.runtime import launch, node_sync, rank_table
from swinexp.runtime.watchdog import launched_processes
from tests.conftest import ROOT, SMOKE
from tests.servers import free_port

OTHER_HOST = "10.255.255.1"  # an address no test machine has


def _table(path: Path, servers: list[str], devices: int, **changes: object) -> str:
    table = {"version": "1.0", "server_count": str(len(servers)), "status": "completed",
             "server_list": [{"server_id": server, "host_nic_ip": "reserve",
                              "device": [{"device_id": str(d), "device_ip": f"192.168.{n}.{d}",
                                          "rank_id": str(n * devices + d)} for d in range(devices)]}
                             for n, server in enumerate(servers)]}
    table.update(changes)
    path.write_text(json.dumps(table))
    return str(path)


def test_a_rank_table_gives_this_nodes_rank_and_the_master_and_goes_to_msrun(tmp_path: Path) -> None:
    path = _table(tmp_path / "rank_table.json", [OTHER_HOST, "127.0.0.1"], devices=8)
    hw, line = rank_table.resolve(HardwareCfg(device_target="Ascend", num_devices=8, num_nodes=2,
                                              rank_table_file=path))
    assert (hw.node_rank, hw.master_addr) == (1, OTHER_HOST)  # this host is server 1; server 0 hosts the scheduler
    assert rank_table.resolve(HardwareCfg(num_devices=8, num_nodes=2, rank_table_file="rank_table.json"))[0] \
        .rank_table_file == path  # relative to where the command starts (the test's cwd), made absolute for msrun
    assert "this host is server 1 ('127.0.0.1'), master_addr=10.255.255.1" in line
    cmd = launch.msrun_command(hw, Path("run.py"), ["hardware=ascend8_ranktable"], tmp_path)
    assert f"--rank_table_file={path}" in cmd and "--node_rank=1" in cmd
    assert f"--log_dir={tmp_path / 'msrun' / 'node1'}" in cmd  # each node its own msrun logs in the shared dir


@pytest.mark.parametrize("servers,devices,changes,hw_changes,message", [
    (["127.0.0.1"], 8, {"status": "initializing"}, {"rank_table_wait_s": 0},
     "t.json still has status 'initializing', not 'completed', after waiting 0 s: the cluster has not finished "
     "writing it; raise hardware.rank_table_wait_s"),
    (["127.0.0.1"], 8, {"server_count": "2"}, {}, "says server_count=2 but its server_list has 1 server(s)"),
    (["127.0.0.1"], 8, {"server_list": []}, {}, "has no server_list"),
    (["127.0.0.1", OTHER_HOST], 8, {}, {}, "lists 2 server(s) but hardware.num_nodes=1; set hardware.num_nodes=2"),
    (["127.0.0.1"], 4, {}, {}, "server 0 ('127.0.0.1') lists 4 device(s) but hardware.num_devices=8; set "
                               "hardware.num_devices=4"),
    ([OTHER_HOST], 8, {}, {}, "is none of its servers [10.255.255.1]; run on a node the table lists"),
])
def test_rank_table_mistakes_stop_the_launch_with_one_line(tmp_path: Path, servers: list[str], devices: int,
                                                           changes: dict, hw_changes: dict, message: str) -> None:
    path = _table(tmp_path / "t.json", servers, devices, **changes)
    with pytest.raises(ConfigError) as err:
        rank_table.resolve(HardwareCfg(device_target="Ascend", num_devices=8, rank_table_file=path, **hw_changes))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_rank_table_file_missing_unreadable_or_out_of_rank_order(tmp_path: Path) -> None:
    def fails(path: str, match: str) -> None:
        with pytest.raises(ConfigError, match=match):
            rank_table.resolve(HardwareCfg(num_devices=2, rank_table_file=path))

    fails(str(tmp_path / "nope.json"), "does not exist; point it at the cluster's rank table JSON")
    fails("", r"is empty: this preset reads it from RANK_TABLE_FILE, which is not set; export")
    (tmp_path / "bad.json").write_text('{"server_list": [}')
    fails(str(tmp_path / "bad.json"), r"is not JSON \(Expecting value at line 1\)")
    swapped = json.loads(Path(_table(tmp_path / "t.json", ["127.0.0.1"], 2)).read_text())
    swapped["server_list"][0]["device"].reverse()
    (tmp_path / "t.json").write_text(json.dumps(swapped))
    fails(str(tmp_path / "t.json"), r"server 0 device 0 has rank_id=1, but msrun numbers workers node x 2 \+ local")


def _template2(directory: Path, status: str, pods: list[str], devices: int) -> Path:
    """A ModelArts template-2 table as CCE writes it into /user/config (rank_table.py's docstring has the source)."""
    directory.mkdir(parents=True, exist_ok=True)
    table = {"status": status, "group_count": "1", "group_list": [{
        "group_name": "job", "device_count": str(len(pods) * devices), "instance_count": str(len(pods)),
        "instance_list": [{"pod_name": pod, "server_id": f"10.19.1.{n}",
                           "devices": [{"device_id": str(d), "device_ip": f"192.{d}.{n}.1"} for d in range(devices)]}
                          for n, pod in enumerate(pods)]}]}
    partial = directory / "partial"
    partial.write_text(json.dumps(table))
    partial.replace(directory / "jobstart_hccl.json")  # as a platform replaces it: never half a file
    return directory / "jobstart_hccl.json"


def test_a_modelarts_directory_is_waited_for_until_complete_and_its_group_list_goes_to_msrun_as_server_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "user" / "config"  # what RANK_TABLE_FILE names on ModelArts: the directory
    pods = ["job-worker-1", "job-worker-0"]  # the file lists pods in any order; the pod number ranks them
    _template2(config, "initializing", pods, devices=8)
    completer = threading.Timer(1.5, lambda: _template2(config, "completed", pods, devices=8))
    completer.start()
    monkeypatch.setattr(rank_table.socket, "gethostname", lambda: "job-worker-1")  # a pod's host name is its name
    hw = HardwareCfg(device_target="Ascend", num_devices=8, num_nodes=2, rank_table_file=str(config),
                     rank_table_wait_s=60, master_addr="job-worker-0.svc")
    started = time.monotonic()
    try:
        resolved, line = rank_table.resolve(hw, tmp_path / "run" / rank_table.CONVERTED_FILE)
    finally:
        completer.cancel()
    assert time.monotonic() - started >= 1.4  # it waited for 'completed' instead of failing on 'initializing'
    converted = tmp_path / "run" / "rank_table.json"
    assert resolved.rank_table_file == str(converted) and (resolved.node_rank, resolved.master_addr) == (
        1, "job-worker-0.svc")  # pod 1 is node 1; server_ids are the nodes' hosts, so the master is kept
    assert f"({config / 'jobstart_hccl.json'}) (ModelArts group_list, converted to server_list in {converted})" in line
    table = json.loads(converted.read_text())
    assert [s["server_id"] for s in table["server_list"]] == ["10.19.1.1", "10.19.1.0"]  # pod 0 first
    assert [[d["rank_id"] for d in s["device"]] for s in table["server_list"]] == [
        [str(r) for r in range(8)], [str(r) for r in range(8, 16)]]
    assert table["server_list"][0]["device"][3] == {"device_id": "3", "device_ip": "192.3.1.1", "rank_id": "3"}
    def cards(path: Path) -> list[tuple[str, tuple[rank_table.Device, ...]]]:
        return [(s.server_id, s.devices) for s in rank_table.load(str(path))]

    assert cards(converted) == cards(config)  # the same servers and cards, now as server_list


def test_a_table_that_stays_pending_fails_after_the_wait_naming_file_status_and_setting(tmp_path: Path) -> None:
    file = _template2(tmp_path / "config", "initializing", ["job-0"], devices=8)
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        rank_table.resolve(HardwareCfg(device_target="Ascend", num_devices=8, rank_table_file=str(file.parent),
                                       rank_table_wait_s=1.0))
    assert 1.0 <= time.monotonic() - started < 10
    assert str(err.value) == (f"hardware.rank_table_file='{file.parent}': {file} still has status 'initializing', "
                              "not 'completed', after waiting 1 s: the cluster has not finished writing it; raise "
                              "hardware.rank_table_wait_s, or start the job once the table is complete")
    with pytest.raises(ConfigError, match=r"is a directory without jobstart_hccl.json or hccl.json after waiting 0 s"):
        rank_table.resolve(HardwareCfg(num_devices=8, rank_table_file=str(tmp_path), rank_table_wait_s=0))


def test_a_mindcluster_table_places_this_pod_by_its_container_ip(tmp_path: Path) -> None:
    _table(tmp_path / "hccl.json", [OTHER_HOST], devices=8)
    table = json.loads((tmp_path / "hccl.json").read_text())  # MindCluster's hccl.json (rank_table.py's docstring)
    table["server_list"][0].update(host_ip=OTHER_HOST, container_ip="127.0.0.1", hardware_type="800I-A2-32G")
    (tmp_path / "hccl.json").write_text(json.dumps(table))
    hw, line = rank_table.resolve(HardwareCfg(device_target="Ascend", num_devices=8, rank_table_file=str(tmp_path)))
    assert hw.rank_table_file == str(tmp_path / "hccl.json") and hw.master_addr == "127.0.0.1"
    assert "this host is server 0 ('10.255.255.1'), master_addr=127.0.0.1 (server 0)" in line


def test_the_cards_the_table_gives_this_node_must_be_visible_to_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = _table(tmp_path / "t.json", ["127.0.0.1"], devices=8)
    hw = HardwareCfg(device_target="Ascend", num_devices=8, rank_table_file=path)
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "7,6,5,4,3,2,1,0")
    rank_table.resolve(hw)  # physical ids, any order
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "0,1,2,3")
    with pytest.raises(ConfigError) as err:
        rank_table.resolve(hw)
    assert str(err.value) == (f"hardware.rank_table_file='{path}': server '127.0.0.1' (this node) lists device_id(s) "
                              "[4, 5, 6, 7], but ASCEND_RT_VISIBLE_DEVICES=0,1,2,3 hides them from this process; unset "
                              "ASCEND_RT_VISIBLE_DEVICES or list cards [0, 1, 2, 3, 4, 5, 6, 7] in it, or use the "
                              "rank table of this job")


PROBE = """import json, os, sys
from pathlib import Path
out = Path(sys.argv[-1].split("=", 1)[1])  # msrun passes the run's overrides, hydra.run.dir last
name = os.environ["MS_ROLE"] + "-" + os.environ.get("RANK_ID", "")
(out / (name + ".json")).write_text(json.dumps({k: os.environ.get(k) for k in sys.argv[1].split(",")}))
"""


@pytest.mark.parametrize("given", [False, True])
def test_msrun_workers_see_a_rank_table_only_when_hardware_names_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, given: bool) -> None:
    monkeypatch.setenv("RANK_TABLE_FILE", "/user/config")  # stale: left by the platform or an earlier shell
    monkeypatch.setenv("MINDSPORE_HCCL_CONFIG_PATH", "/etc/old_hccl.json")
    (tmp_path / "probe.py").write_text(PROBE)
    table = _table(tmp_path / "t.json", ["127.0.0.1"], devices=2) if given else None
    hw = HardwareCfg(num_devices=2, master_port=free_port(), rank_table_file=table)
    run_dir = tmp_path / "run"
    hw = launch.prepare(hw, run_dir)
    assert launch.launch(hw, tmp_path / "probe.py", [",".join(launch.RANK_TABLE_ENVS)], run_dir) == 0
    seen = {p.stem: json.loads(p.read_text()) for p in run_dir.glob("MS_WORKER-*.json")}
    assert sorted(seen) == ["MS_WORKER-0", "MS_WORKER-1"]  # real msrun workers, each reporting its environment
    want = dict.fromkeys(launch.RANK_TABLE_ENVS, table)
    assert all(env == want for env in seen.values()), seen
    out = capsys.readouterr().out
    assert ("rank table: ignoring RANK_TABLE_FILE=/user/config, MINDSPORE_HCCL_CONFIG_PATH=/etc/old_hccl.json from "
            "the environment (hardware.rank_table_file is null; set it to use that table)" in out) is not given


def test_the_ranktable_preset_reads_rank_table_file_and_the_dry_run_shows_it(
        compose: Callable[..., DictConfig], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK_TABLE_FILE", _table(tmp_path / "hccl.json", ["127.0.0.1"], devices=8))
    plan = resolve(compose("hardware=ascend8_ranktable"), backend=False)
    report = dry_run_report(plan, ["hardware=ascend8_ranktable"], tmp_path)
    assert f"rank table {tmp_path / 'hccl.json'}: 1 server(s) x 8 device(s); this host is server 0" in report
    assert f"--join=True --rank_table_file={tmp_path / 'hccl.json'} " in report
    monkeypatch.delenv("RANK_TABLE_FILE")
    unset = read(compose("hardware=ascend8_ranktable")).hardware
    with pytest.raises(ConfigError, match="export RANK_TABLE_FILE"):
        dry_run_report(replace(plan, hardware=unset), [], tmp_path)


def test_modelarts_variables_place_the_node_and_elect_one_copy_per_node(
        compose: Callable[..., DictConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"MA_NUM_HOSTS": "2", "VC_TASK_INDEX": "1", "MA_NUM_GPUS": "8",
                        "VC_WORKER_HOSTS": "job-worker-0.svc,job-worker-1.svc"}.items():
        monkeypatch.setenv(name, value)
    hw: HardwareCfg = OmegaConf.to_object(compose("hardware=modelarts_ascend8").hardware)
    assert (hw.num_nodes, hw.node_rank, hw.num_devices, hw.master_addr) == (2, 1, 8, "job-worker-0.svc")
    assert launch.not_the_launcher(hw) is None  # no card variable: the platform started one copy per node
    monkeypatch.setenv("DEVICE_ID", "8")  # a second node's card numbering also elects its card 0
    assert launch.not_the_launcher(hw) is None
    monkeypatch.setenv("DEVICE_ID", "3")
    assert launch.not_the_launcher(hw) == ("modelarts: this copy (DEVICE_ID=3) does not launch; on node 1 the "
                                              "copy with DEVICE_ID % 8 == 0 starts msrun for the node's 8 card(s)")
    given: HardwareCfg = OmegaConf.to_object(compose("hardware=modelarts_ascend8", "hardware.node_rank=0").hardware)
    assert given.node_rank == 0  # the command line wins over the platform


def test_shared_dir_holds_the_default_run_dir_and_mlflow_store(tmp_path: Path) -> None:
    from hydra import compose as compose_cfg
    from hydra import initialize_config_dir

    from swinexp.tracking import open_tracker
    from tests.conftest import CONF_DIR

    overrides = ["tracking=mlflow", f"hardware.shared_dir={tmp_path / 'obs'}"]
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        cfg = compose_cfg("config", overrides=overrides, return_hydra_config=True)
    assert str(cfg.hydra.run.dir).startswith(f"{tmp_path / 'obs'}/outputs/")
    tracking = OmegaConf.to_container(cfg.tracking, resolve=True)
    assert open_tracker(tracking, cfg.hardware.shared_dir).server_uri == f"sqlite:///{tmp_path / 'obs' / 'mlflow.db'}"
    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        local = compose_cfg("config", overrides=["tracking=mlflow"], return_hydra_config=True)
    assert str(local.hydra.run.dir).startswith("outputs/")  # unset: as before


def _meet(run_dirs: list[Path], timeout_s: float) -> list[BaseException | None]:
    """Every node's check_shared at once, one thread per node; what each raised."""
    outcome: list[BaseException | None] = [None] * len(run_dirs)

    def node(rank: int) -> None:
        try:
            node_sync.check_shared(run_dirs[rank], rank, len(run_dirs), timeout_s)
        except ConfigError as err:
            outcome[rank] = err

    threads = [threading.Thread(target=node, args=(rank,)) for rank in range(len(run_dirs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcome


def test_nodes_start_only_from_one_shared_run_dir(tmp_path: Path) -> None:
    assert _meet([tmp_path / "shared"] * 3, timeout_s=20) == [None, None, None]
    assert _meet([tmp_path / "shared"] * 3, timeout_s=20) == [None, None, None]  # a rerun meets again

    node0, node1 = _meet([tmp_path / "node0", tmp_path / "node1"], timeout_s=1)
    assert str(node0) == ("hardware.num_nodes=2: node(s) [1] did not answer node 0 (their run dirs are not this "
                          f"directory, or they did not start) within 1 s in the run dir {tmp_path / 'node0'}: give "
                          "every node the same hydra.run.dir on a filesystem all nodes mount (e.g. under "
                          "hardware.shared_dir)")
    assert str(node1).startswith("hardware.num_nodes=2: node 1 did not meet node 0 (node 0 uses another directory, "
                                 f"or did not start) within 1 s in the run dir {tmp_path / 'node1'}")

    # a node-local dir where node 0 once ran holds its old token and go: a node 1 there still does not pass
    assert (tmp_path / "shared" / node_sync.SYNC_DIR / "go").exists()
    with pytest.raises(ConfigError, match="node 1 did not meet node 0"):
        node_sync.check_shared(tmp_path / "shared", 1, 2, timeout_s=1)


def _command(run_dir: Path, tmp: Path, *hardware: str) -> list[str]:
    smoke = [o for o in SMOKE if not o.startswith("hardware=")]
    return [sys.executable, str(ROOT / "run.py"), *smoke, *hardware, f"data.root={tmp / 'data'}",
            "trainer.deterministic=true", f"hydra.run.dir={run_dir}"]


def _start(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=log.parent, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})


def _wait_for(condition: Callable[[], bool], what: str, procs: list[subprocess.Popen], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert all(p.poll() is None for p in procs), f"a launcher ended before {what}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.2)


def _digests(run_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(run_dir.glob("weights_rank*.sha256"))}


@pytest.mark.slow
def test_two_nodes_on_one_shared_dir_train_as_two_workers_of_one_node_and_resume_after_a_kill(tmp_path: Path) -> None:
    reference = subprocess.run(_command(tmp_path / "reference", tmp_path, "hardware=cpu2",
                                        f"hardware.master_port={free_port()}"),
                               cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr[-3000:]
    want = _digests(tmp_path / "reference")
    assert list(want) == ["weights_rank0.sha256", "weights_rank1.sha256"]

    run_dir, port = tmp_path / "shared", free_port()

    def nodes(name: str, *debug: str) -> list[subprocess.Popen]:
        return [_start(_command(run_dir, tmp_path, "hardware=cpu", "hardware.num_nodes=2", "hardware.num_devices=1",
                                f"hardware.node_rank={rank}", f"hardware.master_port={port}", *debug),
                       tmp_path / f"{name}-node{rank}.log") for rank in (0, 1)]

    # both nodes killed while rank 0 writes the second epoch's checkpoint (a preempted job) ...
    phases = tmp_path / "phases.txt"
    launchers = nodes("killed", f"debug.phase_file={phases}", "debug.park_at=checkpoint:2")
    _wait_for(lambda: phases.exists() and "checkpoint 2 parked" in phases.read_text(), "a parked checkpoint",
              launchers)
    for proc in launchers:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(launched_processes(p.pid) for p in launchers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(launched_processes(p.pid) for p in launchers), "workers outlived their killed launchers"
    assert not (run_dir / "weights_rank0.sha256").exists()

    # ... and the same two commands again resume to the 2-worker single-node result, bit for bit
    launchers = nodes("resumed")
    for rank, proc in enumerate(launchers):
        assert proc.wait(timeout=900) == 0, (tmp_path / f"resumed-node{rank}.log").read_text()[-3000:]
    assert _digests(run_dir) == want
    assert f"resumed from {run_dir / 'checkpoints' / 'step-00000003.ckpt'}: epoch 2" in \
        (run_dir / "msrun" / "node0" / "worker_0.log").read_text()
    assert sorted(p.name for p in (run_dir / "msrun").iterdir()) == ["node0", "node1"]


@pytest.mark.slow
def test_eight_modelarts_card_copies_start_exactly_one_msrun(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = _command(run_dir, tmp_path, "hardware=modelarts_ascend8", "hardware.device_target=CPU",
                       "hardware.chip=null", f"hardware.master_port={free_port()}")  # the 910's chip is not on CPU
    platform = {"MA_NUM_HOSTS": "1", "VC_TASK_INDEX": "0", "MA_NUM_GPUS": "8", "RANK_SIZE": "8"}
    copies = [_start(command, tmp_path / f"card{card}.log", {**platform, "DEVICE_ID": str(card), "RANK_ID": str(card)})
              for card in range(8)]
    for card in range(1, 8):
        assert copies[card].wait(timeout=120) == 0, (tmp_path / f"card{card}.log").read_text()[-2000:]
        out = (tmp_path / f"card{card}.log").read_text()
        assert f"modelarts: this copy (DEVICE_ID={card}) does not launch" in out and "launching" not in out

    def msruns() -> list[str]:
        return [env["cmdline"] for env in launched_processes(copies[0].pid).values()
                if "msrun --worker_num=8 --local_worker_num=8" in env["cmdline"]]

    _wait_for(lambda: bool(msruns()), "msrun under card 0's copy", copies[:1], timeout=300)
    assert len(msruns()) == 1 and "launching 8 workers" in (tmp_path / "card0.log").read_text()
    copies[0].send_signal(signal.SIGKILL)  # enough: one msrun was started, by card 0's copy; the rest is cpu2's
    copies[0].wait(timeout=30)
    deadline = time.monotonic() + 30
    while launched_processes(copies[0].pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert launched_processes(copies[0].pid) == {}


@pytest.mark.slow
def test_two_nodes_with_different_run_dirs_stop_before_msrun_with_one_line(tmp_path: Path) -> None:
    port = free_port()
    launchers = [_start(_command(tmp_path / f"local{rank}", tmp_path, "hardware=cpu", "hardware.num_nodes=2",
                                 "hardware.num_devices=1", f"hardware.node_rank={rank}", f"hardware.master_port={port}",
                                 "hardware.node_sync_timeout_s=3"), tmp_path / f"node{rank}.log") for rank in (0, 1)]
    for rank, proc in enumerate(launchers):
        assert proc.wait(timeout=300) == 1
        last = (tmp_path / f"node{rank}.log").read_text().strip().splitlines()[-1]
        assert last.startswith("ConfigError: hardware.num_nodes=2: node") and last.endswith(
            "give every node the same hydra.run.dir on a filesystem all nodes mount (e.g. under hardware.shared_dir)")
        assert not (tmp_path / f"local{rank}" / "msrun").exists()  # msrun never started
