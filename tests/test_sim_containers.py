"""The trainer image on the stand-ins (issue #47 item 5): built offline (sim/trainer_image.py), pushed to the local
registry, pulled by a sim node's podman (sim/node_containers.py: runc, its storage on the node's disk), run on the
node's namespaces; a restart in place keeps the pulled layers, a new VM has none; a power-off takes the node's
containers too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from registry_fixtures import push_image
from trainer_image_fixtures import node_podman, podman_binary, trainer_image_built, trainer_image_ref  # noqa: F401

from sim import node_containers, trainer_image
from sim.node_containers import NodeContainers
from sim.nodes import NodeRuntime, guest_pids

LOADER = ("import torch, torch.utils.data, numpy, json;"
          "ds = torch.utils.data.TensorDataset(torch.arange(8.));"
          "batches = [b[0].tolist() for b in torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)];"
          "print(json.dumps({'torch': torch.__version__, 'batches': batches}))")


def test_the_image_is_debian_python_with_torch_and_the_trainer(trainer_image_built):
    config = json.loads(trainer_image_built.config)
    assert config["architecture"] == "amd64" and config["config"]["WorkingDir"] == "/opt/trainer"
    manifest = json.loads(trainer_image_built.manifest)
    assert [layer["digest"] for layer in manifest["layers"]] == [layer["digest"] for layer in trainer_image_built.layers]
    assert [layer["name"] for layer in trainer_image_built.layers] == ["base", "environment", "trainer"]
    for layer in trainer_image_built.layers:  # the files are what the manifest says
        assert (trainer_image_built.folder / layer["file"]).stat().st_size == layer["size"]
    assert trainer_image.cached() == trainer_image_built  # the recipe names the cache: a second build is none


def test_a_node_pulls_once_and_runs_torch_with_loader_workers(trainer_image_ref, registry, tmp_path):
    node = tmp_path / "node"
    podman = node_podman(node, registry.host)
    pulled = podman("pull", trainer_image_ref)
    assert pulled.returncode == 0, pulled.stderr
    ran = podman("run", "--rm", "--pid=host", "--ipc=host", "--network=host", trainer_image_ref, "python3", "-c", LOADER)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["torch"].startswith("2.13.0") and out["batches"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    listed = podman("run", "--rm", trainer_image_ref, "sh", "-c", "ls /opt/trainer; readlink /usr/bin/python; "
                    "test -e /usr/local/lib/python3.11/dist-packages/respawn || echo no-respawn")
    assert listed.stdout.split() == ["prepare.py", "requirements.txt", "train.py", "python3", "no-respawn"]

    # Restarted in place: the node's /run is empty again (a tmpfs), its disk keeps the image.
    again = node_podman(node, registry.host)
    assert not (node_containers.run_dir(node) / "storage").exists()
    assert again("image", "exists", trainer_image_ref).returncode == 0
    # A new VM (another disk) has nothing until it pulls.
    assert node_podman(tmp_path / "other", registry.host)("image", "exists", trainer_image_ref).returncode == 1
    for gone in (node, tmp_path / "other"):
        node_containers.forget(gone)


def _cmdline(pid: int) -> bytes:
    """A guest's command line; empty for one that exited meanwhile (the pull's short-lived processes)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


@pytest.fixture
def base_image_ref(trainer_image_built, registry) -> str:  # noqa: F811
    """The trainer image's Debian base layer alone, pushed as an image of its own: a container that runs `sleep`
    needs no torch, and its pull unpacks 48 MB of layers, not the environment's 240 MB more (about 14 s of CPU)."""
    [base] = [layer for layer in trainer_image_built.layers if layer["name"] == "base"]
    return push_image(registry.host, "team/base", "v1", layers=[trainer_image_built.folder / base["file"]])


def test_a_power_off_takes_the_nodes_containers(base_image_ref, registry, tmp_path):
    """The container's processes carry nothing of the boot (conmon is a daemon of its own): the sim's power-off
    still finds them, by the node's storage on conmon's command line, and kills them."""
    podman_binary()
    runtime = NodeRuntime(directory=tmp_path / "node", node_env={}, metadata_kwargs={"name": "n1", "zone": "z",
                          "project": "p"}, containers=NodeContainers(registries=(registry.host,)),
                          boot_command=["sh", "-c", f"podman pull -q {base_image_ref} && exec podman run --rm "
                                        f"--name held {base_image_ref} sleep 600"])
    runtime.boot()
    try:
        deadline = time.monotonic() + 120
        sleepers: list[int] = []
        while not sleepers and time.monotonic() < deadline and runtime.running():
            sleepers = [p for p in runtime._guest() if _cmdline(p).startswith(b"sleep\0")]
            time.sleep(0.2)
        assert sleepers, runtime.console_log.read_text()[-2000:]
        marked = guest_pids(runtime.boot_id)
        assert not set(sleepers) & set(marked)  # not found by the boot's environment alone
        runtime.proc.send_signal(signal.SIGKILL)  # the agent gone: only the power-off's search finds the container
        runtime.power_off(grace=0.5)
        assert not runtime._guest()
        deadline = time.monotonic() + 30  # killed: gone once their parent (init, after conmon's death) reaps them
        while any(map(_alive, sleepers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, sleepers))
    finally:
        runtime.crash()
        subprocess.run(["podman", "rm", "-f", "-t", "0", "held"], capture_output=True,
                       env={**os.environ, **NodeContainers().prepare(tmp_path / "node")})
        node_containers.forget(tmp_path / "node")


def test_a_boot_empties_its_run_though_a_late_podman_of_the_last_boot_still_writes_there(tmp_path, monkeypatch):
    """prepare() empties the node's /run as a reboot does, while a straggler of the last boot (conmon's cleanup after
    a `run --rm`, late under load) writes there for a moment; one that never stops is named."""
    import shutil

    node = tmp_path / "node"
    run = node_containers.run_dir(node)
    rmtree, writes = shutil.rmtree, iter([True])  # the straggler writes once, right after the first removal

    def removed_then_written(path, ignore_errors=False):
        rmtree(path, ignore_errors=ignore_errors)
        if next(writes, False):
            (run / "storage" / "overlay-layers").mkdir(parents=True)

    monkeypatch.setattr(node_containers.shutil, "rmtree", removed_then_written)
    try:
        NodeContainers().prepare(node)
        assert list(run.iterdir()) == []
        writes = iter(lambda: True, None)  # for ever
        with pytest.raises(RuntimeError, match="a sim node's /run, cannot be emptied: a process still writes there"):
            node_containers._emptied(run, wait_s=0.3)
    finally:
        monkeypatch.undo()
        node_containers.forget(node)
