"""The trainer in the job's image (issue #47, the agent's side): the command line the agent builds (GPU and TPU
flags, mounts, environment), the pull through a local registry with the token from the sim's metadata server, and a
real agent running a torch trainer with 2 DataLoader workers under `sh -c` without exec in a podman container
(runc): adopted after SIGHUP, its notice → an emergency checkpoint committed at the step reached and exit 75, no
container left; restarted in place without pulling again; a trainer that ignores the notice killed at the deadline
with its container removed.

Real parts only: podman with runc as a sim node runs it (sim/node_containers.py), the demo's trainer image
(tests/trainer_image_fixtures.py) in Debian's docker-registry (tests/registry_fixtures.py), the sim's metadata server
and the Firestore emulator (tests/agent_fixtures.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import uuid
import zipfile
from pathlib import Path

import pytest

from agent_fixtures import REPO, agent_env, attributes, installed_tree, settings, wait_for  # noqa: F401
from registry_fixtures import push_image, registry  # noqa: F401
from sim import node_containers
from sim.node_containers import NodeContainers
from trainer_image_fixtures import podman_binary, trainer_image_built, trainer_image_ref  # noqa: F401
from respawn import contract
from respawn.agent import container, pull
from respawn.agent.container import GPU, TPU, Runtime, RunSpec
from respawn.agent.image_run import ImageRun
from respawn.agent.metadata import MetadataClient, ServiceAccountToken
from sim.metadata import MetadataServer

DOCKER = Runtime("docker", "/usr/bin/docker")
PODMAN = Runtime("podman", "/usr/bin/podman")


# --- the command line, pure ------------------------------------------------------------------------------------------


def _spec(accelerator=None, **kw) -> RunSpec:
    return RunSpec(image="us-docker.pkg.dev/p/r/t:1@sha256:" + "a" * 64, argv=["sh", "-c", "python3 train.py"],
                   name="respawn-trainer-j-1", labels=container.labels("j", 1, container.ROLE_TRAINER),
                   env_names=["MASTER_ADDR", "RESPAWN_NOTICE_DIR"], mounts=["/var/lib/respawn", "/mnt/ckpt"],
                   workdir="/var/lib/respawn/workdirs/sha256-x", accelerator=accelerator, **kw)


@pytest.mark.parametrize("runtime,accelerator,flags", [
    (DOCKER, GPU, ["--gpus", "all"]),
    (PODMAN, GPU, ["--device", "nvidia.com/gpu=all"]),
    (DOCKER, TPU, ["--privileged"]),
    (PODMAN, TPU, ["--privileged"]),
    (DOCKER, None, []),
])
def test_the_command_line_shares_the_nodes_namespaces_and_passes_the_accelerator(runtime, accelerator, flags):
    argv = container.run_argv(runtime, _spec(accelerator))
    image_at = argv.index(_spec().image)
    options, command = argv[:image_at], argv[image_at + 1:]
    assert options[:3] == [runtime.exe, "run", "--rm"] and command == ["sh", "-c", "python3 train.py"]
    for flag in ("--pid=host", "--ipc=host", "--network=host"):
        assert flag in options, flag
    assert options[options.index("--name") + 1] == "respawn-trainer-j-1"
    assert {options[i + 1] for i, a in enumerate(options) if a == "--label"} == {
        "respawn.job=j", "respawn.attempt=1", "respawn.role=trainer"}
    assert [options[i + 1] for i, a in enumerate(options) if a == "--volume"] == [
        "/var/lib/respawn:/var/lib/respawn", "/mnt/ckpt:/mnt/ckpt"]
    assert options[options.index("--workdir") + 1] == "/var/lib/respawn/workdirs/sha256-x"
    # each variable by name only: values (a token, the user's secrets) never on a command line
    assert [options[i + 1] for i, a in enumerate(options) if a == "--env"] == ["MASTER_ADDR", "RESPAWN_NOTICE_DIR"]
    gpu_tpu = [a for a in options if a in ("--gpus", "all", "--device", "nvidia.com/gpu=all", "--privileged")]
    assert gpu_tpu == flags


def test_the_container_gets_what_the_agent_set_and_the_nodes_endpoints_not_the_nodes_own_environment():
    base = {"PATH": "/usr/bin", "HOME": "/root", "GCE_METADATA_HOST": "10.0.0.2:80", "CONTAINERS_CONF": "/x",
            "PYTHONPATH": "/host/site", "RESPAWN_CONTAINER_RUNTIME": "podman"}
    env = {**base, "PYTHONPATH": "/node/library/h/site", "MASTER_ADDR": "10.0.0.3", "PET_NNODES": "2",
           contract.ENV_NOTICE_DIR: "/node/notice", "RESPAWN_TRAINER_RUN": "2026-12-06T00:00:00", "WANDB_KEY": "s"}
    assert container.forwarded_names(env, base) == sorted([
        "GCE_METADATA_HOST", "MASTER_ADDR", "PET_NNODES", "PYTHONPATH", contract.ENV_NOTICE_DIR,
        "RESPAWN_TRAINER_RUN", "WANDB_KEY"])
    # the node directory, a file:/// store outside it, a workdir inside it (not mounted twice)
    assert container.same_path_mounts("/var/lib/respawn", "file:///mnt/ckpt/job/", "/var/lib/respawn/workdirs/w") == [
        "/var/lib/respawn", "/mnt/ckpt/job"]
    assert container.same_path_mounts("/var/lib/respawn", "gs://b/j", None) == ["/var/lib/respawn"]


def test_the_workdir_is_the_containers_working_directory_and_without_one_the_images_own():
    run = ImageRun(PODMAN, "r.example/i@sha256:" + "b" * 64, "/var/lib/respawn", job_id="j", attempt=2, worker=0,
                   checkpoint_uri="gs://b/j", accelerator=GPU, base_env={})
    trainer = run.wrap(["python3", "t.py"], {}, role=container.ROLE_TRAINER, workdir="/var/lib/respawn/workdirs/w",
                       also=["RESPAWN_TRAINER_RUN"])
    assert trainer[trainer.index("--workdir") + 1] == "/var/lib/respawn/workdirs/w"
    assert trainer[trainer.index("--name") + 1] == "respawn-trainer-j-2"
    assert ["--env", "RESPAWN_TRAINER_RUN"] == trainer[trainer.index("--env"):trainer.index("--env") + 2]
    setup = run.wrap(["python3", "prepare.py"], {}, role=container.ROLE_SETUP, workdir=None)
    assert "--workdir" not in setup and "--device" not in setup  # the image's WORKDIR; no accelerator for setup


def test_the_runtime_is_docker_with_its_daemon_podman_without_and_a_missing_one_says_what_to_do(tmp_path):
    both, only_podman, none = tmp_path / "both", tmp_path / "podman", tmp_path / "none"
    for d, exes in ((both, ("docker", "podman")), (only_podman, ("podman",)), (none, ())):
        d.mkdir()
        for exe in exes:
            (d / exe).write_text("#!/bin/sh\n")
            (d / exe).chmod(0o755)
    socket = tmp_path / "docker.sock"
    socket.write_text("")
    assert container.find_runtime({"PATH": str(both)}, docker_socket=str(socket)).name == "docker"
    assert container.find_runtime({"PATH": str(both)}, docker_socket=str(tmp_path / "gone")).name == "podman"
    assert container.find_runtime({"PATH": str(both), container.ENV_RUNTIME: "podman"},
                                  docker_socket=str(socket)).name == "podman"
    with pytest.raises(container.RuntimeMissing, match="neither docker nor podman.*Deep Learning VM"):
        container.find_runtime({"PATH": str(none)})
    with pytest.raises(container.RuntimeMissing, match="no docker on PATH"):
        container.find_runtime({"PATH": str(only_podman), container.ENV_RUNTIME: "docker"})


def test_the_accelerator_is_read_from_the_nodes_devices(tmp_path):
    assert container.find_accelerator(str(tmp_path)) is None
    (tmp_path / "vfio").mkdir()
    (tmp_path / "vfio" / "vfio").write_text("")
    assert container.find_accelerator(str(tmp_path)) is None  # the vfio control device alone is no TPU
    (tmp_path / "vfio" / "0").write_text("")
    assert container.find_accelerator(str(tmp_path)) == TPU
    (tmp_path / "nvidia0").write_text("")
    assert container.find_accelerator(str(tmp_path)) == GPU


def test_only_googles_registries_get_the_nodes_token(monkeypatch):
    assert pull.takes_token("us-central1-docker.pkg.dev", {})
    assert pull.takes_token("gcr.io", {}) and pull.takes_token("eu.gcr.io", {})
    assert not pull.takes_token("docker.io", {}) and not pull.takes_token("evilpkg.dev", {})
    assert not pull.takes_token("127.0.0.1:5000", {})
    assert pull.takes_token("127.0.0.1:5000", {pull.ENV_TOKEN_HOSTS: "127.0.0.1:5000"})


# --- real containers ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def podman(tmp_path_factory, registry):  # noqa: F811
    """podman as a sim node runs it (sim/node_containers.py: runc, cgroupfs, its storage in the session's folder, the
    registry over plain http), forced as the agent's runtime, the registry given the node's token."""
    podman_binary()
    root = tmp_path_factory.mktemp("podman")
    env = {**NodeContainers(registries=(registry.host,)).prepare(root), container.ENV_RUNTIME: "podman",
           pull.ENV_TOKEN_HOSTS: registry.host}
    yield env
    run_env = {**os.environ, **env}
    subprocess.run(["podman", "rm", "--all", "--force", "--time", "0"], env=run_env, capture_output=True)
    subprocess.run(["podman", "system", "reset", "--force"], env=run_env, capture_output=True, timeout=300)
    node_containers.forget(root)


def library_wheel(directory: Path) -> tuple[Path, str]:
    """The respawn wheel's library part (respawn/*.py and respawn/ckpt/, as the wheel lays them out), and its
    sha256."""
    tree = installed_tree(directory / "tree")
    wheel = directory / "respawn-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path in sorted(tree.rglob("*.py")):
            rel = path.relative_to(tree)
            if rel.parts[1] in ("agent", "control", "app"):
                continue
            z.write(path, str(rel))
        z.writestr("respawn-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: respawn\nVersion: 0.1.0\n")
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()


def _podman(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *argv], env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


def test_the_pull_uses_the_nodes_token_for_its_registry_and_is_skipped_when_the_image_is_there(
        tmp_path, registry, podman):  # noqa: F811
    ref = push_image(registry.host, "respawn/tiny", "v1", {"hello.txt": "hi\n"})
    md = MetadataServer(name="pull-1", zone="us-central1-a", project="p", attributes={}).start()
    env = {**os.environ, **podman}
    try:
        token = ServiceAccountToken(MetadataClient(md.host))
        runtime = container.find_runtime(env)
        os.environ[pull.ENV_TOKEN_HOSTS] = registry.host  # takes_token reads the agent's own environment
        try:
            assert pull.pull(runtime, ref, str(tmp_path), env, token.get) is True
        finally:
            del os.environ[pull.ENV_TOKEN_HOSTS]
        assert pull.present(runtime, ref, env)
        auth = tmp_path / pull.AUTH_DIR / "config.json"
        assert stat.S_IMODE(auth.stat().st_mode) == 0o600
        creds = json.loads(auth.read_text())["auths"][registry.host]["auth"]
        assert base64.b64decode(creds).decode() == "oauth2accesstoken:sim-token"  # the sim's metadata token
        assert pull.pull(runtime, ref, str(tmp_path), env, token.get) is False  # on the disk: no second pull
        missing = f"{registry.host}/respawn/absent:v1@sha256:{'0' * 64}"
        with pytest.raises(pull.PullFailed, match=r"cannot pull .*respawn/absent.* with podman"):
            pull.pull(runtime, missing, str(tmp_path), env, token.get)
    finally:
        md.stop()
        _podman(podman, "rmi", "--force", ref)


def _trainer_log(node_dir: Path) -> str:
    path = node_dir / "trainer.log"
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_containerized_trainer_is_adopted_saves_on_the_notice_and_leaves_no_container(
        agent_env, tmp_path, podman, trainer_image_ref):  # noqa: F811
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    shutil.copy(REPO / "tests" / "notice_tree_trainer.py", node_dir / "notice_tree_trainer.py")
    store = tmp_path / "store"
    wheel, digest = library_wheel(tmp_path / "wheel")
    # The user's entrypoint: a shell that does not exec the trainer (it prints the exit status after it).
    command = ["sh", "-c", f"python3 {node_dir}/notice_tree_trainer.py --steps 100000 --workers 2 --step-seconds 0.05; "
                           "rc=$?; echo \"trainer exited $rc\"; exit $rc"]
    job = f"ctr{uuid.uuid4().hex[:6]}"
    s = settings(command, f"file://{store}", image=trainer_image_ref, notice_budget_seconds=20)
    attrs = {**attributes(job, 1, agent_env.project, s), contract.ATTR_LIBRARY: f"file://{wheel}#sha256={digest}"}
    md = agent_env.metadata(f"{job}-1", attrs)
    boot = {"RESPAWN_BOOT_ID": "boot-1", **podman}
    name = container.container_name(job, 1)

    first = agent_env.agent(md, node_dir, **boot)
    wait_for(lambda: "step 3 rank 0" in _trainer_log(node_dir), 600,
             "the containerized trainer's third step")
    stages = {e["stage"]: e for e in first.events() if e["message"] == "prepare stage"}
    assert not stages["image_pull"].get("skipped"), stages["image_pull"]  # a new disk pulls
    record = first.trainer_record()
    assert record["container"]["name"] == name
    listed = _podman(podman, "ps", "--filter", f"label=respawn.job={job}", "--format", "{{.Names}}").stdout.split()
    assert listed == [name]
    assert "sim-token" not in first.output()

    first.proc.send_signal(signal.SIGHUP)  # the agent's restart: the trainer stays
    assert first.wait(60) == contract.EXIT_AGENT_DETACH
    second = agent_env.agent(md, node_dir, **boot)
    wait_for(lambda: second.has("adopting the trainer a previous agent started"), 60, "the adoption")
    step = wait_for(lambda: (contract.read_status(str(node_dir / contract.STATUS_FILE)) or {}).get("step", 0) >= 10
                    and contract.read_status(str(node_dir / contract.STATUS_FILE))["step"], 300, "step 10")

    md.set("instance/preempted", "TRUE")
    assert second.wait(120) == 0
    hb = agent_env.heartbeat(f"{job}-1")
    assert hb["state"] == "exited" and hb["notice"] == "preempted", hb
    assert hb["exit_code"] == contract.EXIT_PREEMPTED, hb
    assert hb["emergency"]["state"] == "committed" and hb["committed_step"] >= step, hb
    log = _trainer_log(node_dir)
    assert "loader workers alive at the notice: 2/2" in log  # the notice reached the saver, not its workers
    assert f"trainer exited {contract.EXIT_PREEMPTED}" in log  # through the shell that did not exec
    assert (store / f"step_{hb['committed_step']:08d}").is_dir() or any(store.iterdir())
    assert _podman(podman, "container", "exists", name).returncode == 1  # nothing of it left

    # Restarted in place (same disk, new boot), now with a trainer that ignores the notice: no second pull; at the
    # deadline the agent kills it and removes its container.
    md.set("instance/preempted", "FALSE")
    hung = settings(["sh", "-c", "trap '' TERM; echo hung; while :; do sleep 1; done"], f"file://{store}",
                    image=trainer_image_ref, notice_budget_seconds=3)
    md.set_attribute(contract.ATTR_SETTINGS, json.dumps(hung))
    third = agent_env.agent(md, node_dir, **{**boot, "RESPAWN_BOOT_ID": "boot-2"})
    wait_for(lambda: "hung" in _trainer_log(node_dir).split("trainer exited")[-1],
             120, "the second life's trainer")
    stages = {e["stage"]: e for e in third.events() if e["message"] == "prepare stage"}
    assert stages["image_pull"].get("skipped") is True, stages["image_pull"]
    md.set("instance/preempted", "TRUE")
    assert third.wait(120) == 0
    assert third.has("the trainer did not exit within the notice budget; killing its process group")
    assert third.has("the trainer's container removed")
    assert _podman(podman, "container", "exists", name).returncode == 1
    assert agent_env.heartbeat(f"{job}-1")["exit_code"] not in (0, contract.EXIT_PREEMPTED)
