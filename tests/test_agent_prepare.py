"""The node's preparation before the first trainer start (node_agent/prepare.py, workdir.py, storage.py): the user's
code fetched from Cloud Storage (gcp-storage-emulator) and unpacked safely, the library installed into the chosen
interpreter, setup run in the workdir; and a failing setup reported by a real agent process as `setup-failed` in
the Firestore emulator. Archives are built here with tarfile, as respawn.app.workdir packs them."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from agent_fixtures import agent_env, attributes, find_python, node_image_python, settings, wait_for  # noqa: F401
from respawn.agent.metadata import MetadataClient
from respawn.agent.prepare import PrepareFailed, Preparer, storage_requirements
from respawn.agent.storage import Fetcher, http_failure
from respawn.agent.workdir import WorkdirError, ensure_workdir
from respawn.contract import NodeSettings
from respawn.schema import Heartbeat
from sim.metadata import MetadataServer
from trainer_helpers import BUCKET, gcs, gcs_emulator  # noqa: F401  (fixtures)

INTERPRETER_MESSAGE = ("is Python 3.9; Respawn's checkpoint library needs ≥ 3.10 — set trainer.interpreter, "
                       "e.g. /opt/conda/bin/python")


# ---- archives ------------------------------------------------------------------------------------------------

def tar_bytes(members: list[tuple]) -> bytes:
    """A gzip'd tar of (name, kind, payload): kind "file" (payload bytes), "exe", "dir", "symlink" (payload the
    target), "hardlink", "chr" (a device)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            data = None
            if kind in ("file", "exe"):
                data = payload
                info.size, info.mode = len(data), 0o755 if kind == "exe" else 0o644
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, payload
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, payload
            elif kind == "chr":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def archive(directory: Path, members: list[tuple], *, name_digest: str | None = None) -> tuple[str, str]:
    """(file:/// URI, digest) of a content-addressed archive in `directory` (named by `name_digest` if given)."""
    data = tar_bytes(members)
    digest = hashlib.sha256(data).hexdigest()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"sha256-{name_digest or digest}.tar.gz"
    path.write_bytes(data)
    return f"file://{path}", digest


GOOD = [("./", "dir", None), ("train.py", "file", b"print('hi')\n"), ("bin/run.sh", "exe", b"#!/bin/sh\necho run\n"),
        ("conf", "dir", None), ("conf/a.yaml", "file", b"a: 1\n"), ("latest.yaml", "symlink", "conf/a.yaml")]


def no_metadata() -> MetadataClient:
    return MetadataClient("127.0.0.1:9")  # file:/// needs no token; nothing listens there


def prep_settings(**extra) -> NodeSettings:
    return NodeSettings(command=("python", "train.py"), checkpoint_uri="file:///tmp/unused", **extra)


# ---- the workdir -----------------------------------------------------------------------------------------------

def test_a_good_archive_unpacks_with_modes_and_relative_symlinks(tmp_path):
    uri, digest = archive(tmp_path / "store", GOOD)
    path, fresh = ensure_workdir(uri, str(tmp_path / "node"), Fetcher(no_metadata()))
    wd = Path(path)
    assert fresh and wd == tmp_path / "node" / "workdirs" / f"sha256-{digest}"
    assert (wd / "train.py").read_text() == "print('hi')\n"
    assert os.stat(wd / "bin/run.sh").st_mode & 0o777 == 0o755 and os.stat(wd / "train.py").st_mode & 0o777 == 0o644
    assert os.readlink(wd / "latest.yaml") == "conf/a.yaml" and (wd / "latest.yaml").read_text() == "a: 1\n"
    assert sorted(os.listdir(tmp_path / "node" / "workdirs")) == [f"sha256-{digest}"]  # no temporary left


