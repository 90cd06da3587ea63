"""The environment cache (trainer.cache, node_agent/envcache.py): a fresh node restores what an earlier node's setup
produced instead of running setup, with real setup commands (`python -m venv`, a script writing files) in real
subprocesses, a file:/// store, the Cloud Storage emulator (gs://) and a slow stand-in (a notice during the upload);
the key and the path rules as pure functions."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from agent_fixtures import agent_env, attributes, gcs_standin, settings, wait_for  # noqa: F401
from respawn import contract
from respawn.agent.envcache import EnvCache, cache_key, key_inputs, unpack_archive
from respawn.agent.metadata import MetadataClient
from respawn.agent.prepare import Preparer
from respawn.agent.storage import Fetcher, Uploader
from respawn.agent.workdir import UnsafeArchive
from respawn.contract import NodeSettings, SettingsError, check_cache_paths
from respawn.control.composition import node_settings
from respawn.schema import Heartbeat, SpecError, parse_spec
from respawn.app.workdir import pack
from sim.metadata import MetadataServer
from trainer_helpers import BUCKET, gcs, gcs_emulator  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]


# ---- the rules, pure -------------------------------------------------------------------------------------------

def test_cache_paths_are_normalised():
    assert check_cache_paths([".venv/", "./build//lib", "~/.cache/pip", "~/./x/"]) == (
        ".venv", "build/lib", "~/.cache/pip", "~/x")
    assert check_cache_paths([]) == ()


@pytest.mark.parametrize("paths, words", [
    (["/opt/venv"], "'/opt/venv' is absolute"),
    (["../elsewhere"], "climbs out with '..'"),
    (["a/../../b"], "climbs out with '..'"),
    (["~/../root"], "climbs out with '..'"),
    (["."], "is the workdir itself"),
    (["~"], "is the HOME directory itself"),
    (["~/"], "is the HOME directory itself"),
    (["~bob/.cache"], "only the trainer's own HOME"),
    ([".venv", ".venv/lib"], "'.venv' and '.venv/lib' overlap"),
    (["~/.cache", "~/.cache/"], "overlap"),
    ([""], "is not a path"),
    ([7], "is not a path"),
    (".venv", "must be a list of paths"),
])
def test_bad_cache_paths_are_named(paths, words):
    with pytest.raises(SettingsError, match=None) as err:
        check_cache_paths(paths)
    assert words in str(err.value), str(err.value)


def test_the_spec_carries_the_cache_to_the_node_and_needs_setup():
    doc = {"id": "train-1", "zones": ["us-central1-a"], "checkpoint_uri": "gs://my-bucket/runs/train-1",
           "accelerator": {"kind": "gpu", "machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-t4",
                           "accelerator_count": 1},
           "trainer": {"command": ["python", "train.py"], "setup": [["python", "-m", "venv", ".venv"]],
                       "cache": [".venv/", "~/.cache/pip"]}}
    spec = parse_spec(doc)
    assert spec.trainer.cache == [".venv", "~/.cache/pip"]
    ns = node_settings(spec, heartbeat_seconds=15, notice_budget_seconds=25, sweep_topic=None)
    assert ns.cache == (".venv", "~/.cache/pip")
    assert NodeSettings.from_json(ns.to_json()).cache == ns.cache
    assert json.loads(ns.to_json())["cache"] == [".venv", "~/.cache/pip"]
    no_setup = json.loads(json.dumps(doc))
    del no_setup["trainer"]["setup"]
    with pytest.raises(SpecError) as err:
        parse_spec(no_setup)
    assert any("trainer.cache" in e and "keeps what trainer.setup produces" in e for e in err.value.errors), err
    bad = json.loads(json.dumps(doc))
    bad["trainer"]["cache"] = ["/usr/lib/python3"]
    with pytest.raises(SpecError) as err:
        parse_spec(bad)
    assert any("trainer.cache" in e and "is absolute" in e for e in err.value.errors), err.value.errors


BASE_INPUTS = dict(setup=[["python", "-m", "venv", ".venv"]], workdir="a" * 64, env={"PIP_INDEX_URL": "x"},
                   interpreter="python3", executable="/usr/bin/python3", version=[3, 12, 3], library="b" * 64,
                   paths=(".venv",), dests=["/var/lib/respawn/workdirs/sha256-a/.venv"],
                   system={"os": "ubuntu", "os_version": "24.04", "machine": "x86_64"})


@pytest.mark.parametrize("field, value", [
    ("setup", [["python", "-m", "venv", ".venv"], ["pip", "install", "torch"]]),
    ("workdir", "c" * 64),  # requirements.txt changed: the workdir's digest did
    ("env", {}),
    ("interpreter", "python3.12"),
    ("executable", "/opt/conda/bin/python"),
    ("version", [3, 12, 4]),
    ("library", None),
    ("paths", (".venv2",)),
    ("dests", ["/other/node/dir/.venv"]),  # a venv is not relocatable
    ("system", {"os": "ubuntu", "os_version": "22.04", "machine": "x86_64"}),
])
def test_the_key_changes_with_every_input(field, value):
    base = cache_key(key_inputs(**BASE_INPUTS))
    assert base == cache_key(key_inputs(**dict(BASE_INPUTS)))  # deterministic
    assert len(base) == 64
    assert cache_key(key_inputs(**{**BASE_INPUTS, field: value})) != base


def test_the_key_is_canonical_json():
    inputs = key_inputs(**BASE_INPUTS)
    reordered = dict(reversed(list(inputs.items())))
    assert cache_key(reordered) == cache_key(inputs)


def _tar(members: list[tuple[str, str, object]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}[kind]
            info.linkname = payload or ""
            info.mode = 0o755
            tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("members, words", [
    ([("0", "dir", None), ("0/../../x", "file", b"x")], "climbs out"),
    ([("/tmp/abs", "file", b"x")], "absolute name"),
    ([("0", "dir", None), ("0/l", "symlink", "/tmp"), ("0/l/x", "file", b"x")], "lies below the symlink"),
    ([("0", "dir", None), ("0/f", "file", b"x"), ("0/g", "hardlink", "0/f")], "hard link"),
    ([("0", "dir", None), ("1", "dir", None)], "not under one of the 1 cache paths"),
    ([("0/x", "file", b"x")], "comes before its cache path's own entry"),
])
def test_unpacking_refuses_members_outside_their_tree_and_leaves_nothing(tmp_path, members, words):
    archive = tmp_path / "a.tar"
    archive.write_bytes(_tar(members))
    (tmp_path / "wd").mkdir()
    dest = tmp_path / "wd" / ".venv"
    with pytest.raises(UnsafeArchive) as err:
        unpack_archive(str(archive), [str(dest)])
    assert words in str(err.value), str(err.value)
    assert os.listdir(tmp_path / "wd") == [] and not (tmp_path / "x").exists()


def test_an_absolute_symlink_is_kept_as_a_venv_needs_it(tmp_path):
    archive = tmp_path / "a.tar"
    archive.write_bytes(_tar([("0", "dir", None), ("0/bin", "dir", None), ("0/bin/python", "symlink", sys.executable)]))
    dest = tmp_path / ".venv"
    unpack_archive(str(archive), [str(dest)])
    assert os.readlink(dest / "bin" / "python") == sys.executable


# ---- a node's preparation with the cache -------------------------------------------------------------------------

def no_metadata() -> MetadataClient:
    return MetadataClient("127.0.0.1:9")  # file:/// needs no token; nothing listens there


# Setup: a real venv in the workdir, a file in ~/.cache, and a counter outside both (its runs).
def setup_commands(runs: Path) -> list[list[str]]:
    write = ("import os, pathlib; p = pathlib.Path(os.environ['HOME'], '.cache', 'tool'); p.mkdir(parents=True, "
             "exist_ok=True); (p / 'data.bin').write_bytes(os.urandom(300_000)); "
             f"open({str(runs)!r}, 'a').write('x')")
    return [["python", "-m", "venv", "--without-pip", ".venv"], ["python", "-c", write]]


class Node:
    """One node's preparation: workdir, interpreter, setup (restored or run); a fresh node gets a fresh disk."""

    def __init__(self, tmp: Path, store: str, workdir_uri: str, runs: Path, *, fetcher=None, uploader=None):
        self.tmp, self.node_dir, self.home = tmp, tmp / "node", tmp / "home"
        self.settings = NodeSettings(command=("python", "train.py"), checkpoint_uri=store, workdir=workdir_uri,
                                     interpreter=sys.executable, setup=setup_commands(runs),
                                     cache=(".venv", "~/.cache/tool"))
        self.fetcher = fetcher or Fetcher(no_metadata())
        self.uploader = uploader or Uploader(no_metadata())
        self.cache: EnvCache | None = None

    def life(self, *, fresh: bool) -> tuple[bool, Preparer]:
        if fresh:  # a new VM: nothing of the last one's disk or HOME
            subprocess.run(["rm", "-rf", str(self.node_dir), str(self.home)], check=True)
        self.home.mkdir(exist_ok=True)
        env = dict(os.environ, PATH="/usr/bin:/bin", HOME=str(self.home))
        self.cache = EnvCache(self.settings.checkpoint_uri, str(self.node_dir), self.fetcher, self.uploader)
        prep = Preparer(self.settings, str(self.node_dir), env, fetcher=self.fetcher, cache=self.cache)
        prep.fetch_workdir()
        prep.find_interpreter()
        ran = prep.run_setup()
        if ran and prep.cache_plan is not None:
            self.cache.upload_in_background(*prep.cache_plan, self.settings.cache).join(60)
        return ran, prep


