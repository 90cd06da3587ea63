"""`respawn demo` end to end: every example scenario runs the real emulators, sim, functions, agents and trainers,
and its summary must show the right outcome, one live node at a time, and no lost work where the emergency
checkpoint fits the notice. Nothing the demo started may outlive it."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import subprocess
import sys
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path
from typing import Callable

import pytest
import yaml

import demo_pages
from respawn.agent.supervisor import processes_with
from sim.demo.scenario import default_scenario, parse_scenario
from test_demo_summary import assert_each_line_rises

SCENARIOS = Path(__file__).resolve().parent.parent / "examples" / "scenarios"


def leftovers(token: str) -> list[int]:
    """The processes a demo run with RESPAWN_DEMO_TEST=token started (they inherit it) that still run; never the
    session's emulators, which this process started."""
    return processes_with(f"RESPAWN_DEMO_TEST={token}".encode())


_session_emulators: Callable[[], tuple[str, str]] | None = None


@pytest.fixture(autouse=True)
def session_emulators(request):
    """run_demo's demos share this worker's Firestore and Pub/Sub emulators (tests/conftest.py), each under a project
    of its own: the Java emulators start once per worker instead of once per demo. Started only once a test runs a
    demo."""
    global _session_emulators

    def hosts() -> tuple[str, str]:
        return request.getfixturevalue("firestore_emulator"), request.getfixturevalue("pubsub_emulator")

    _session_emulators = hosts
    yield
    _session_emulators = None


def project_left(firestore_host: str, pubsub_host: str, project: str) -> list[str]:
    """What of `project` is still on the shared emulators: its collections (both databases), topics, subscriptions."""
    from google.cloud import firestore

    from respawn.contract import NODES_DATABASE

    left = []
    for database in ("(default)", NODES_DATABASE):
        client = firestore.Client(project=project, database=database)
        left += [f"{database}/{c.id}" for c in client.collections()]
        client.close()
    for kind in ("topics", "subscriptions"):
        with urllib.request.urlopen(f"http://{pubsub_host}/v1/projects/{project}/{kind}", timeout=10) as r:
            left += [x["name"] for x in json.load(r).get(kind) or []]
    return left