@pytest.mark.parametrize("members, words", [
    ([("../x", "file", b"x")], "'../x' climbs out of the workdir"),
    ([("a/../../x", "file", b"x")], "climbs out of the workdir"),
    ([("/tmp/abs-x", "file", b"x")], "'/tmp/abs-x' has an absolute name"),
    ([("link", "symlink", "../../outside")], "'link' is a symlink to '../../outside', which points outside"),
    ([("link", "symlink", "/etc/passwd")], "only relative symlinks"),
    # Each link lexically inside, together outside: here -> ".", up -> "here/.." (the workdir's parent).
    ([("here", "symlink", "."), ("up", "symlink", "here/..")], "'up' is a symlink to 'here/..', which points outside"),
    ([("d", "symlink", "sub"), ("sub", "dir", None), ("d/x", "file", b"x")], "'d/x' lies below the symlink 'd'"),
    ([("null", "chr", None)], "'null' is a device file"),
    ([("f", "file", b"x"), ("g", "hardlink", "f")], "'g' is a hard link"),
    ([("f", "file", b"x"), ("f", "file", b"y")], "'f' appears twice"),
])
def test_unpack_refuses_members_outside_the_tree(tmp_path, members, words):
    uri, _ = archive(tmp_path / "store", [("ok.py", "file", b"pass\n"), *members])
    node = tmp_path / "deep" / "node"
    with pytest.raises(WorkdirError) as err:
        ensure_workdir(uri, str(node), Fetcher(no_metadata()))
    message = str(err.value)
    assert words in message and uri in message and "re-register the job with --workdir" in message, message
    assert os.listdir(node / "workdirs") == []  # nothing unpacked, no temporary left
    assert not (tmp_path / "x").exists() and not (tmp_path / "deep" / "x").exists()


def test_digest_mismatch_names_the_archive_and_both_digests(tmp_path):
    promised = "0" * 64
    uri, actual = archive(tmp_path / "store", GOOD, name_digest=promised)
    with pytest.raises(WorkdirError) as err:
        ensure_workdir(uri, str(tmp_path / "node"), Fetcher(no_metadata()))
    message = str(err.value)
    assert uri in message and f"expected sha256 {promised}" in message and f"got {actual}" in message, message
    assert "re-register the job with --workdir" in message


def test_a_corrupt_archive_is_named(tmp_path):
    data = b"this is not a tar.gz"
    path = tmp_path / f"sha256-{hashlib.sha256(data).hexdigest()}.tar.gz"
    path.write_bytes(data)
    with pytest.raises(WorkdirError, match=r"corrupt workdir archive file://.*re-register the job with --workdir"):
        ensure_workdir(f"file://{path}", str(tmp_path / "node"), Fetcher(no_metadata()))


def test_workdir_from_cloud_storage_is_reused_on_this_disk_without_downloading(tmp_path, gcs, gcs_emulator):
    data = tar_bytes(GOOD)
    digest = hashlib.sha256(data).hexdigest()
    name = f"workdirs/team a/sha256-{digest}.tar.gz"  # a space: the object name is URL-encoded
    blob = gcs.bucket(BUCKET).blob(name)
    blob.upload_from_string(data)
    uri = f"gs://{BUCKET}/{name}"
    with MetadataServer() as md:  # the node's service-account token
        fetcher = Fetcher(MetadataClient(md.host), environ={"STORAGE_EMULATOR_HOST": gcs_emulator})
        path, fresh = ensure_workdir(uri, str(tmp_path / "node"), fetcher)
        assert fresh and (Path(path) / "conf/a.yaml").read_text() == "a: 1\n"
        assert "/computeMetadata/v1/instance/service-accounts/default/token" in md.requests
        blob.delete()
        again, fresh = ensure_workdir(uri, str(tmp_path / "node"), fetcher)  # restart in place: same disk
        assert again == path and not fresh
        with pytest.raises(WorkdirError) as err:  # another node's disk: it must download, and cannot
            ensure_workdir(uri, str(tmp_path / "other"), fetcher)
    message = str(err.value)
    assert uri in message and "HTTP 404" in message and "re-register the job with --workdir" in message, message


def test_forbidden_download_names_the_account_and_the_permission():
    err = http_failure("gs://team-code/wd/sha256-ab.tar.gz", 403, "caller does not have storage.objects.get access",
                       missing_hint="-", account="node@p.iam.gserviceaccount.com")
    message = str(err)
    assert "node@p.iam.gserviceaccount.com" in message and "storage.objects.get on gs://team-code" in message
    assert "--member=serviceAccount:node@p.iam.gserviceaccount.com" in message and err.status == 403