def workdir(tmp: Path, store: Path, requirements: str) -> str:
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text("print('train')\n")
    (src / "requirements.txt").write_text(requirements)
    packed = pack(src)
    store.mkdir(parents=True, exist_ok=True)
    (store / packed.object_name).write_bytes(packed.data)
    return f"file://{store / packed.object_name}"


def venv_works(prep: Preparer) -> str:
    out = subprocess.run([os.path.join(prep.workdir, ".venv", "bin", "python"), "-c", "import sys; print(sys.prefix)"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def manifests(ckpt: Path) -> list[Path]:
    return sorted((ckpt / contract.ENV_CACHE_DIR).glob("*.json"))


def logged(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_a_fresh_node_restores_the_environment_and_skips_setup(tmp_path, capsys):
    runs, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    node = Node(tmp_path, f"file://{ckpt}", workdir(tmp_path, tmp_path / "code", "numpy==2.1\n"), runs)
    ran, prep = node.life(fresh=True)
    assert ran and runs.read_text() == "x" and node.cache.status["state"] == "ready"
    [manifest] = manifests(ckpt)
    body = json.loads(manifest.read_text())
    archive = ckpt / contract.ENV_CACHE_DIR / body["archive"]
    assert archive.stat().st_size == body["size"] and body["paths"] == [".venv", "~/.cache/tool"]
    data = (node.home / ".cache" / "tool" / "data.bin").read_bytes()
    capsys.readouterr()

    ran, prep = node.life(fresh=True)  # another VM: setup does not run
    assert not ran and runs.read_text() == "x", "setup ran on a node whose environment was in the cache"
    assert node.cache.status == {"state": "restored", "key": manifest.stem[:12], "bytes": body["size"]}
    assert venv_works(prep) == os.path.join(prep.workdir, ".venv")
    assert (node.home / ".cache" / "tool" / "data.bin").read_bytes() == data
    links = [os.readlink(p) for p in (Path(prep.workdir) / ".venv" / "bin").iterdir() if p.is_symlink()]
    assert any(os.path.isabs(link) for link in links), links  # the base interpreter, as venv linked it
    events = logged(capsys)
    assert any(e.get("stage") == "env_restore" and e["bytes"] == body["size"] for e in events)
    assert any(e.get("reason") == "restored from the environment cache" for e in events)
    assert (node.node_dir / "setup.done.json").exists()
    assert not [p for p in Path(prep.workdir).iterdir() if p.name.startswith(".respawn-env-partial")]

    ran, _ = node.life(fresh=False)  # a restart in place: skipped as before, nothing fetched
    assert not ran and runs.read_text() == "x" and node.cache.status is None


def test_a_changed_requirements_file_misses_the_cache_and_runs_setup(tmp_path, capsys):
    runs, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    node = Node(tmp_path, f"file://{ckpt}", workdir(tmp_path, tmp_path / "code", "numpy==2.1\n"), runs)
    assert node.life(fresh=True)[0] and runs.read_text() == "x"
    capsys.readouterr()
    node.settings = NodeSettings(**{**json.loads(node.settings.to_json()),
                                    "workdir": workdir(tmp_path, tmp_path / "code", "numpy==2.2\n")})
    ran, prep = node.life(fresh=True)
    assert ran and runs.read_text() == "xx", "setup did not run though requirements.txt changed"
    events = logged(capsys)
    assert any(e["message"].startswith("environment cache miss") for e in events)
    assert len(manifests(ckpt)) == 2 and node.cache.status["state"] == "ready"  # the new inputs' archive too
    venv_works(prep)


def test_a_corrupt_archive_falls_back_to_setup_and_the_node_still_works(tmp_path, capsys):
    runs, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    node = Node(tmp_path, f"file://{ckpt}", workdir(tmp_path, tmp_path / "code", "numpy==2.1\n"), runs)
    node.life(fresh=True)
    [manifest] = manifests(ckpt)
    archive = ckpt / contract.ENV_CACHE_DIR / json.loads(manifest.read_text())["archive"]
    data = bytearray(archive.read_bytes())
    for i in range(2000, 2016):
        data[i] ^= 0xFF
    archive.write_bytes(bytes(data))
    capsys.readouterr()
    ran, prep = node.life(fresh=True)
    assert ran and runs.read_text() == "xx" and venv_works(prep)
    warning = [e for e in logged(capsys) if e["message"] == "environment cache not usable; running setup instead"]
    assert warning and warning[0]["severity"] == "WARNING" and str(archive) in warning[0]["failed"]
    assert "does not match its manifest" in warning[0]["error"]
    assert not [p for p in Path(prep.workdir).iterdir() if p.name.startswith(".respawn-env-partial")]
    # This node's setup replaced the broken archive: the next fresh node restores again.
    assert node.cache.status["state"] == "ready" and manifests(ckpt) == [manifest]
    assert json.loads(manifest.read_text())["archive"] != archive.relative_to(ckpt / contract.ENV_CACHE_DIR).as_posix()
    ran, prep = node.life(fresh=True)
    assert not ran and runs.read_text() == "xx" and venv_works(prep)


def test_an_archive_that_is_unsafe_but_verifies_is_not_unpacked(tmp_path, capsys):
    """A manifest and archive that agree, but the archive writes outside its tree: fallback, nothing written."""
    runs, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    node = Node(tmp_path, f"file://{ckpt}", workdir(tmp_path, tmp_path / "code", "x\n"), runs)
    node.life(fresh=True)
    [manifest] = manifests(ckpt)
    body = json.loads(manifest.read_text())
    evil = _tar([("0", "dir", None), ("0/../../../escaped", "file", b"pwned")])
    (ckpt / contract.ENV_CACHE_DIR / body["archive"]).write_bytes(evil)
    body.update(size=len(evil), sha256=hashlib.sha256(evil).hexdigest())
    manifest.write_text(json.dumps(body))
    ran, prep = node.life(fresh=True)
    assert ran and venv_works(prep)
    assert not list(tmp_path.rglob("escaped"))
    assert any("climbs out" in e.get("error", "") for e in logged(capsys))


def test_a_notice_during_the_upload_leaves_no_manifest_and_no_partial_archive(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    store = ckpt / contract.ENV_CACHE_DIR
    node = Node(tmp_path, f"file://{ckpt}", workdir(tmp_path, tmp_path / "code", "x\n"), tmp_path / "runs")
    node.node_dir.mkdir()
    node.home.mkdir()
    env = dict(os.environ, PATH="/usr/bin:/bin", HOME=str(node.home))

    def notice() -> bool:  # the notice comes once 8 MiB of the archive are written
        return any(p.stat().st_size > 8 << 20 for p in store.rglob("*.partial-*"))
    cache = EnvCache(node.settings.checkpoint_uri, str(node.node_dir), node.fetcher, node.uploader,
                     interrupted=notice)
    prep = Preparer(node.settings, str(node.node_dir), env, fetcher=node.fetcher, cache=cache)
    prep.fetch_workdir()
    prep.find_interpreter()
    assert prep.run_setup()
    with open(node.home / ".cache" / "tool" / "big.bin", "wb") as f:  # an archive of many writes
        f.write(os.urandom(64 << 20))
    cache.upload_in_background(*prep.cache_plan, node.settings.cache).join(30)
    assert cache.status["state"] == "upload-stopped"
    assert any(e["message"].startswith("environment cache upload stopped by the notice") for e in logged(capsys))
    assert manifests(ckpt) == [] and not [p for p in store.rglob("*") if p.is_file()], list(store.rglob("*"))


# ---- Cloud Storage ----------------------------------------------------------------------------------------------

def test_upload_and_restore_through_cloud_storage(tmp_path, gcs, gcs_emulator, capsys):
    """gs:// through the emulator: the resumable upload in pieces (a 20 MiB file makes two), then a fresh node
    restores from it."""
    runs = tmp_path / "runs"
    store = f"gs://{BUCKET}/runs/envcache-{time.monotonic_ns()}"
    with MetadataServer() as md:
        client = MetadataClient(md.host)
        environ = {"STORAGE_EMULATOR_HOST": gcs_emulator}
        node = Node(tmp_path, store, workdir(tmp_path, tmp_path / "code", "x\n"), runs,
                    fetcher=Fetcher(client, environ=environ), uploader=Uploader(client, environ=environ))
        node.settings = NodeSettings(**{**json.loads(node.settings.to_json()), "setup": [
            *node.settings.setup, ["python", "-c", "import os; open(os.path.join(os.environ['HOME'], '.cache', "
                                                   "'tool', 'big.bin'), 'wb').write(os.urandom(20 << 20))"]]})
        assert node.life(fresh=True)[0] and node.cache.status["state"] == "ready", capsys.readouterr().out[-3000:]
        prefix = store[len(f"gs://{BUCKET}/"):] + "/" + contract.ENV_CACHE_DIR + "/"
        names = sorted((b.name for b in gcs.list_blobs(BUCKET, prefix=prefix)), key=lambda n: n.endswith(".json"))
        assert len(names) == 2 and names[0].endswith(".tar") and names[1].endswith(".json"), names
        manifest = json.loads(gcs.bucket(BUCKET).blob(names[1]).download_as_bytes())
        assert names[0] == prefix + manifest["archive"]
        assert gcs.bucket(BUCKET).get_blob(names[0]).size == manifest["size"] > 20 << 20
        big = (node.home / ".cache" / "tool" / "big.bin").read_bytes()
        ran, prep = node.life(fresh=True)
    assert not ran and runs.read_text() == "x" and venv_works(prep)
    assert (node.home / ".cache" / "tool" / "big.bin").read_bytes() == big


# ---- the agent ----------------------------------------------------------------------------------------------------

@pytest.fixture
def slow_store(tmp_path):
    """tests/gcs_standin.py: no objects (404), uploads accepted, each resumable piece answered after 1 s."""
    with gcs_standin(tmp_path, "--get", "404", "--upload", "200", "--piece-seconds", "1") as standin:
        yield standin


def test_a_notice_while_the_agent_uploads_is_not_delayed_and_commits_nothing(agent_env, slow_store):
    host, log = slow_store
    make = ("import os; d = os.path.join(os.environ['HOME'], 'cache'); os.makedirs(d, exist_ok=True); "
            "open(os.path.join(d, 'big.bin'), 'wb').write(os.urandom(100 << 20))")  # 7 pieces: 7 s at least
    home = agent_env.tmp / "home"
    s = settings([sys.executable, str(agent_env.tiny_trainer)], "gs://b/runs/job", setup=[["python", "-c", make]],
                 interpreter=sys.executable, cache=["~/cache"], env={"HOME": str(home)})
    md = agent_env.metadata("cachejob-1", attributes("cachejob", 1, agent_env.project, s))
    agent = agent_env.agent(md, agent_env.tmp / "cachejob-1", STORAGE_EMULATOR_HOST=host)
    hb = wait_for(lambda: (h := agent_env.heartbeat("cachejob-1")) and h["state"] == "training"
                  and (h.get("env_cache") or {}).get("state") == "uploading" and (h.get("step") or 0) > 0 and h, 60,
                  "the trainer stepping while the environment uploads")
    Heartbeat.model_validate(hb)
    assert wait_for(lambda: "PUT" in log.read_text(), 30, "the first piece")
    md.set("instance/preempted", "TRUE")
    assert agent.wait(30) == 0
    hb = agent_env.heartbeat("cachejob-1")
    assert hb["state"] == "exited" and hb["exit_code"] == contract.EXIT_PREEMPTED
    requests = log.read_text().splitlines()
    assert any("uploadType=resumable" in r for r in requests)
    assert not any(".json" in r and r.startswith("POST") for r in requests), requests  # no manifest
    # No last piece: the agent was gone before the upload could end, so the notice never waited for it.
    assert not any(r.startswith("PUT") and not r.endswith("/*") for r in requests), requests