def run_demo(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    token = uuid.uuid4().hex
    firestore_host, pubsub_host = _session_emulators()
    project = f"demo-test-{token[:12]}"  # no other run on these emulators sees its documents, topics, subscriptions
    env = {**os.environ, "RESPAWN_DEMO_TEST": token}
    r = subprocess.run([sys.executable, "-m", "respawn", "demo", "--json", "--no-live", "--out", str(tmp_path / "out"),
                        "--firestore-emulator", firestore_host, "--pubsub-emulator", pubsub_host, "--project", project,
                        *args], capture_output=True, text=True, env=env, timeout=600)
    assert leftovers(token) == [], "processes the demo started are still running"
    assert r.stdout.strip(), f"no summary; stderr:\n{r.stderr[-4000:]}"
    # The emulators it was given outlive it, with nothing of its project left on them.
    assert project_left(firestore_host, pubsub_host, project) == [], "the demo left its project on the emulators"
    return r, json.loads(r.stdout.strip().splitlines()[-1])


def check_common(r, out, tmp_path, nodes: int = 1):
    assert r.returncode == 0, f"ended {out['state']}, expected {out['expected_state']}:\n{r.stderr[-4000:]}"
    assert out["state"] == out["expected_state"]
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.lstrip().lower().startswith("<!doctype html>") and not (tmp_path / "out" / "timeline.html").exists()
    if out["final_step"]:
        assert_each_line_rises(page)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["state"] == out["state"]
    # One record, every page (issue 46): the summary, the report page, describe and Slack show the same figures.
    assert out["describe"] == str(tmp_path / "out" / "describe.txt"), out["describe"]
    demo_pages.assert_pages_agree(tmp_path / "out", out)
    assert re.match(r"\$\d", out["cost"]), out["cost"]  # what its nodes cost, as the controller's ledger priced them
    check_recoveries(out)
    if out["state"] == "SUCCEEDED":
        assert out["max_live_nodes"] == nodes
        assert out["final_step"] == out["total_steps"]
        assert any(a.startswith(f"Job {out['job_id']} succeeded") for a in out["alerts"])
        assert 0 < out["goodput"] <= 1


def check_recoveries(out) -> list[dict]:
    """Each recovery's figure (respawn.control.recovery_time: notice → every rank stepping, steps lost) is one
    number in the summary, the `recovered` events and Slack, and every recovery has one."""
    from respawn.control import recovery_time

    told = [t["details"] for t in out["transitions"] if recovery_time.told(t["cause"], t["details"])]
    assert out["recovery_seconds"] == [d["recovery_seconds"] for d in told], (out["recovery_seconds"], told)
    assert all(isinstance(x, (int, float)) and x >= 0 for x in out["recovery_seconds"]), out["recovery_seconds"]
    slack = [a for a in out["alerts"] if "recovery time: " in a]  # `recovered`, or `succeeded` that told one
    said = sorted((re.search(r"recovery time: ([\d.]+) s", a)[1], re.search(r"steps lost: (\w+)", a)[1]) for a in slack)
    assert said == sorted((f"{d['recovery_seconds']:.1f}", str(d["steps_lost"])) for d in told), (said, told)
    return told


def test_default_scenario_file_matches_the_built_in_default():
    assert parse_scenario(yaml.safe_load((SCENARIOS / "default.yaml").read_text())) == default_scenario()


def test_every_example_scenario_reads_and_fits_its_job():
    # Those not run end to end here too (their decisions are tested against the functions): `respawn demo
    # --scenario` must still take every one.
    from sim.demo.jobfile import read_job, with_job_file
    from sim.demo.scenario import load_scenario

    for path in sorted(SCENARIOS.glob("*.yaml")):
        sc = load_scenario(path)
        assert sc.name == path.stem, path
        if sc.job_file:
            with_job_file(sc, read_job(Path(sc.job_file)))


@pytest.fixture
def background():
    """Processes a test starts beside its demo run (an uninterrupted reference run, which then costs no time of its
    own: the demo mostly waits); each one's whole session is killed if it still runs when the test ends."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()


def _started(background: list, tmp_path: Path, cmds: list[tuple[list[str], dict]], result: Path) -> Callable[[], Path]:
    """Start each (command, environment) in tmp_path, in a session of its own, its output in tmp_path/reference-N.log;
    returns the function that waits for all of them, asserts each exited 0, and gives `result`."""
    procs = []
    for i, (cmd, env) in enumerate(cmds):
        with open(tmp_path / f"reference-{i}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        background.append(procs[-1])

    def wait() -> Path:
        codes = [p.wait(timeout=300) for p in procs]
        logs = [(tmp_path / f"reference-{i}.log").read_text()[-2000:] for i in range(len(procs))]
        assert codes == [0] * len(procs), "\n".join(logs)
        return result

    return wait


def uninterrupted_slice_state(background: list, tmp_path: Path, sc, processes: int) -> Callable[[], Path]:
    """Starts the scenario's JAX trainer without interruption, as `processes` hosts of a slice (the node agent's
    variables, no flags) with one directory; returns the function that waits for it and gives its final step
    directory: what a run that was never preempted commits."""
    t = sc.trainer
    master = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}.1"  # away from the sim's 127.1.x.y
    env = {**os.environ, "RESPAWN_NUM_NODES": str(processes), "RESPAWN_MASTER_ADDR": master,
           "RESPAWN_LOCAL_CHECKPOINT_DIR": str(tmp_path / "reference")}
    for name in ("RESPAWN_CHECKPOINT_URI", "RESPAWN_STATUS_FILE"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "respawn.ckpt.examples.jax_multiprocess", "--steps", str(t.steps),
           "--checkpoint-every", str(t.checkpoint_every), "--seed", str(t.seed), "--log-every", "1000"]
    return _started(background, tmp_path, [(cmd, {**env, "RESPAWN_NODE_RANK": str(i)}) for i in range(processes)],
                    tmp_path / "reference" / f"step_{t.steps:012d}")


def check_tpu_slice(tmp_path: Path, sc, out: dict, reference: Callable[[], Path]) -> None:
    """Every worker of every slice ran its process; each preemption stopped both at one step, whose emergency
    checkpoint was committed in the remote store (the workers' disks are their own) with both processes' files; the
    next slice's processes both started from it; the final state is bit-identical to an uninterrupted run."""
    from respawn.topology import tpu_hosts

    workers = tpu_hosts(sc.job["accelerator"]["accelerator_type"])
    assert workers == 2
    nodes = tmp_path / "out" / "nodes"
    logs = {p.name.removesuffix(".console.log"): p.read_text(errors="replace") for p in nodes.rglob("*.console.log")}
    slices = sorted(out["workers"], key=lambda n: int(n.rsplit("-", 1)[1]))
    assert len(slices) == len(sc.preemptions) + 1, out["workers"]
    assert out["workers"] == {n: list(range(workers)) for n in slices}, out["workers"]
    assert sorted(logs) == sorted(n if w == 0 else f"{n}.w{w}" for n in slices for w in range(workers)), sorted(logs)
    for preemption, (first, replacement) in zip(sc.preemptions, zip(slices, slices[1:])):
        stops = {}
        for w in range(workers):
            text = logs[first if w == 0 else f"{first}.w{w}"]
            assert f"jax_multiprocess: process {w} of {workers} pid" in text, text[-3000:]
            stops[w] = re.findall(rf"jax_multiprocess\[process {w}\]: preempted at step (\d+); emergency checkpoint "
                                  r"committed \(durable=remote", text)
        assert all(len(found) == 1 for found in stops.values()) and len({f[0] for f in stops.values()}) == 1, stops
        step = int(stops[0][0])
        assert preemption.at_step <= step < sc.trainer.steps
        for w in range(workers):
            text = logs[replacement if w == 0 else f"{replacement}.w{w}"]
            assert f"jax_multiprocess[process {w}]: starting at step {step} of {sc.trainer.steps}" in text, text[-3000:]
        step_dir = tmp_path / "out" / "checkpoints" / f"step_{step:012d}"
        if replacement != slices[-1] and not step_dir.exists():
            continue  # retention removed an earlier emergency step once newer ones were committed
        assert (step_dir / "COMMITTED").exists()
        manifest = json.loads((step_dir / "manifest.json").read_text())
        assert manifest["kind"] == "emergency" and manifest["layout"] == "jax-sharded"
        assert manifest["processes"] == workers
        assert sorted(manifest["files"]) == sorted(f"p{w:05d}.{ext}" for w in range(workers) for ext in ("bin", "pkl"))
    for w in range(workers):
        text = logs[slices[-1] if w == 0 else f"{slices[-1]}.w{w}"]
        assert f"jax_multiprocess[process {w}]: done, final step {sc.trainer.steps}" in text
    final = tmp_path / "out" / "checkpoints" / f"step_{sc.trainer.steps:012d}"
    uninterrupted = reference()
    for w in range(workers):  # every shard of every array (parameters, Adam moments, the dropout key)
        assert (final / f"p{w:05d}.bin").read_bytes() == (uninterrupted / f"p{w:05d}.bin").read_bytes(), w


def check_worker_endpoints(tmp_path: Path, sc) -> None:
    """Every TPU worker's agent read worker-network-endpoints in the scenario's format (its "TPU worker metadata"
    line records the value as served) and gave a slice's trainers worker 0's address as listed: its hostname, a name
    its namespace resolves (or, on a shared loopback network, its address), or the IP of its triple. A single host's
    master is its loopback."""
    from respawn.topology import tpu_hosts
    from sim import netns

    workers = tpu_hosts(sc.job.get("accelerator", {}).get("accelerator_type", "v5litepod-8"))
    seen = [e for p in (tmp_path / "out" / "nodes").rglob("*.console.log") for line in p.read_text().splitlines()
            if line.startswith("{") and (e := json.loads(line))["message"] == "TPU worker metadata"]
    assert len(seen) >= (len(sc.preemptions) + 1) * workers, seen
    for e in seen:
        entries = e["worker_network_endpoints"].split(",")
        assert len(entries) == e["workers"] == workers, e
        name = r"t1v-n-[0-9a-f]{8}-w-"
        if sc.tpu_endpoints == "triples":
            assert all(re.fullmatch(rf"{name}{i}:\d+:[\d.]+", x) for i, x in enumerate(entries)), e
            master = entries[0].rsplit(":", 1)[1]
        else:  # the VM names, which resolve in the sim's netns mode; on a shared loopback network the addresses
            assert all(re.fullmatch(rf"{name}{i}" if netns.available() is None else r"[\d.]+", x)
                       for i, x in enumerate(entries)), e
            master = entries[0]
        assert e["master_addr"] == (master if workers > 1 else "127.0.0.1"), e


def uninterrupted_ddp_state(background: list, tmp_path: Path, sc, world: int) -> Callable[[], Path]:
    """Starts the scenario's DDP trainer without interruption as `world` ranks on one host; returns the function
    that waits for it and gives its final step directory: what a job of that many nodes that was never preempted
    commits."""
    t = sc.trainer
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(world),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1",
           "-m", "respawn.ckpt.examples.torch_ddp", "--steps", str(t.steps), "--checkpoint-every",
           str(t.checkpoint_every), "--seed", str(t.seed), "--state-mb", str(t.state_mb), "--log-every", "1000",
           "--checkpoint-dir", str(tmp_path / "reference")]
    return _started(background, tmp_path, [(cmd, {**env, "GLOO_SOCKET_IFNAME": "lo"})],
                    tmp_path / "reference" / f"step_{t.steps:012d}")