# ---- setup ---------------------------------------------------------------------------------------------------

@pytest.fixture
def interpreter_dir(tmp_path) -> Path:
    """A directory standing in for /opt/conda/bin: python3 (this interpreter) and a tool found on PATH only."""
    bin_dir = tmp_path / "conda" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").symlink_to(sys.executable)
    tool = bin_dir / "conda-tool"
    tool.write_text("#!/bin/sh\necho tool from $(dirname $0)\n")
    tool.chmod(0o755)
    return bin_dir


def _setup_output(capsys) -> list[str]:
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    return [e["line"] for e in out if e["message"] == "setup output"]


def _preparer(tmp_path, s: NodeSettings, **kw) -> Preparer:
    env = dict(os.environ, PATH="/usr/bin:/bin")
    return Preparer(s, str(tmp_path / "node"), env, fetcher=Fetcher(no_metadata()), **kw)


def test_setup_runs_in_the_workdir_with_the_interpreter_first_on_path(tmp_path, interpreter_dir, capsys):
    uri, _ = archive(tmp_path / "store", GOOD)
    show = "import os, sys; print('exe', sys.executable); print('cwd', os.getcwd()); print('path0', os.environ['PATH'].split(os.pathsep)[0])"
    s = prep_settings(workdir=uri, interpreter=str(interpreter_dir / "python3"),
                      setup=[["python", "-c", show], ["conda-tool"]])
    prep = _preparer(tmp_path, s)
    prep.fetch_workdir()
    prep.find_interpreter()
    assert prep.run_setup() is True
    lines = _setup_output(capsys)
    assert f"exe {interpreter_dir / 'python3'}" in lines
    assert f"cwd {prep.workdir}" in lines and f"path0 {interpreter_dir}" in lines
    assert f"tool from {interpreter_dir}" in lines
    # The trainer: the same interpreter for a leading python, started in the workdir.
    assert prep.argv(["python3", "train.py"]) == [str(interpreter_dir / "python3"), "train.py"]
    assert prep.argv(["bash", "run.sh"]) == ["bash", "run.sh"] and prep.cwd == prep.workdir


def test_a_failing_setup_command_names_itself_with_exit_code_and_output_tail(tmp_path, interpreter_dir):
    fail = "import sys; [print('line', i) for i in range(80)]; print('ERROR: no matching distribution'); sys.exit(4)"
    s = prep_settings(interpreter=str(interpreter_dir / "python3"), setup=[["python", "-c", "pass"], ["python", "-c", fail]])
    prep = _preparer(tmp_path, s)
    prep.find_interpreter()
    with pytest.raises(PrepareFailed) as err:
        prep.run_setup()
    f = err.value
    assert f.command == [str(interpreter_dir / "python3"), "-c", fail] and f.exit_code == 4
    assert f.output_tail.endswith("ERROR: no matching distribution") and "line 79" in f.output_tail
    assert "line 10\n" not in f.output_tail  # a tail: the last 50 lines
    assert not (tmp_path / "node" / "setup.done.json").exists()

    missing = _preparer(tmp_path, prep_settings(setup=[["no-such-tool", "--x"]]))
    missing.find_interpreter()
    with pytest.raises(PrepareFailed) as err:
        missing.run_setup()
    assert err.value.exit_code == 127 and "no-such-tool: command not found" in err.value.output_tail


