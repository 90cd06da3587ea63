"""deploy/vm and deploy/agent_zipapp.py: the agent zipapp, the systemd unit that runs it, the startup script that
fetches, checks and starts it on the node image's own python3 (bare 3.9 and 3.10 here), and a sim node booting
that script through sim/node_systemctl.py."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

import system_packages
from agent_fixtures import attributes, find_python, node_image_python, settings, wait_for
from deploy import agent_zipapp, layout
from respawn import deployment
from respawn.agent.agent import FINAL_WRITE_GRACE_S
from respawn.contract import (ATTR_AGENT, DEFAULT_NOTICE_BUDGET_SECONDS, EXIT_AGENT_DETACH, EXIT_CONFIG_ERROR,
                              split_artifact)
from respawn.app.workdir import pack
from sim import node_image, node_systemctl
from sim.metadata import MetadataServer
from sim.nodes import NodeRuntime
from sim_fixtures import sim_factory  # noqa: F401  (fixture)
from trainer_helpers import BUCKET, gcs, gcs_emulator  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
VM = REPO / "deploy" / "vm"
STARTUP = VM / "startup.sh"
UNIT = deployment.agent_unit(STARTUP.read_text())  # the unit's one definition, in the startup script
UNIT_NAME = "respawn-agent.service"


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


# ------------------------------------------------------------------------------------------------ the unit


def test_unit_has_what_the_agent_relies_on():
    u = _unit_entries(UNIT)
    # The image's own interpreter (a link the startup script makes) runs the verified zipapp.
    assert u["Service.ExecStart"] == ["/opt/respawn/python /opt/respawn/respawn-agent.pyz"]
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
    # verify checks that ExecStart's program exists: point it at this interpreter, keep everything else as shipped.
    unit = tmp_path / UNIT_NAME
    unit.write_text(UNIT.replace("/opt/respawn/python ", f"{sys.executable} "))
    system_packages.wait_installed()
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is needed for this test (apt-get install systemd)"
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [l for l in (r.stdout + r.stderr).splitlines() if "respawn-agent" in l]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr


def test_startup_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(STARTUP)], check=True)


# ------------------------------------------------------------------------------------------------ the zipapp


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory) -> Path:
    return agent_zipapp.build(tmp_path_factory.mktemp("zipapp"))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_zipapp_is_reproducible_and_holds_the_agent_and_nothing_else(tmp_path, zipapp, capsys):
    assert agent_zipapp.main(["--out", str(tmp_path)]) == 0
    again = tmp_path / zipapp.name
    assert capsys.readouterr().out.split() == [str(again), f"sha256={_sha256(again.read_bytes())}"]
    assert again.read_bytes() == zipapp.read_bytes(), "two builds of one checkout must have the same sha256"
    assert re.fullmatch(r"respawn-agent-\d+\.\d+\.\d+\.pyz", zipapp.name)

    sources = {f"respawn/{n}": REPO / "respawn" / n for n in ("__init__.py", "contract.py", "logs.py")}
    sources.update({f"respawn/agent/{p.name}": p for p in layout.package_dirs()["respawn.agent"].glob("*.py")})
    with zipfile.ZipFile(zipapp) as z:
        assert sorted(z.namelist()) == sorted([*sources, "__main__.py"])
        assert z.namelist() == sorted(z.namelist())
        for name, path in sources.items():
            assert z.read(name) == path.read_bytes(), name
        assert {i.date_time for i in z.infolist()} == {agent_zipapp.EPOCH}


@pytest.mark.parametrize("version", ["3.9", "3.10"])
def test_zipapp_runs_on_a_bare_node_python_with_the_standard_library_alone(tmp_path, zipapp, version):
    # -I -S: no site-packages, no PYTHONPATH, no cwd on sys.path; an import outside the standard library and the
    # archive would end in a traceback, not in the agent's own configuration error. The metadata server answers
    # 404 for the missing attributes, which the agent does not retry (an unreachable one is retried for 120 s).
    python = node_image_python(version)
    with MetadataServer() as md:  # a retried 404 would run into the 60 s timeout
        r = subprocess.run([python, "-I", "-S", str(zipapp)], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, env={"GCE_METADATA_HOST": md.host, "RESPAWN_NODE_DIR": str(tmp_path / "node"),
                                            "PATH": os.environ["PATH"]})
    assert r.returncode == EXIT_CONFIG_ERROR, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    last = json.loads(r.stdout.strip().splitlines()[-1])
    assert last["severity"] == "ERROR" and last["attribute"] == "respawn-job-id", last


# ----------------------------------------------------------------------------------------- the startup script


def _recording_python(tmp_path: Path, real: str) -> Path:
    """`python3` for the script: records each call's arguments, then runs the real interpreter."""
    wrapper = tmp_path / "bin" / "python3"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {tmp_path / "python.calls"}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def _run_startup(tmp_path: Path, md_host: str, active: bool, python: str,
                 **extra_env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = tmp_path / "systemctl.calls"
    fake = tmp_path / "systemctl"
    # Records its arguments; `is-active` answers as told.
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" = is-active ] && exit {0 if active else 3}\nexit 0\n')
    fake.chmod(0o755)
    calls.unlink(missing_ok=True)
    env = dict(os.environ, GCE_METADATA_HOST=md_host, RESPAWN_ROOT=str(tmp_path / "opt"),
               SYSTEMD_UNIT_DIR=str(tmp_path / "units"), SYSTEMCTL=str(fake), PYTHON=python, **extra_env)
    r = subprocess.run(["bash", str(STARTUP)], env=env, capture_output=True, text=True, timeout=120)
    return r, calls.read_text().splitlines() if calls.exists() else []


def _lines(r: subprocess.CompletedProcess) -> list[dict]:
    """Every line the script printed, each one JSON object with severity and message (or the test fails)."""
    out = []
    for line in (r.stdout + r.stderr).splitlines():
        entry = json.loads(line)
        assert {"severity", "message"} <= set(entry), line
        out.append(entry)
    return out


def _stage(r: subprocess.CompletedProcess, stage: str) -> dict:
    (entry,) = [e for e in _lines(r) if e.get("stage") == stage]
    assert isinstance(entry["seconds"], float) and entry["seconds"] >= 0, entry
    return entry


def _upload(gcs, path: Path, data: bytes) -> str:
    """The object's respawn-agent value, URI#sha256=HEX."""
    gcs.bucket(BUCKET).blob(path.as_posix()).upload_from_string(data)
    return f"gs://{BUCKET}/{path.as_posix()}#sha256={_sha256(data)}"


@pytest.mark.parametrize("version", ["3.9", "3.10"])
def test_startup_script_fetches_checks_and_reuses_the_zipapp_without_pip(tmp_path, gcs, zipapp, version):
    real = node_image_python(version)
    python = _recording_python(tmp_path, real)
    data = zipapp.read_bytes()
    value = _upload(gcs, Path("respawn/releases", f"b-{version}", zipapp.name), data)
    storage = os.environ["STORAGE_EMULATOR_HOST"]
    root = tmp_path / "opt"
    with MetadataServer(attributes={ATTR_AGENT: value}) as md:
        r, calls = _run_startup(tmp_path, md.host, active=False, python=str(python), RESPAWN_STORAGE_HOST=storage)
        assert r.returncode == 0, r.stdout + r.stderr
        assert any("service-accounts/default/token" in p for p in md.requests), \
            "a gs:// agent must be fetched with the VM's service-account token"
        assert _stage(r, "agent_fetch")["downloaded"] is True
        _stage(r, "total")
        # Nothing but the verified zipapp and the link to the image's interpreter: no venv, no pip.
        assert sorted(p.name for p in root.iterdir()) == ["python", "respawn-agent.pyz"]
        assert (root / "respawn-agent.pyz").read_bytes() == data
        assert os.readlink(root / "python") == real
        python_calls = (tmp_path / "python.calls").read_text()
        assert not re.search(r"\b(pip|ensurepip|venv|virtualenv)\b", python_calls), python_calls
        assert (tmp_path / "units" / UNIT_NAME).read_text() == UNIT
        assert [c for c in calls if not c.startswith("is-active")] == ["daemon-reload", f"enable --now {UNIT_NAME}"]

        # Next boot (restart in place), agent running: the object is gone, so any download would fail.
        uri, _ = split_artifact(value)
        gcs.bucket(BUCKET).blob(uri.split(f"gs://{BUCKET}/", 1)[1]).delete()
        r, calls = _run_startup(tmp_path, md.host, active=True, python=str(python), RESPAWN_STORAGE_HOST=storage)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _stage(r, "agent_fetch")["downloaded"] is False
    assert calls[-2:] == ["daemon-reload", f"enable --now {UNIT_NAME}"]
    assert not any("restart" in c or "kill" in c for c in calls)  # nothing changed: the running agent is left alone


def test_startup_script_upgrade_hands_over_with_sighup_not_sigterm(tmp_path, zipapp):
    # file:/// artifacts, as the local stand-ins use. The second release differs only in its zip comment.
    first = zipapp.read_bytes()
    second_path = tmp_path / "second.pyz"
    shutil.copy(zipapp, second_path)
    with zipfile.ZipFile(second_path, "a") as z:
        z.comment = b"the next release"
    second = second_path.read_bytes()
    python = node_image_python("3.9")
    with MetadataServer(attributes={ATTR_AGENT: f"file://{zipapp}#sha256={_sha256(first)}"}) as md:
        assert _run_startup(tmp_path, md.host, active=False, python=python)[0].returncode == 0
        md.set_attribute(ATTR_AGENT, f"file://{second_path}#sha256={_sha256(second)}")
        r, calls = _run_startup(tmp_path, md.host, active=True, python=python)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "opt" / "respawn-agent.pyz").read_bytes() == second
    assert f"kill --kill-who=main --signal=SIGHUP {UNIT_NAME}" in calls
    assert calls.index(f"kill --kill-who=main --signal=SIGHUP {UNIT_NAME}") < calls.index(f"enable --now {UNIT_NAME}")
    assert not any("restart" in c or "SIGTERM" in c for c in calls)