def trained_state(step_dir: Path) -> dict[str, bytes]:
    """A torch checkpoint's model and optimizer arrays by their path in the state (the global RNGs left out: numpy's
    is never seeded by the example, so two uninterrupted runs differ there too)."""
    from respawn.ckpt.serialize import ArrayRef

    manifest = json.loads((step_dir / "manifest.json").read_text())
    data = (step_dir / "data-00000.bin").read_bytes()
    tree = pickle.loads((step_dir / "tree.pkl").read_bytes())
    out: dict[str, bytes] = {}

    def walk(node, path):
        if isinstance(node, ArrayRef):
            parts = manifest["arrays"][node.index]["parts"]
            out[path] = b"".join(data[p["offset"]:p["offset"] + p["nbytes"]] for p in parts)
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{path}/{k}")

    walk({"model": tree["model"], "optimizer": tree["optimizer"]}, "")
    return out


def check_members(tmp_path: Path, sc, out: dict) -> None:
    """A job of several nodes: every rank stopped at one step at each notice and every rank of the next
    generation started from it; only the preempted node was replaced (one new VM name per preemption, the others
    lived through the run)."""
    nodes = sc.job["nodes"]
    # One node each preemption, or each of its slots, and the member a partition cut off.
    lost = sum(len(p.slots) or 1 for p in sc.preemptions) + (sc.faults.partition is not None)
    assert len(out["workers"]) == nodes + lost, out["workers"]
    text = "".join(p.read_text() for p in (tmp_path / "out" / "nodes").rglob("*.console.log"))
    stops = re.findall(r"torch_ddp\[rank (\d+)\]: preempted at step (\d+)", text)
    by_step: dict[str, set[str]] = {}
    for rank, step in stops:
        by_step.setdefault(step, set()).add(rank)
    assert len(by_step) == len(sc.preemptions) and all(len(r) >= min(nodes, sc.job.get("min_nodes", nodes))
                                                       for r in by_step.values()), by_step
    world_after = sc.job.get("min_nodes", nodes) * sc.trainer.ranks  # an elastic job may go on with fewer
    for step in by_step:
        starts = len(re.findall(rf"torch_ddp\[rank \d+\]: starting at step {step} of", text))
        assert starts >= min(len(by_step[step]), world_after), (step, starts)


