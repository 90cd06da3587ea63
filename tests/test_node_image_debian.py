"""A node whose image is a real Debian 11 root filesystem (tests/node_image_fixtures.py: debootstrap bullseye,
cached, booted as an overlay under chroot): the real deploy/vm/startup.sh runs there with the image's own tools
and python3 (3.9.2) against the sim's metadata server and the storage emulator, the agent it installs prepares
the node life (workdir from Cloud Storage, a setup command) and heartbeats to the Firestore emulator, and the
sim's power-off SIGTERM ends it with the final `exited` heartbeat; a restart in place reuses the installed agent.
And the same image without curl, which a minimal Debian lacks: the script names it instead of blaming the
network."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agent_fixtures import TINY_TRAINER, attributes, settings, wait_for
from deploy import agent_zipapp
from node_image_fixtures import BUILD_TIMEOUT_S, booted_image, bullseye_image  # noqa: F401  (fixture)
from respawn.contract import ATTR_AGENT
from respawn.app.workdir import pack, workdir_uri
from sim import node_systemctl
from sim.nodes import NodeRuntime
from test_agent_deploy import STARTUP, UNIT, UNIT_NAME, _upload
from trainer_helpers import BUCKET, gcs, gcs_emulator  # noqa: F401  (fixtures)

# Inside the image: where the boot puts the startup script and the systemctl stand-in (a copy of
# sim/node_systemctl.py run by the image's python3: there is no systemd under chroot).
GUEST_STARTUP = "/root/startup.sh"
GUEST_SYSTEMCTL = "/usr/local/lib/respawn-sim/node_systemctl.py"
GUEST_BOOT = "/usr/local/sbin/respawn-sim-boot"
# The node's boot as init starts the startup script: nothing of this machine's environment, systemd's PATH; the sim
# passes in only what a VM has by other means (the metadata server's and Google APIs' addresses, the boot id).
BOOT = f"""#!/bin/sh
exec /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
  RESPAWN_BOOT_ID="$RESPAWN_BOOT_ID" GCE_METADATA_HOST="$GCE_METADATA_HOST" \\
  RESPAWN_STORAGE_HOST="$RESPAWN_STORAGE_HOST" FIRESTORE_EMULATOR_HOST="$FIRESTORE_EMULATOR_HOST" \\
  SYSTEMCTL="/usr/bin/python3 {GUEST_SYSTEMCTL}" \\
  /bin/bash {GUEST_STARTUP}
"""

# The user's code: setup writes what it saw, the trainer refuses to start without it.
PREPARE = """import os, sys
with open("prepared.txt", "w") as f:
    f.write("%s %d.%d %s\\n" % (os.getcwd(), sys.version_info[0], sys.version_info[1], sys.executable))