def test_startup_script_refuses_a_digest_mismatch_and_keeps_the_installed_agent(tmp_path, gcs, zipapp):
    value = _upload(gcs, Path("respawn/releases/tampered", zipapp.name), zipapp.read_bytes() + b"tampered")
    uri, got = split_artifact(value)
    promised = _sha256(zipapp.read_bytes())
    installed = tmp_path / "opt" / "respawn-agent.pyz"
    installed.parent.mkdir(parents=True)
    installed.write_bytes(b"the agent an earlier boot installed")
    with MetadataServer(attributes={ATTR_AGENT: f"{uri}#sha256={promised}"}) as md:
        r, calls = _run_startup(tmp_path, md.host, active=False, python=node_image_python("3.9"),
                                RESPAWN_STORAGE_HOST=os.environ["STORAGE_EMULATOR_HOST"])
    assert r.returncode == 1, r.stdout + r.stderr
    (error,) = [e for e in _lines(r) if e["severity"] == "ERROR"]
    assert uri in error["message"] and got in error["message"] and promised in error["message"], error
    assert (error["expected"], error["actual"]) == (promised, got)
    assert installed.read_bytes() == b"the agent an earlier boot installed"
    assert sorted(p.name for p in installed.parent.iterdir()) == ["respawn-agent.pyz"]  # no .part left behind
    assert not calls  # no agent is started without a verified one