def check_partition(out: dict, sc) -> dict:
    """The scenario's partition: the stall rule noticed it, the member cut off (its slot's first node) was replaced
    alone, once, and every rank stepped past the cut again. How long that took is printed, not asserted."""
    [cut] = out["partitions"]
    print(f"\npartition of {cut['node']} at step {cut['step']}: every rank stepping again after "
          f"{cut['recovery_seconds']} s")
    assert cut["recovery_seconds"] is not None, out["partitions"]
    assert cut["node"] == f"{out['job_id']}-{sc.faults.partition.slot + 1}"
    losses = [t for t in out["transitions"] if t["cause"] == "unreachable" and t["to"] == "RESTARTING"]
    assert len(losses) == 1 and losses[0]["details"]["cut_off"] == [cut["node"]], losses
    return cut


def check_member_crash(tmp_path: Path, out: dict, sc, cut: dict) -> None:
    """The scenario's trainer crash (EXAMPLE_FAIL_AT_STEP on EXAMPLE_FAIL_RANK, once), after the partition: the next
    generation starts as soon as the member reports the exit (its agent woke the controller), every member's trainer
    restarts in it from one periodic step before the failure, and no VM is made for it."""
    rank = int(sc.job["trainer"]["env"]["EXAMPLE_FAIL_RANK"])
    fail_at = int(sc.job["trainer"]["env"]["EXAMPLE_FAIL_AT_STEP"])
    logs = {p.name.split(".")[0]: p.read_text() for p in (tmp_path / "out" / "nodes").rglob("*.console.log")}
    failing = f"torch_ddp[rank {rank}]: failing after step {fail_at}"
    [crashed] = [node for node, log in logs.items() if failing in log]  # once: not again after the restart
    assert logs[crashed].count(failing) == 1 and crashed != cut["node"], crashed
    crashes = [t for t in out["transitions"] if t["cause"] == "trainer_crashed"]
    generation = crashes[0]["details"]["generation"] if crashes else None
    assert len(crashes) == 1 and generation == cut["generation"] + 2, (crashes, cut)  # the one after the partition's
    alerts = [a for a in out["alerts"] if "trainer crashed" in a]
    assert len(alerts) == 1 and f"in generation {generation - 1}" in alerts[0], out["alerts"]
    crashed_at = min(e["time"] for e in _agent_log(logs[crashed])
                     if e["message"] == "trainer ended; waiting for the next generation" and e["exit_code"] == 1)
    restarted = [times[0] for times in ([e["time"] for e in _agent_log(log) if e["message"] == "trainer started"
                                         and e.get("generation") == generation] for log in logs.values()) if times]
    assert len(restarted) == sc.job["nodes"], restarted  # every member's trainer, on the VMs it had
    # It names the member that raised first, with its own error, though a peer whose collective broke under it may
    # report first (the controller waits for every member's exit, CRASH_SETTLE_SECONDS at most); any other member it
    # names crashed too.
    ended = {node: [e for e in _agent_log(log) if e["message"] == "trainer ended; waiting for the next generation"
                    and e.get("generation") == generation - 1] for node, log in logs.items()}
    named = re.search(r"trainer exited \d+ on (.+?) in generation", alerts[0]).group(1).split(", ")
    assert named[0] == crashed and all(ended[node] and all(e["exit_code"] not in (0, 75, 76) for e in ended[node])
                                       for node in named), (named, ended)
    assert f"last error: respawn.ckpt.examples._common.InjectedFailure: torch_ddp[rank {rank}]: the failure" \
        in alerts[0], alerts[0]
    seconds = (datetime.fromisoformat(max(restarted)) - datetime.fromisoformat(crashed_at)).total_seconds()
    print(f"member crash: every member's trainer restarted in generation {generation} within {seconds:.0f} s (log "
          f"times, 1 s resolution) of the crashed member's report, with a {sc.sweep_seconds:g} s sweep period; "
          "gloo's collective timeout is 30 min")
    # The crashed member woke the controller (one sweep message for the job, once its heartbeat said so) before
    # every member restarted. (It wakes it once more when its trainer exits, and once as it is first prepared.)
    woken = [e["time"] for e in _agent_log(logs[crashed]) if e["message"] == WOKEN and e["why"].startswith("trainer")]
    assert len([t for t in woken if t <= max(restarted)]) == 1, (crashed_at, woken, restarted)
    assert crashed_at <= woken[0] <= max(restarted), (crashed_at, woken, restarted)
    # After the partition every rank started at one step, the one the recovery resumed from, at or before the
    # furthest step the job reached before it stalled; after the crash at one periodic step before the failure (the
    # crashed member's second start). (The cut's own step is the runner's heartbeat view when it cut the link, up to
    # a beat behind the ranks: they may commit one more periodic step before the cut takes hold.)
    starts = [int(s) for s in re.findall(r"torch_ddp\[rank \d+\]: starting at step (\d+) of", logs[crashed])]
    groups = rank_groups("".join(logs.values()), "starting at")
    world = set(range(sc.job["nodes"] * sc.trainer.ranks))
    [stall] = [x for x in out["recoveries"] if x["loss_cause"] == "unreachable"]
    assert len(starts) >= 2 and starts[0] == stall["resumed_from"] <= stall["furthest_step"] < starts[1] < fail_at, (
        starts, stall)
    assert cut["step"] <= stall["furthest_step"] and starts[0] % sc.trainer.checkpoint_every == 0, (cut, stall)
    assert starts[1] % sc.trainer.checkpoint_every == 0 and groups[starts[0]] == groups[starts[1]] == world, groups