def test_a_setup_command_that_hangs_is_stopped_at_its_timeout_with_its_children(tmp_path, interpreter_dir):
    # A hung `pip install` must not hold the node forever: the command and what it started are stopped.
    hang = ("import subprocess, sys, time; print('resolving', flush=True); "
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('child', child.pid, flush=True); time.sleep(60)")
    s = prep_settings(interpreter=str(interpreter_dir / "python3"), setup=[["python", "-c", hang]],
                      setup_timeout_seconds=1.5)
    prep = _preparer(tmp_path, s)
    prep.find_interpreter()
    with pytest.raises(PrepareFailed) as err:
        prep.run_setup()
    f = err.value
    assert f.exit_code == 124 and "did not finish within 1.5 s (trainer.setup_timeout_seconds)" in str(f)
    assert "resolving" in f.output_tail and f.output_tail.endswith("trainer.setup_timeout_seconds)")
    child = int(next(line.split()[1] for line in f.output_tail.splitlines() if line.startswith("child ")))

    def gone() -> bool:
        try:
            with open(f"/proc/{child}/status") as status:
                return "zombie" in status.read().lower()
        except FileNotFoundError:
            return True
    wait_for(gone, 10, f"the setup command's child {child} to be stopped too")


def test_setup_is_skipped_on_a_restart_in_place_and_rerun_when_its_inputs_change(tmp_path, interpreter_dir):
    uri, _ = archive(tmp_path / "store", GOOD)
    count = ["python", "-c", "open('runs', 'a').write('x')"]
    s = prep_settings(workdir=uri, interpreter=str(interpreter_dir / "python3"), setup=[count])

    def life(settings_: NodeSettings) -> tuple[bool, Preparer]:
        prep = _preparer(tmp_path, settings_)
        prep.fetch_workdir()
        prep.find_interpreter()
        return prep.run_setup(), prep

    ran, prep = life(s)
    runs = Path(prep.workdir) / "runs"
    assert ran and runs.read_text() == "x"
    assert life(s)[0] is False and runs.read_text() == "x"  # restart in place, same inputs: skipped
    changed = prep_settings(workdir=uri, interpreter=str(interpreter_dir / "python3"), setup=[count, ["true"]])
    assert life(changed)[0] is True and runs.read_text() == "xx"
    assert life(changed)[0] is False and runs.read_text() == "xx"


# ---- the library ---------------------------------------------------------------------------------------------

def probe_wheel(directory: Path, requires: list[str]) -> Path:
    """A tiny wheel, respawn_probe: one module, and `requires` as Requires-Dist lines."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "respawn_probe-0.1.0-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: respawn-probe\nVersion: 0.1.0\nProvides-Extra: storage\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = {"respawn_probe.py": "VALUE = 42\n", "respawn_probe-0.1.0.dist-info/METADATA": meta,
             "respawn_probe-0.1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + "respawn_probe-0.1.0.dist-info/RECORD,,\n"
    files["respawn_probe-0.1.0.dist-info/RECORD"] = record
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def _library(wheel: Path) -> tuple[str, str]:
    return f"file://{wheel}", hashlib.sha256(wheel.read_bytes()).hexdigest()


def test_storage_extra_requirements_are_read_from_the_wheel(tmp_path):
    wheel = probe_wheel(tmp_path, ['numpy>=1.26; extra == "storage"', "pydantic<3,>=2.6", "torch>=2.3; extra == 'torch'",
                                   'google-cloud-storage>=2.14; python_version >= "3.10" and extra == "storage"'])
    assert storage_requirements(str(wheel)) == [
        "numpy>=1.26", 'google-cloud-storage>=2.14; python_version >= "3.10"']


def test_a_python_3_9_interpreter_is_refused_for_the_library(tmp_path):
    wheel = probe_wheel(tmp_path / "dist", [])
    prep = _preparer(tmp_path, prep_settings(interpreter=node_image_python("3.9")), library=_library(wheel))
    prep.find_interpreter()
    with pytest.raises(PrepareFailed) as err:
        prep.install_library()
    assert f"interpreter {prep.python} {INTERPRETER_MESSAGE}" == str(err.value)
    assert err.value.command[:2] == ["respawn-agent", "install-library"] and err.value.output_tail == str(err.value)


def test_library_is_installed_once_into_the_interpreters_environment(tmp_path, capsys):
    base = find_python("3.10")
    if base is None:
        node_image_python("3.10")  # fails the run with how to get it
    venv = tmp_path / "env"
    # Like a conda or image environment: pip and what the storage extra asks for are already there.
    subprocess.run([base, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True, timeout=120)
    wheel = probe_wheel(tmp_path / "dist", ['pip; python_version >= "3" and extra == "storage"', "not-on-pypi-x>=9"])
    s = prep_settings(interpreter=str(venv / "bin" / "python"))

    prep = _preparer(tmp_path, s, library=_library(wheel))
    prep.find_interpreter()
    assert prep.install_library() == _library(wheel)[1]
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import respawn_probe; print(respawn_probe.__file__)"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(str(venv)), out.stderr
    installed = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    stage = [e for e in installed if e["message"] == "prepare stage" and e["stage"] == "library_install"][-1]
    assert stage["requirements"] == ['pip; python_version >= "3"']
    assert any("already satisfied" in e.get("line", "") for e in installed)  # pip fetched nothing

    again = _preparer(tmp_path, s, library=_library(wheel))  # restart in place
    again.find_interpreter()
    again.install_library()
    skipped = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert any(e.get("stage") == "library_install" and e.get("skipped") for e in skipped)
    assert not any(e["message"] == "library install output" for e in skipped)


# ---- a failed setup as the controller sees it ----------------------------------------------------------------

def test_failing_setup_is_reported_as_setup_failed_and_the_trainer_never_starts(agent_env):
    fail = "print('Collecting torch==9.9'); import sys; sys.exit(4)"
    s = settings([sys.executable, str(agent_env.tiny_trainer)], f"file://{agent_env.tmp}/store",
                 setup=[["python", "-c", fail]], interpreter=sys.executable)
    md = agent_env.metadata("setupfail-1", attributes("setupfail", 1, agent_env.project, s))
    node_dir = agent_env.tmp / "setupfail-1"
    first = agent_env.agent(md, node_dir)
    hb = wait_for(lambda: (h := agent_env.heartbeat("setupfail-1")) and h["state"] == "setup-failed" and h, 60,
                  "the setup-failed heartbeat")
    assert hb["failed_command"] == [sys.executable, "-c", fail] and hb["exit_code"] == 4
    assert "Collecting torch==9.9" in hb["output_tail"] and hb["notice"] is None
    Heartbeat.model_validate(hb)  # as the control plane reads it
    wait_for(lambda: first.has("setup-failed heartbeat written"), 30, "the agent's own report")
    assert first.proc.poll() is None  # it stays up, heartbeating setup-failed
    # systemd restarts an agent that crashed or was told to (SIGHUP): it reports the failure, never reruns setup.
    os.kill(first.proc.pid, signal.SIGHUP)
    assert first.wait(30) == 75
    second = agent_env.agent(md, node_dir)
    wait_for(lambda: second.has("setup-failed heartbeat written"), 60, "the second agent's report")
    assert second.has("preparation failed earlier in this boot; reporting it again without running it again")
    assert not second.has("setup output")
    md.set("instance/preempted", "TRUE")  # the controller deletes the node
    assert second.wait(30) == 0
    hb = agent_env.heartbeat("setupfail-1")
    assert hb["state"] == "setup-failed" and hb["notice"] is None and hb["failed_command"][1:] == ["-c", fail]
    assert not first.has("trainer started") and not second.has("trainer started")
    assert not (node_dir / "trainer.json").exists() and not (node_dir / "trainer.log").exists()


def test_a_setup_command_killed_by_the_power_off_is_no_failed_setup(agent_env):
    """A power-off signals every process of the node at once: the setup command's death can reach the agent before
    its own SIGTERM does. That is the node going down (a notice), never a setup failure that would end the job."""
    started = agent_env.tmp / "setup-started"
    hold = f"import os, time; open({str(started)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    s = settings([sys.executable, str(agent_env.tiny_trainer)], f"file://{agent_env.tmp}/store",
                 setup=[["python", "-c", hold]], interpreter=sys.executable)
    md = agent_env.metadata("setupoff-1", attributes("setupoff", 1, agent_env.project, s))
    agent = agent_env.agent(md, agent_env.tmp / "setupoff-1")
    wait_for(lambda: started.exists() and started.read_text(), 60, "the setup command to run")
    os.kill(int(started.read_text()), signal.SIGTERM)  # the command first, the agent a moment later
    time.sleep(0.5)
    os.killpg(agent.proc.pid, signal.SIGTERM)
    agent.wait(30)
    hb = agent_env.heartbeat("setupoff-1")
    assert hb["state"] != "setup-failed" and hb["notice"] == "sigterm", (hb, agent.output()[-3000:])
    assert agent.has("preparation stopped by the node's shutdown: the trainer is not started")
    assert not (agent_env.tmp / "setupoff-1" / "trainer.log").exists()