def test_startup_script_without_the_agent_attribute_fails_with_a_clear_message(tmp_path):
    with MetadataServer() as md:
        r, calls = _run_startup(tmp_path, md.host, active=False, python=node_image_python("3.9"))
    assert r.returncode == 1
    (error,) = _lines(r)
    assert error["severity"] == "ERROR" and error["attribute"] == ATTR_AGENT
    assert "metadata attribute respawn-agent is missing" in error["message"] and "RESPAWN_AGENT" in error["message"]
    assert not calls and not (tmp_path / "opt").exists()


def test_startup_script_refuses_a_python_below_3_9(tmp_path):
    old = find_python("3.8")
    if old is None:
        pytest.fail("no working python3.8 on this machine: this test shows an image below the floor refused; "
                    "install it, e.g. `pyenv install 3.8`", pytrace=False)
    with MetadataServer(attributes={ATTR_AGENT: f"file:///nowhere.pyz#sha256={'0' * 64}"}) as md:
        r, calls = _run_startup(tmp_path, md.host, active=False, python=old)
        asked = list(md.requests)
    assert r.returncode == 1
    (error,) = _lines(r)
    assert "is Python 3.8; the agent needs 3.9 or newer" in error["message"] and error["python"] == old
    assert not asked and not calls and not (tmp_path / "opt").exists()