def test_multi_node_scenario(tmp_path, background):
    """A 3-node Spot job whose members fail three ways (multi-node.yaml; partition.yaml's and member-crash.yaml's
    paths run here, a member preempted alone in test_container_scenario and test_multi_node_job_file_scenario): a
    member cut off from its peers, then its replacement's trainer raising, then the master and a member preempted at
    once. Each lost node replaced in the job's zone (the crash none), every rank stopped at one step at the notice
    and restarted from it, nothing lost to a notice, one true alert per recovery, and the final state bit-identical
    to an uninterrupted run."""
    sc = parse_scenario(yaml.safe_load((SCENARIOS / "multi-node.yaml").read_text()))
    nodes = sc.job["nodes"]
    reference = uninterrupted_ddp_state(background, tmp_path, sc, nodes * sc.trainer.ranks)  # beside the demo
    r, out = run_demo(tmp_path, "--scenario", str(SCENARIOS / "multi-node.yaml"))
    check_common(r, out, tmp_path, nodes=nodes)
    assert out["max_live_per_slot"] == 1  # never two nodes for one slot
    assert out["zones"] == [sc.zones[0].name]  # every node in the job's zone; none moved
    cut = check_partition(out, sc)
    check_member_crash(tmp_path, out, sc, cut)
    # Every recovery has its figure, once every member of the new generation steps, nothing lost to a notice (the
    # partition redid the steps since the last periodic checkpoint), and Slack hears one true alert per recovery:
    # the partition's, and one per preemption, one for the master and the member lost at once.
    told = check_recoveries(out)
    causes = [x["loss_cause"] for x in out["recoveries"]]
    assert len(told) == len(causes) == 1 + len(sc.preemptions), (told, causes)
    assert causes == ["unreachable"] + ["preempted"] * len(sc.preemptions), causes
    assert [x["steps_lost"] for x in out["recoveries"][1:]] == [0] * len(sc.preemptions), out["recoveries"]
    recovered = [a for a in out["alerts"] if a.startswith(f"Job {out['job_id']} recovered")]
    assert len(recovered) == len(told) and all("training again" in a for a in recovered), recovered
    check_members(tmp_path, sc, out)
    text = "".join(p.read_text() for p in (tmp_path / "out" / "nodes").rglob("*.console.log"))
    finals = re.findall(r"torch_ddp\[rank (\d+)\]: done, final step (\d+)", text)
    assert sorted(finals) == [(str(i), str(sc.trainer.steps)) for i in range(nodes * sc.trainer.ranks)], finals
    final = tmp_path / "out" / "checkpoints" / f"step_{sc.trainer.steps:012d}"
    assert trained_state(final) == trained_state(reference())


