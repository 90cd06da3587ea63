"""deploy/vm: the systemd unit that runs the node agent and the startup script that installs it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from respawn.agent.agent import FINAL_WRITE_GRACE_S
from respawn.contract import DEFAULT_NOTICE_BUDGET_SECONDS, EXIT_AGENT_DETACH, EXIT_CONFIG_ERROR
from sim.metadata import MetadataServer
from trainer_helpers import BUCKET, gcs, gcs_emulator  # noqa: F401

VM = Path(__file__).resolve().parent.parent / "deploy" / "vm"
UNIT = VM / "respawn-agent.service"
STARTUP = VM / "startup.sh"


def _unit_entries(text: str) -> dict[str, list[str]]:
    """{"Section.Key": [values]}; systemd allows repeated keys (Environment=)."""
    entries: dict[str, list[str]] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return entries


def test_unit_has_what_the_agent_relies_on():
    u = _unit_entries(UNIT.read_text())
    assert u["Service.ExecStart"] == ["/opt/respawn/venv/bin/python -m respawn.agent"]
    assert "RESPAWN_NODE_DIR=/var/lib/respawn" in u["Service.Environment"]
    # Only the agent gets SIGTERM; the trainer survives an agent restart and is adopted.
    assert u["Service.KillMode"] == ["process"] and u["Service.KillSignal"] == ["SIGTERM"]
    assert int(u["Service.TimeoutStopSec"][0]) > DEFAULT_NOTICE_BUDGET_SECONDS + FINAL_WRITE_GRACE_S
    assert u["Service.Restart"] == ["on-failure"]
    assert u["Service.RestartPreventExitStatus"] == [str(EXIT_CONFIG_ERROR)]
    assert EXIT_AGENT_DETACH != 0  # SIGHUP's exit must count as a failure so that systemd restarts the agent
    assert "network-online.target" in u["Unit.After"][0]
    assert u["Install.WantedBy"] == ["multi-user.target"]


def test_unit_passes_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart exists: point it at this interpreter, keep everything else as shipped.
    unit = tmp_path / "respawn-agent.service"
    unit.write_text(UNIT.read_text().replace("/opt/respawn/venv/bin/python", sys.executable))
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is needed for this test (apt-get install systemd)"
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [l for l in (r.stdout + r.stderr).splitlines() if "respawn-agent" in l]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr


def test_startup_script_is_valid_bash_and_embeds_the_unit_verbatim():
    subprocess.run(["bash", "-n", str(STARTUP)], check=True)
    embedded = re.search(r"<<'UNIT_FILE'\n(.*?)\nUNIT_FILE\n", STARTUP.read_text(), re.S).group(1)
    assert embedded + "\n" == UNIT.read_text()


def _run_startup(tmp_path, md_host: str, active: bool, **extra_env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = tmp_path / "systemctl.calls"
    fake = tmp_path / "systemctl"
    # Records its arguments; `is-active` answers as told.
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" = is-active ] && exit {0 if active else 3}\nexit 0\n')
    fake.chmod(0o755)
    env = dict(os.environ, GCE_METADATA_HOST=md_host, RESPAWN_ROOT=str(tmp_path / "opt"),
               SYSTEMD_UNIT_DIR=str(tmp_path / "units"), SYSTEMCTL=str(fake),
               PYTHON=getattr(sys, "_base_executable", sys.executable), **extra_env)
    r = subprocess.run(["bash", str(STARTUP)], env=env, capture_output=True, text=True, timeout=300)
    return r, calls.read_text().splitlines() if calls.exists() else []


def test_startup_script_installs_once_writes_the_unit_and_never_restarts_a_running_agent(tmp_path):
    # "pip" is a requirement every fresh venv already satisfies: the run is real but needs no package index.
    with MetadataServer(attributes={"respawn-install": "pip"}) as md:
        r, calls = _run_startup(tmp_path, md.host, active=False)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "installing pip" in r.stdout
        assert (tmp_path / "opt" / "venv" / "bin" / "python").exists()
        assert (tmp_path / "units" / "respawn-agent.service").read_text() == UNIT.read_text()
        assert [c for c in calls if not c.startswith("is-active")] == [
            "daemon-reload", "enable --now respawn-agent.service"]

        # Next boot (restart in place), agent already running: nothing reinstalled, no signal sent.
        r, calls = _run_startup(tmp_path, md.host, active=True)
        assert r.returncode == 0 and "already installed" in r.stdout, r.stdout + r.stderr
        assert calls[-2:] == ["daemon-reload", "enable --now respawn-agent.service"]
        assert not any("restart" in c or "kill" in c for c in calls)


def test_startup_script_upgrade_hands_over_with_sighup_not_sigterm(tmp_path):
    with MetadataServer(attributes={"respawn-install": "pip"}) as md:
        assert _run_startup(tmp_path, md.host, active=False)[0].returncode == 0
        md.set_attribute("respawn-install", "pip>=1")
        r, calls = _run_startup(tmp_path, md.host, active=True)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "kill --kill-who=main --signal=SIGHUP respawn-agent.service" in calls
        assert not any("restart" in c or "SIGTERM" in c for c in calls)


def test_startup_script_without_install_attribute_fails_with_a_clear_message(tmp_path):
    with MetadataServer() as md:
        env = dict(os.environ, GCE_METADATA_HOST=md.host, RESPAWN_ROOT=str(tmp_path / "opt"),
                   SYSTEMD_UNIT_DIR=str(tmp_path / "units"), SYSTEMCTL="false")
        r = subprocess.run(["bash", str(STARTUP)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "respawn-install is missing" in r.stdout


def _probe_wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel (package respawn_probe) that pip installs without any index."""
    import zipfile

    dist = "respawn_probe-1.0.dist-info"
    files = {
        "respawn_probe/__init__.py": "VERSION = '1.0'\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: respawn-probe\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{dist}/RECORD,,\n"
    wheel = directory / "respawn_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def test_startup_script_installs_a_release_wheel_from_a_private_bucket(tmp_path, gcs):
    # The deployed requirement is `NAME @ gs://BUCKET/...whl` (respawn.deployment.release_requirement): pip cannot
    # fetch gs://, so the script downloads it with the metadata server's token through the Storage JSON API.
    wheel = _probe_wheel(tmp_path)
    gcs.bucket(BUCKET).blob(f"respawn/releases/b1/{wheel.name}").upload_from_filename(str(wheel))
    requirement = f"respawn-probe @ gs://{BUCKET}/respawn/releases/b1/{wheel.name}"
    with MetadataServer(attributes={"respawn-install": requirement}) as md:
        r, calls = _run_startup(tmp_path, md.host, active=False,
                                RESPAWN_STORAGE_HOST=os.environ["STORAGE_EMULATOR_HOST"])
        token_requests = [p for p in md.requests if "service-accounts/default/token" in p]
    assert r.returncode == 0, r.stdout + r.stderr
    assert token_requests, "the wheel must be fetched with the VM's service-account token"
    venv_python = tmp_path / "opt" / "venv" / "bin" / "python"
    out = subprocess.run([str(venv_python), "-c", "import respawn_probe; print(respawn_probe.__file__)"],
                         capture_output=True, text=True, check=True).stdout
    assert str(tmp_path / "opt" / "venv") in out
    assert (tmp_path / "opt" / "installed").read_text() == requirement
    assert "enable --now respawn-agent.service" in calls


def test_startup_script_names_the_release_it_cannot_download(tmp_path, gcs):
    missing = f"gs://{BUCKET}/respawn/releases/gone/respawn-0.1.0-py3-none-any.whl"
    with MetadataServer(attributes={"respawn-install": f"respawn[agent,storage] @ {missing}"}) as md:
        r, calls = _run_startup(tmp_path, md.host, active=False,
                                RESPAWN_STORAGE_HOST=os.environ["STORAGE_EMULATOR_HOST"])
    assert r.returncode != 0
    assert f"could not download {missing}" in r.stdout + r.stderr
    assert "respawnCheckpoints" in r.stdout + r.stderr
    assert not (tmp_path / "opt" / "installed").exists()
    assert not any("enable" in c for c in calls)  # no agent is started without its install