def test_startup_script_names_the_release_it_cannot_download(tmp_path, gcs):
    missing = f"gs://{BUCKET}/respawn/releases/gone/respawn-agent-0.1.0.pyz"
    with MetadataServer(attributes={ATTR_AGENT: f"{missing}#sha256={'a' * 64}"}) as md:
        r, calls = _run_startup(tmp_path, md.host, active=False, python=node_image_python("3.9"),
                                RESPAWN_STORAGE_HOST=os.environ["STORAGE_EMULATOR_HOST"])
    assert r.returncode == 1
    (error,) = [e for e in _lines(r) if e["severity"] == "ERROR"]
    assert f"could not download {missing}" in error["message"] and "respawnCheckpoints" in error["message"]
    assert not (tmp_path / "opt" / "respawn-agent.pyz").exists()
    assert not calls


def _cmdlines() -> dict[int, bytes]:
    """Every process's argv as /proc shows it to any local user."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                pass  # gone meanwhile
    return out


def test_startup_script_never_puts_the_token_on_a_command_line(tmp_path, zipapp):
    """The download's bearer token reaches curl through stdin, not argv: a storage stand-in holds its answer until it
    has read every process's /proc/PID/cmdline while curl waits on it."""
    data = zipapp.read_bytes()
    seen: dict[str, object] = {}

    class Storage(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            cmdlines = _cmdlines()
            seen["authorization"] = self.headers.get("Authorization")
            seen["curl"] = [pid for pid, argv in cmdlines.items()
                            if argv.startswith(b"curl\0") and self.path.encode() in argv]
            seen["token"] = [argv for argv in cmdlines.values() if b"sim-token" in argv]
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Storage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        value = f"gs://{BUCKET}/respawn/releases/argv/{zipapp.name}#sha256={_sha256(data)}"
        with MetadataServer(attributes={ATTR_AGENT: value}) as md:
            r, _ = _run_startup(tmp_path, md.host, active=False, python=node_image_python("3.9"),
                                RESPAWN_STORAGE_HOST=f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert seen["authorization"] == "Bearer sim-token"  # the token did reach the request
    assert seen["curl"], "the scan saw no curl process downloading the agent, so it could not have seen the token"
    assert seen["token"] == [], seen["token"]
    assert (tmp_path / "opt" / "respawn-agent.pyz").read_bytes() == data


# ---------------------------------------------------------------------------------- a sim node's systemctl


def _systemctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*node_systemctl.command().split(), *args], env=env, capture_output=True, text=True,
                          timeout=30)