@pytest.mark.parametrize("name", ["hf-multi-node"])
def test_multi_node_job_file_scenario(tmp_path, name):
    """A multi-node job of the user's own (its job_file's nodes, its own trainer): one node per slot, every rank of
    every node stopped after one agreed step, one restart per preemption, nothing lost."""
    sc = parse_scenario(yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text()))
    nodes = yaml.safe_load((SCENARIOS / sc.job_file).read_text())["nodes"]
    r, out = run_demo(tmp_path, "--scenario", str(SCENARIOS / f"{name}.yaml"))
    check_common(r, out, tmp_path, nodes=nodes)
    assert out["max_live_per_slot"] == 1
    assert out["lost_steps"] == 0 and out["restarts"] == len(sc.preemptions)
    stops: dict[str, set[str]] = {}
    for step, rank in re.findall(r'"message": "preempted at step (\d+); emergency checkpoint committed".*?"rank": (\d+)',
                                 "".join(p.read_text() for p in (tmp_path / "out" / "nodes").rglob("*.console.log"))):
        stops.setdefault(step, set()).add(rank)
    assert len(stops) == len(sc.preemptions) and all(ranks == {str(r) for r in range(nodes)}
                                                     for ranks in stops.values()), stops


# Decisions without processes are tested against the functions, the emulators and the sim, not here: every zone
# refusing (all-zones-stocked-out.yaml: test_functions_placement), Slack's 5xx and a create's 503
# (flaky-apis.yaml: test_functions_alerts, test_functions_multinode), a smaller elastic world (elastic.yaml:
# test_membership, test_job_table, test_functions_multinode; elastic-two-lost runs it end to end below), zones ranked
# by capacity advice (advice.yaml: test_functions_rank), audit events lost or delivered three times
# (duplicate-events.yaml: test_functions_guarantees). A single-host TPU VM created directly (tpu.yaml): its create
# is test_functions_providers', the same node through a queued resource test_functions_queued's (tpu-queued.yaml), its
# agent's single-host master test_agent_process's; tpu-slice runs the TPU workers' agents end to end. An invalid spec
# (invalid-spec.yaml): INVALID with the field named, its alert and no VM are test_functions_lifecycle's, the
# duplicate zone test_schema's. A slice whose metadata lists name:uid:IP triples (tpu-slice-triples.yaml): the sim
# serves that form (test_sim_tpu), and each worker's agent reads it and gives its trainer worker 0's IP as the master
# (test_agent_process, both forms); tpu-slice runs the slice end to end.
# Scenarios whose processes a run below already starts, their point a control-plane behaviour (issue #49 item 7;
# tests/README.md, "Moved out of the demo runs", names each behaviour's test): a flex-start tier and its run's end
# (flex-start-fallback.yaml: test_functions_flex_start, test_agent_run_end), a budget that runs out (budget.yaml:
# test_functions_budget, test_costs_table, test_agent_e2e), a reservation tier (reservation.yaml: test_reservations),
# TPU through a queued resource (tpu-queued.yaml: test_functions_queued, test_agent_process), a state too large for
# the notice (large-state.yaml: test_agent_save_outcome, test_decide_badday, test_functions_save_outcome,
# test_trainer_checkpoint), the HF Trainer on one node (hf.yaml: test_integration_transformers; hf-multi-node runs the
# HF Trainer end to end below), a setup that fails (setup-fails.yaml: test_functions_failures, test_agent_prepare),
# a replacement lost as it joins, again and again (rejoin-preempted.yaml: move-master-lost below loses its new
# master's replacement too; the hybrid job test_functions_multinode), the trainer image on one node
# (container.yaml: container-multi-node below runs under sh -c without exec; the restart in place with the layers on
# the disk test_agent_container and test_sim_containers), the JAX example on one GPU VM with a notice and a host error
# (jax.yaml: test_agent_e2e, test_functions_lifecycle, test_decide_badday; tpu-slice runs JAX under agents below),
# a member cut off from its peers and a member's trainer that raises (partition.yaml, member-crash.yaml: multi-node
# below is cut off, then its replacement's trainer raises; the agents' side test_agent_member_crash, the nudge
# test_agent_nudge), a Lightning job of the user's own (lightning.yaml: test_integration_lightning under the launch
# wrapper; job files under agents in hf-multi-node below and test_demo_pages_agree).
@pytest.mark.parametrize("name", ["ddp-8", "tpu-slice"])
def test_scenario(tmp_path, background, name):
    sc = parse_scenario(yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text()))
    if name.startswith("tpu-slice"):  # the uninterrupted run its final state must equal, beside the demo
        from respawn.topology import tpu_hosts

        reference = uninterrupted_slice_state(background, tmp_path, sc,
                                              tpu_hosts(sc.job["accelerator"]["accelerator_type"]))
    r, out = run_demo(tmp_path, "--scenario", str(SCENARIOS / f"{name}.yaml"))
    check_common(r, out, tmp_path)
    with_notice = [p for p in sc.preemptions if p.kind == "preempted"]
    if name == "ddp-8":
        # Every notice stopped all eight ranks after one agreed step, which then resumed: nothing lost.
        assert out["lost_steps"] == 0
        stops = re.findall(r"torch_ddp\[rank (\d+)\]: preempted at step (\d+)", "".join(
            p.read_text() for p in (tmp_path / "out" / "nodes").rglob("*.console.log")))
        by_step: dict[str, set[str]] = {}
        for rank, step in stops:
            by_step.setdefault(step, set()).add(rank)
        assert len(by_step) == len(with_notice) and all(ranks == {str(r) for r in range(8)}
                                                         for ranks in by_step.values()), by_step
    elif name.startswith("tpu-slice"):
        assert out["lost_steps"] == 0
        # Each preemption of the slice is one recovery, its figure once both workers step again, nothing lost.
        assert len(out["recovery_seconds"]) == len(sc.preemptions)
        assert [d["steps_lost"] for d in check_recoveries(out)] == [0] * len(sc.preemptions)
        check_tpu_slice(tmp_path, sc, out, reference)
    assert out["restarts"] == len(sc.preemptions) >= len(with_notice)
    if sc.accelerator == "tpu":
        check_worker_endpoints(tmp_path, sc)
    if name.startswith("tpu-slice"):
        # Through queued resources (a slice's default; issue #26 item 2): one request serving at a time (the
        # preempted one, SUSPENDED, is deleted once its notice is over), none left at the end.
        assert out["max_queued_resources"] == 1 and out["queued_resources_left"] == 0