"""
TRAIN = 'import sys\nprint("trainer on Python", sys.version.split()[0], "after setup:", ' \
        'open("prepared.txt").read().strip(), flush=True)\n' + TINY_TRAINER


def _install(root: Path, guest_path: str, text: str, mode: int) -> None:
    path = root / guest_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


@pytest.mark.timeout(BUILD_TIMEOUT_S + 300)  # the first run builds the image (a few minutes)
def test_a_debian_11_node_image_boots_the_startup_script_and_its_agent_trains(
        tmp_path, bullseye_image, gcs, nodes_db, project):  # noqa: F811
    code = tmp_path / "code"
    code.mkdir()
    (code / "prepare.py").write_text(PREPARE)
    (code / "train.py").write_text(TRAIN)
    packed = pack(code)
    wd_uri = workdir_uri(f"gs://{BUCKET}/checkpoints/deb11", packed.sha256)
    gcs.bucket(BUCKET).blob(wd_uri.split(f"gs://{BUCKET}/", 1)[1]).upload_from_string(packed.data)
    zipapp = agent_zipapp.build(tmp_path / "zipapp")

    s = settings(["python3", "train.py", "--step-seconds", "0.05"], "file:///var/lib/respawn-checkpoints/deb11",
                 workdir=wd_uri, setup=[["python3", "prepare.py"]])
    attrs = attributes("deb11", 1, project, s)
    attrs[ATTR_AGENT] = _upload(gcs, Path("respawn/releases/deb11", zipapp.name), zipapp.read_bytes())
    heartbeat = nodes_db.document("nodes/deb11-1")

    with booted_image(bullseye_image, tmp_path / "image") as root:
        _install(root, GUEST_STARTUP, STARTUP.read_text(), 0o755)
        _install(root, GUEST_SYSTEMCTL, Path(node_systemctl.__file__).read_text(), 0o644)
        _install(root, GUEST_BOOT, BOOT, 0o755)
        node = NodeRuntime(
            directory=tmp_path / "deb11-1", boot_command=["chroot", str(root), GUEST_BOOT],
            node_env={"RESPAWN_STORAGE_HOST": os.environ["STORAGE_EMULATOR_HOST"]},
            metadata_kwargs={"name": "deb11-1", "project": project, "attributes": attrs})
        try:
            node.boot()
            wait_for(lambda: ((hb := heartbeat.get().to_dict() or {}).get("state") == "training"
                              and (hb.get("step") or 0) > 0), 90,
                     f"the agent's training heartbeat; console: {node.console_log}")
            workdir = root / "var/lib/respawn/workdirs" / f"sha256-{packed.sha256}"
            trainer_log = (root / "var/lib/respawn/trainer.log").read_text()
            prepared = (workdir / "prepared.txt").read_text().split()
            opt = sorted(p.name for p in (root / "opt/respawn").iterdir())
            python_link = os.readlink(root / "opt/respawn/python")
            unit = (root / "etc/systemd/system" / UNIT_NAME).read_text()
            assert node.power_off(grace=30), node.console_log.read_text()[-3000:]
            assert heartbeat.get().to_dict()["state"] == "exited"
            # A restart in place (same disk): the installed agent is reused, the node trains again.
            node.boot()
            wait_for(lambda: ((hb := heartbeat.get().to_dict() or {}).get("state") == "training"
                              and (hb.get("step") or 0) > 0), 90,
                     f"the training heartbeat after the restart in place; console: {node.console_log}")
            assert node.power_off(grace=30), node.console_log.read_text()[-3000:]
        finally:
            node.crash()
        console_text = node.console_log.read_text()

    # The power-off SIGTERM reached the agent as a notice, the trainer checkpointed, the last heartbeat says so.
    hb = heartbeat.get().to_dict()
    assert hb["state"] == "exited" and hb["notice"] == "sigterm", hb
    console = [json.loads(line) for line in console_text.splitlines() if line.startswith("{")]
    # The startup script ran on the image's python3 3.9, fetched the zipapp with the metadata token, wrote the unit.
    interp = [e for e in console if e["message"].startswith("respawn startup: agent interpreter")]
    assert [(e["version"], e["python"]) for e in interp] == [("3.9", "/usr/bin/python3")] * 2, interp
    assert python_link == "/usr/bin/python3" and opt == ["python", "respawn-agent.pyz"]
    fetched = [e for e in console if e.get("stage") == "agent_fetch"]
    assert [e["downloaded"] for e in fetched] == [True, False], console_text[-3000:]
    assert unit == UNIT
    started = [e for e in console if e["message"] == "node agent starting"]
    assert len(started) == 2 and all(e["python"].startswith("3.9.") for e in started), started
    # Setup ran in the unpacked workdir on the image's python3 before the trainer, which read what it wrote.
    assert prepared == [f"/var/lib/respawn/workdirs/sha256-{packed.sha256}", "3.9", "/usr/bin/python3"], prepared
    assert f"after setup: {' '.join(prepared)}" in trainer_log, trainer_log[-2000:]
    assert "trainer on Python 3.9." in trainer_log


def test_a_debian_11_image_without_curl_is_told_so_not_sent_to_check_the_network(tmp_path, bullseye_image):  # noqa: F811
    with booted_image(bullseye_image, tmp_path / "image") as root:
        (root / "usr/bin/curl").unlink()  # as in a debootstrap minbase image
        _install(root, GUEST_STARTUP, STARTUP.read_text(), 0o755)
        r = subprocess.run(["chroot", str(root), "/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                            "GCE_METADATA_HOST=127.0.0.1:9", "/bin/bash", GUEST_STARTUP],
                           capture_output=True, text=True, timeout=60)
        installed = (root / "opt/respawn").exists()
    assert r.returncode == 1, r.stdout + r.stderr
    (error,) = [json.loads(line) for line in (r.stdout + r.stderr).splitlines()]
    assert error["severity"] == "ERROR" and error["missing"] == "curl", error
    assert "the node image lacks curl" in error["message"] and "network" not in error["message"], error
    assert not installed