def test_sim_systemctl_runs_the_units_execstart_in_place_and_answers_the_other_verbs(tmp_path):
    units, root, node_dir = tmp_path / "units", tmp_path / "opt", tmp_path / "node"
    units.mkdir()
    root.mkdir()
    service = root / "service"
    # Records what it was started with, then waits to be signalled.
    service.write_text('#!/bin/sh\necho "$RESPAWN_NODE_DIR $PROBE $(pwd) $*" > "$RESPAWN_NODE_DIR/seen"\n'
                       "exec sleep 60\n")
    service.chmod(0o755)
    (units / "probe.service").write_text(
        "[Service]\nEnvironment=RESPAWN_NODE_DIR=/var/lib/respawn\nEnvironment=\"PROBE=from-unit\"\n"
        "WorkingDirectory=/var/lib/respawn\nExecStart=/opt/respawn/service /opt/respawn/arg\n")
    env = dict(os.environ, SYSTEMD_UNIT_DIR=str(units), RESPAWN_ROOT=str(root), RESPAWN_NODE_DIR=str(node_dir))
    assert _systemctl(env, "daemon-reload").returncode == 0
    r = _systemctl(env, "is-active", "probe.service")
    assert (r.returncode, r.stdout.strip()) == (node_systemctl.INACTIVE, "inactive")

    # Started as under nohup, SIGHUP ignored: systemd gives a service default signals, and so must the stand-in.
    proc = subprocess.Popen([*node_systemctl.command().split(), "enable", "--now", "probe.service"], env=env,
                            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        wait_for(lambda: (node_dir / "seen").exists(), 30, "the unit's ExecStart to run")
        # The caller's RESPAWN_NODE_DIR wins over the unit's, the unit adds the rest; /opt/respawn and
        # /var/lib/respawn are mapped.
        assert (node_dir / "seen").read_text().split() == [str(node_dir), "from-unit", str(node_dir), str(root / "arg")]
        assert _systemctl(env, "is-active", "--quiet", "probe.service").returncode == 0
        assert proc.poll() is None
        again = _systemctl(env, "enable", "--now", "probe.service")  # already active: nothing started
        assert again.returncode == 0 and "starting" not in again.stderr
        assert _systemctl(env, "kill", "--kill-who=main", "--signal=SIGHUP", "probe.service").returncode == 0
        assert proc.wait(10) == -1  # -SIGHUP: the process the stand-in became got it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert _systemctl(env, "is-active", "--quiet", "probe.service").returncode == node_systemctl.INACTIVE
    r = _systemctl(env, "kill", "--signal=SIGHUP", "probe.service")
    assert r.returncode == 1 and "not active" in json.loads(r.stderr)["message"]
    r = _systemctl(env, "restart", "probe.service")
    assert r.returncode == 1 and "not supported" in json.loads(r.stderr)["message"]


@pytest.mark.parametrize("version", ["3.9", "3.10"])
def test_a_sim_node_boots_the_startup_script_and_trains_the_example_workdir(tmp_path, gcs, zipapp, nodes_db,
                                                                            project, version):
    # The whole boot with a bare 3.9 or 3.10 as the image's python3 (sim/node_image.py, as the demo's nodes): the
    # startup script fetches the zipapp from the GCS emulator, the systemctl stand-in becomes the agent on that
    # python, the agent fetches examples/workdir, runs its setup command and its train.py on the interpreter the
    # settings name (one with torch and the library), heartbeats to the Firestore emulator, and the sim's power-off
    # SIGTERM reaches it as a notice: the example trainer's emergency checkpoint.
    python = node_image_python(version)
    packed = pack(REPO / "examples" / "workdir")
    workdir = _upload(gcs, Path("respawn/workdirs", packed.object_name), packed.data).split("#")[0]
    s = settings(["python", "train.py", "--steps", "100000", "--step-seconds", "0.02", "--log-every", "10"],
                 f"file://{tmp_path}/store", workdir=workdir, interpreter=sys.executable,
                 setup=[["python", "prepare.py", "--framework", "torch"]])
    attrs = attributes("simboot", 1, project, s)
    attrs[ATTR_AGENT] = _upload(gcs, Path("respawn/releases/simboot", zipapp.name), zipapp.read_bytes())
    storage = node_image.Storage(os.environ["STORAGE_EMULATOR_HOST"], BUCKET)
    boot_command, node_env = node_image.boot(python, storage)
    node = NodeRuntime(directory=tmp_path / "simboot-1", boot_command=boot_command, node_env=node_env,
                       metadata_kwargs={"name": "simboot-1", "project": project, "attributes": attrs})
    heartbeat = nodes_db.document("nodes/simboot-1")
    try:
        node.boot()
        wait_for(lambda: ((heartbeat.get().to_dict() or {}).get("step") or 0) > 0, 120,
                 f"the agent's training heartbeat; console: {node.console_log}")
        assert node.power_off(grace=30), node.console_log.read_text()[-3000:]
    finally:
        node.crash()
    hb = heartbeat.get().to_dict()
    assert hb["state"] == "exited" and hb["notice"] == "sigterm" and hb["exit_code"] == 75, hb
    assert hb["committed_step"] == hb["step"] > 0, hb  # the emergency checkpoint of the step it stopped at
    console = [json.loads(line) for line in node.console_log.read_text().splitlines() if line.startswith("{")]
    fetched = [e for e in console if e.get("stage") == "agent_fetch"]
    assert fetched and fetched[0]["downloaded"] is True
    [started] = [e for e in console if e["message"].startswith("respawn startup: agent interpreter:")]
    assert f"(Python {version})" in started["message"]
    assert any(e["message"] == f"sim systemctl: starting {UNIT_NAME}" for e in console)
    [setup] = [e for e in console if e.get("stage") == "setup_command"]
    assert setup["argv"][0] == sys.executable and setup["exit_code"] == 0


def test_every_worker_of_a_sim_tpu_slice_boots_the_startup_script_and_takes_the_preemption(
        tmp_path, gcs, zipapp, nodes_db, project, sim_factory):
    # A v4-16 slice (2 worker VMs) created through the real TPU client: each worker runs the real startup script on
    # a bare 3.10 (the TPU runtimes' python3), its own agent reads its worker attributes and beats to its own
    # document; the slice's preemption reaches both agents, and both trainers save and stop.
    from google.cloud import tpu_v2

    from agent_fixtures import TINY_TRAINER
    from sim_fixtures import tpu_client

    trainer = tmp_path / "tiny_trainer.py"
    trainer.write_text(TINY_TRAINER)
    s = settings([sys.executable, str(trainer)], f"file://{tmp_path}/store")
    attrs = attributes("tslice", 1, project, s)
    attrs[ATTR_AGENT] = _upload(gcs, Path("respawn/releases/tslice", zipapp.name), zipapp.read_bytes())
    storage = node_image.Storage(os.environ["STORAGE_EMULATOR_HOST"], BUCKET)
    boot_command, node_env = node_image.boot(node_image_python("3.10"), storage)
    sim = sim_factory(boot_command=boot_command, node_env=node_env, notice_seconds=20)
    client = tpu_client(sim.endpoint)
    zone = "us-central2-b"
    client.create_node(parent=f"projects/{project}/locations/{zone}", node_id="tslice-1", node=tpu_v2.Node(
        accelerator_type="v4-16", runtime_version="tpu-ubuntu2204-base", metadata=attrs,
        scheduling_config=tpu_v2.SchedulingConfig(spot=True))).result(timeout=30)
    docs = [nodes_db.document("nodes/tslice-1"), nodes_db.document("nodes/tslice-1-w1")]
    for w, doc in enumerate(docs):
        wait_for(lambda: ((doc.get().to_dict() or {}).get("step") or 0) > 0, 120,
                 f"worker {w}'s training heartbeat; console: {sim.node_dir(zone, 'tslice-1', w)}.console.log")
    sim.preempt(zone, "tslice-1")
    sim.wait_for(lambda: sim.status_of(zone, "tslice-1") == "PREEMPTED", timeout=60, what="the slice PREEMPTED")
    for w, doc in enumerate(docs):
        hb = doc.get().to_dict()
        assert hb["worker"] == w and hb["state"] == "exited" and hb["exit_code"] == 75, hb
        assert hb["notice"] in ("preempted", "sigterm") and hb["committed_step"] == hb["step"] > 0, hb