def rank_groups(text: str, what: str) -> dict[int, set[int]]:
    """step → the ranks whose console says `what` ("preempted at" or "starting at") that step."""
    groups: dict[int, set[int]] = {}
    for rank, step in re.findall(rf"torch_ddp\[rank (\d+)\]: {what} step (\d+)", text):
        groups.setdefault(int(step), set()).add(int(rank))
    return groups


def grown_back_share(text: str, nodes: int, sc) -> float:
    """The share of the steps left after the first loss that the grown-back world of every node trained."""
    regrown = max(step for step, ranks in rank_groups(text, "starting at").items() if len(ranks) == nodes)
    first_loss = sc.preemptions[0].at_step
    return (sc.trainer.steps - regrown) / (sc.trainer.steps - first_loss)


@pytest.mark.parametrize("name", ["elastic-two-lost", "move-master-lost"])
def test_harder_multi_node_scenario(tmp_path, name):
    """Losses the plain scenario does not reach: two members lost while the zone is dry (an elastic world of one,
    grown back), a move to the next zone whose new master is lost as it joins, and its replacement too (a replacement
    lost as it joins, again: rejoin-preempted.yaml's path, whose run this one took over; tests/README.md "Moved out
    of the demo runs"). The multi-node invariants hold, and Slack hears one true alert per recovery."""
    sc = parse_scenario(yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text()))
    r, out = run_demo(tmp_path, "--scenario", str(SCENARIOS / f"{name}.yaml"))
    nodes = sc.job["nodes"]
    check_common(r, out, tmp_path, nodes=nodes)  # never more live nodes than `nodes`, the last step reached
    assert out["max_live_per_slot"] == 1  # never two nodes for one slot
    assert out["lost_steps"] == 0
    moved = name == "move-master-lost"
    assert out["zones"] == [z.name for z in sc.zones][:2 if moved else 1]  # one zone but for the move
    causes = [t["cause"] for t in out["transitions"]]
    recovered = [a for a in out["alerts"] if a.startswith(f"Job {out['job_id']} recovered")]
    assert len(recovered) == causes.count("recovered") >= 1, (recovered, causes)
    assert all("training again" in a and "steps lost: 0" in a for a in recovered), recovered
    assert not [a for a in out["alerts"] if "waiting for capacity" in a], out["alerts"]
    if moved:
        assert f"all {nodes} nodes in {sc.zones[1].name}" in recovered[-1]
        # The move made every member anew; each later loss, a replacement lost as it joined, made one node: the
        # survivor kept its VM.
        assert len(out["workers"]) == 2 * nodes + len(sc.preemptions) - 1, out["workers"]
    # Every stop and every start is one step for every rank of its world (ranks 0..k-1 together, never apart).
    text = "".join(p.read_text() for p in (tmp_path / "out" / "nodes").rglob("*.console.log"))
    for what in ("preempted at", "starting at"):
        groups = rank_groups(text, what)
        assert groups and all(ranks == set(range(len(ranks))) for ranks in groups.values()), (what, groups)
    if name == "elastic-two-lost":
        # Each generation's world, whatever transition recorded it (the survivor's alone: `no_capacity`).
        sizes = [len(t["details"]["members"]) for t in out["transitions"]
                 if t["details"].get("members") and t["details"].get("generation")]
        assert sizes[0] == nodes and 1 in sizes and sizes[-1] == nodes, sizes
        share = grown_back_share(text, nodes, sc)
        print(f"\n{name}: the grown-back world of {nodes} trained {share:.0%} of the steps left after the loss")
        assert share > 0.5


WOKEN = "controller woken: sweep requested for this job"


def _agent_log(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"severity"')]


def test_a_scenario_names_a_job_file_of_its_own(tmp_path):
    """A scenario's job_file (relative to the scenario) is read as `respawn jobs register` reads it; what names real
    Google Cloud or the image is pointed at the stand-ins, the rest runs as written; injections must fit the job."""
    from respawn.app.cli import CliError
    from sim.demo.jobfile import read_job, with_job_file
    from sim.demo.runner import job_spec
    from sim.demo.scenario import ScenarioError, load_scenario

    for folder in ("scenarios", "jobs", "code"):
        (tmp_path / folder).mkdir()
    written = yaml.safe_load((SCENARIOS.parent / "jobs" / "gpu-spot-small.yaml").read_text())
    written["trainer"]["workdir"] = "../code"
    (tmp_path / "jobs" / "mine.yaml").write_text(yaml.safe_dump(written))
    (tmp_path / "scenarios" / "mine.yaml").write_text(yaml.safe_dump(
        {"name": "mine", "job_file": "../jobs/mine.yaml", "preemptions": [{"at_step": 10, "slot": 1}]}))
    sc = load_scenario(tmp_path / "scenarios" / "mine.yaml")
    job = read_job(Path(sc.job_file))
    assert job.workdir == tmp_path / "code" and job.path == tmp_path / "jobs" / "mine.yaml"
    with pytest.raises(ScenarioError, match=r"slots must be below job.nodes \(1\)"):
        with_job_file(sc, job)
    sc = with_job_file(sc.model_copy(update={"preemptions": [], "job": {"labels": {"x": "y"}}}), job)
    assert [z.name for z in sc.zones] == written["zones"] and sc.accelerator == "gpu"
    spec = job_spec(sc, tmp_path / "ckpt", "gs://b/respawn/workdirs/sha256-0.tar.gz", job)
    assert spec["checkpoint_uri"] == (tmp_path / "ckpt").as_uri() and spec["trainer"]["interpreter"] == sys.executable
    assert spec["trainer"]["workdir"] == "gs://b/respawn/workdirs/sha256-0.tar.gz" and spec["labels"] == {"x": "y"}
    assert [spec["trainer"][k] for k in ("setup", "command")] == [written["trainer"][k] for k in ("setup", "command")]
    with pytest.raises(ScenarioError, match="trainer and accelerator describe the demo's example job"):
        parse_scenario({"name": "x", "job_file": "j.yaml", "trainer": {"steps": 10}})
    written["trainer"]["workdir"] = "gs://b/code.tar.gz"
    (tmp_path / "jobs" / "mine.yaml").write_text(yaml.safe_dump(written))
    with pytest.raises(CliError, match="the demo packs and uploads a directory"):
        read_job(tmp_path / "jobs" / "mine.yaml")


def _image_pulls(tmp_path: Path) -> dict[str, list[bool]]:
    """node → for each boot's image stage, whether it pulled (False: the image was on the node's disk)."""
    pulls = {}
    for path in (tmp_path / "out" / "nodes").rglob("*.console.log"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
        pulls[path.name.split(".")[0]] = [not e.get("skipped") for e in lines
                                          if e.get("message") == "prepare stage" and e.get("stage") == "image_pull"]
    return pulls


def test_container_scenario(tmp_path):
    """The trainer in an OCI image (issue #47), one run for both container paths (container-multi-node.yaml; the
    single-node container.yaml's own points are test_agent_container's and test_sim_containers', tests/README.md
    "Moved out of the demo runs"): each node's agent pulls the demo's image from the local registry with podman and
    runs setup and the trainer in it (the image's own Python 3.11.2, not this 3.11 venv's); the notice reaches every
    rank's saving process past `sh -c` without exec, torchrun and its 2 DataLoader workers, and ends in a committed
    emergency checkpoint; only the lost node of the 2-node job is replaced; each VM pulls once."""
    name = "container-multi-node"
    sc = parse_scenario(yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text()))
    assert sc.trainer.image and sc.trainer.shell and sc.job["nodes"] == 2
    r, out = run_demo(tmp_path, "--scenario", str(SCENARIOS / f"{name}.yaml"))
    nodes = sc.job["nodes"]
    check_common(r, out, tmp_path, nodes=nodes)
    assert out["lost_steps"] == 0 and out["restarts"] == len(sc.preemptions)
    consoles = "".join(p.read_text() for p in (tmp_path / "out" / "nodes").rglob("*.console.log"))
    assert "train.py: torch 2.13.0+cpu on Python 3.11.2" in consoles  # the image's python, the venv is not 3.11.2
    told = check_recoveries(out)
    assert [d["steps_lost"] for d in told] == [0] * len(sc.preemptions)
    # Past the shell that did not exec: every rank committed its part of the emergency checkpoint at one step.
    saved = re.findall(r"torch_ddp\[rank (\d+)\]: preempted at step (\d+); emergency checkpoint committed",
                       consoles)
    assert sorted(rank for rank, _ in saved) == [str(r) for r in range(nodes)] and len({s for _, s in saved}) == 1, saved
    assert out["max_live_per_slot"] == 1
    check_members(tmp_path, sc, out)
    # Each VM pulled once; the survivor's next generation pulled nothing.
    pulls = _image_pulls(tmp_path)
    assert len(pulls) == nodes + 1 and all(p and p[0] and not any(p[1:]) for p in pulls.values()), pulls
