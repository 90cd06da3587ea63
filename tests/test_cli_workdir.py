"""`respawn jobs register --workdir` and `respawn jobs pack`, run as real processes against the Firestore and Cloud
Storage emulators; respawn.app.codestore's refusals through the real google-cloud-storage client against a local
stand-in (tests/gcs_standin.py) that answers as Cloud Storage does."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from respawn import schema
from respawn.app import codestore
from respawn.app.workdir import pack
from tests import respawn_forks
from trainer_helpers import BUCKET, gcs, gcs_emulator  # noqa: F401 - fixtures

ROOT = Path(__file__).resolve().parent.parent
SPEC = {
    "id": "wd-job",
    "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"},
    "zones": ["us-central1-a"],
    "trainer": {"command": ["python", "train.py"], "env": {"MODE": "fast"}},
    "checkpoint_uri": f"gs://{BUCKET}/wd-job",
}


# `python -m respawn ARGS`, forked (tests/respawn_forks.py); test_no_credentials_say_how_to_log_in runs it as itself.
respawn = functools.partial(respawn_forks.respawn, timeout=120)


def write_spec(path: Path, **changes) -> Path:
    spec = {**SPEC, **changes}
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def code(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    (root / "pkg").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "train.py").write_text("print('training')\n")
    (root / "requirements.txt").write_text("numpy\n")
    (root / "pkg" / "model.py").write_text("W = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\nexec python train.py\n")
    (root / "run.sh").chmod(0o755)
    (root / "data" / "big.bin").write_bytes(b"\0" * 1000)
    (root / ".gitignore").write_text("*.pyc\n")
    (root / ".respawnignore").write_text("data/\n")
    (root / "stale.pyc").write_bytes(b"\0")
    return root


@pytest.fixture
def storage_env(gcs_emulator) -> dict:
    return {"STORAGE_EMULATOR_HOST": gcs_emulator}


def stored_spec(db, job_id: str) -> dict:
    snap = db.collection(schema.JOBS).document(job_id).get()
    assert snap.exists, f"job {job_id} was not registered"
    return snap.to_dict()["spec"]


def names_in(data: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name for m in tar.getmembers()}


# ---- register --workdir, end to end -----------------------------------------------------------------------

def test_register_with_workdir_uploads_the_archive_and_stores_its_uri(firestore_db, project, gcs, storage_env,
                                                                       code, tmp_path):
    spec_file = write_spec(tmp_path / "job.yaml")
    r = respawn("jobs", "register", str(spec_file), "--workdir", str(code), "--project", project, env=storage_env)
    assert r.returncode == 0, r.stderr

    digest = pack(code).sha256
    uri = f"gs://{BUCKET}/respawn/workdirs/sha256-{digest}.tar.gz"
    assert stored_spec(firestore_db, "wd-job")["trainer"]["workdir"] == uri
    assert stored_spec(firestore_db, "wd-job")["trainer"]["env"] == {"MODE": "fast"}  # the rest as written
    assert f"uploaded {uri}" in r.stdout and digest in r.stdout and "registered wd-job" in r.stdout

    data = gcs.bucket(BUCKET).blob(f"respawn/workdirs/sha256-{digest}.tar.gz").download_as_bytes()
    assert hashlib.sha256(data).hexdigest() == digest, "the object's bytes must hash to its name"
    assert names_in(data) == {"train.py", "requirements.txt", "pkg", "pkg/model.py", "run.sh", ".gitignore",
                              ".respawnignore"}
    assert yaml.safe_load(spec_file.read_text()) == SPEC, "the user's file is not rewritten"


def test_a_second_registration_of_the_same_tree_reuses_the_object(firestore_db, project, gcs, storage_env, code,
                                                                  tmp_path):
    first = respawn("jobs", "register", str(write_spec(tmp_path / "a.yaml", id="wd-a")), "--workdir", str(code),
                    "--project", project, env=storage_env)
    assert first.returncode == 0, first.stderr
    blob = gcs.bucket(BUCKET).blob(f"respawn/workdirs/{pack(code).object_name}")
    blob.reload()
    generation = blob.generation
    (code / "data" / "new.bin").write_bytes(b"x")  # an excluded change: the same archive
    second = respawn("jobs", "register", str(write_spec(tmp_path / "b.yaml", id="wd-b")), "--workdir", str(code),
                     "--project", project, env=storage_env)
    assert second.returncode == 0, second.stderr
    assert "already uploaded (same content)" in second.stdout
    blob.reload()
    assert blob.generation == generation, "the object was written again"
    assert stored_spec(firestore_db, "wd-a")["trainer"]["workdir"] == stored_spec(firestore_db, "wd-b")["trainer"]["workdir"]


def test_workdir_option_wins_over_the_spec_with_a_notice(firestore_db, project, gcs, storage_env, code, tmp_path):
    old = f"gs://{BUCKET}/respawn/workdirs/sha256-{'0' * 64}.tar.gz"
    spec_file = write_spec(tmp_path / "job.yaml", trainer={**SPEC["trainer"], "workdir": old})
    r = respawn("jobs", "register", str(spec_file), "--workdir", str(code), "--project", project, env=storage_env)
    assert r.returncode == 0, r.stderr
    assert "--workdir replaces trainer.workdir" in r.stderr and old in r.stderr
    assert stored_spec(firestore_db, "wd-job")["trainer"]["workdir"].endswith(pack(code).object_name)


def test_a_directory_written_as_the_workdir_is_packed_relative_to_the_spec_file(firestore_db, project, gcs,
                                                                                 storage_env, code, tmp_path):
    (code / "relative.txt").write_text("a tree no other test uploads")
    spec_file = write_spec(tmp_path / "job.yaml", trainer={**SPEC["trainer"], "workdir": "code"})
    uri = f"gs://{BUCKET}/respawn/workdirs/{pack(code).object_name}"
    r = respawn("jobs", "validate", str(spec_file))  # offline: packs to show the URI, sends nothing
    assert r.returncode == 0, r.stderr
    assert uri in r.stdout and not gcs.bucket(BUCKET).blob(uri.split("/", 3)[3]).exists()
    r = respawn("jobs", "register", str(spec_file), "--project", project, env=storage_env)
    assert r.returncode == 0, r.stderr
    assert stored_spec(firestore_db, "wd-job")["trainer"]["workdir"] == uri
    assert gcs.bucket(BUCKET).blob(uri.split("/", 3)[3]).exists()
    missing = write_spec(tmp_path / "missing.yaml", id="wd-missing", trainer={**SPEC["trainer"], "workdir": "nope"})
    r = respawn("jobs", "validate", str(missing))
    assert r.returncode == 2 and "nope does not exist" in r.stderr


@pytest.mark.parametrize("example", sorted((ROOT / "examples" / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_the_example_jobs_bring_their_code_and_setup_and_validate(example):
    spec = yaml.safe_load(example.read_text())
    assert {"workdir", "setup", "interpreter", "command"} <= set(spec["trainer"]), "show how to bring your own code"
    r = respawn("jobs", "validate", str(example))
    assert r.returncode == 0, r.stderr
    assert f"trainer.workdir: {example.parent / spec['trainer']['workdir']} → gs://" in r.stdout


def test_a_bad_workdir_in_the_spec_is_replaced_not_reported(firestore_db, project, storage_env, code, tmp_path):
    spec_file = write_spec(tmp_path / "job.yaml", trainer={**SPEC["trainer"], "workdir": "gs://b/not-an-archive"})
    assert respawn("jobs", "validate", str(spec_file)).returncode == 2  # the file alone is invalid
    r = respawn("jobs", "register", str(spec_file), "--workdir", str(code), "--project", project, env=storage_env)
    assert r.returncode == 0, r.stderr


def test_a_missing_bucket_is_named_and_nothing_is_registered(firestore_db, project, storage_env, code, tmp_path):
    spec_file = write_spec(tmp_path / "job.yaml", checkpoint_uri="gs://no-such-bucket-x/wd-job")
    r = respawn("jobs", "register", str(spec_file), "--workdir", str(code), "--project", project, env=storage_env)
    assert r.returncode == 1
    assert "bucket 'no-such-bucket-x' does not exist" in r.stderr
    assert "gcloud storage buckets create gs://no-such-bucket-x" in r.stderr and "fix checkpoint_uri" in r.stderr
    assert "Traceback" not in r.stderr
    assert not firestore_db.collection(schema.JOBS).document("wd-job").get().exists


def test_a_taken_job_id_is_refused_before_packing(firestore_db, project, storage_env, code, tmp_path):
    spec_file = write_spec(tmp_path / "job.yaml")
    assert respawn("jobs", "register", str(spec_file), "--project", project).returncode == 0
    r = respawn("jobs", "register", str(spec_file), "--workdir", str(code), "--project", project, env=storage_env)
    assert r.returncode == 1
    assert "already exists" in r.stderr and "packed" not in r.stdout


def test_dry_run_packs_and_sends_nothing(firestore_db, project, gcs, storage_env, code, tmp_path):
    (code / "dry.txt").write_text("a tree no other test uploads")
    spec_file = write_spec(tmp_path / "job.yaml")
    r = respawn("jobs", "register", str(spec_file), "--workdir", str(code), "--dry-run", env=storage_env)
    assert r.returncode == 0, r.stderr
    name = pack(code).object_name
    assert f"would upload gs://{BUCKET}/respawn/workdirs/{name}" in r.stdout
    assert not gcs.bucket(BUCKET).blob(f"respawn/workdirs/{name}").exists()
    assert not firestore_db.collection(schema.JOBS).document("wd-job").get().exists


def test_a_workdir_that_cannot_be_packed_is_named(firestore_db, project, storage_env, tmp_path):
    spec_file = write_spec(tmp_path / "job.yaml")
    r = respawn("jobs", "register", str(spec_file), "--workdir", str(tmp_path / "nope"), "--project", project,
                env=storage_env)
    assert r.returncode == 2
    assert "nope does not exist" in r.stderr and "Traceback" not in r.stderr
    escaping = tmp_path / "esc"
    escaping.mkdir()
    (escaping / "train.py").write_text("")
    (escaping / "python").symlink_to("/usr/bin/python3")
    r = respawn("jobs", "register", str(spec_file), "--workdir", str(escaping), "--project", project, env=storage_env)
    assert r.returncode == 2
    assert "symlink python -> /usr/bin/python3 is absolute" in r.stderr


def test_file_checkpoint_uri_puts_the_archive_beside_the_checkpoints(firestore_db, project, code, tmp_path):
    ckpt = tmp_path / "ckpt" / "wd-job"
    spec_file = write_spec(tmp_path / "job.yaml", checkpoint_uri=f"file://{ckpt}")
    r = respawn("jobs", "register", str(spec_file), "--workdir", str(code), "--project", project)
    assert r.returncode == 0, r.stderr
    packed = pack(code)
    archive = tmp_path / "ckpt" / "respawn-workdirs" / packed.object_name
    assert archive.read_bytes() == packed.data
    assert stored_spec(firestore_db, "wd-job")["trainer"]["workdir"] == f"file://{archive}"
    assert [p.name for p in archive.parent.iterdir()] == [packed.object_name], "a temporary file was left behind"
    r = respawn("jobs", "register", str(write_spec(tmp_path / "b.yaml", id="wd-b", checkpoint_uri=f"file://{ckpt}")),
                "--workdir", str(code), "--project", project)
    assert r.returncode == 0, r.stderr
    assert "already uploaded (same content)" in r.stdout


def test_a_local_archive_of_the_wrong_size_is_never_used(code, tmp_path):
    packed = pack(code)
    directory = tmp_path / "respawn-workdirs"
    directory.mkdir()
    (directory / packed.object_name).write_bytes(b"truncated")
    with pytest.raises(codestore.CodeStoreError, match=r"exists but holds 9 B.*delete it \(`rm "):
        codestore.upload(packed, f"file://{tmp_path}/ckpt")


def test_large_work_shows_progress(firestore_db, project, gcs, storage_env, tmp_path):
    root = tmp_path / "big"
    root.mkdir()
    (root / "train.py").write_text("")
    (root / "weights.bin").write_bytes(os.urandom(12 * 1024 * 1024))  # incompressible: a 12 MiB archive
    r = respawn("jobs", "register", str(write_spec(tmp_path / "job.yaml")), "--workdir", str(root),
                "--project", project, env=storage_env)
    assert r.returncode == 0, r.stderr
    packing = [line for line in r.stderr.splitlines() if line.startswith("packing ")]
    uploading = [line for line in r.stderr.splitlines() if line.startswith("uploading gs://")]
    assert [line.rsplit("(", 1)[1] for line in packing] == ["25%)", "50%)", "75%)", "100%)"], r.stderr
    assert uploading and uploading[-1].endswith("(100%)"), r.stderr


# ---- jobs pack --------------------------------------------------------------------------------------------

def test_jobs_pack_shows_what_would_be_uploaded_and_sends_nothing(code, tmp_path):
    out = tmp_path / "w.tar.gz"
    r = respawn("jobs", "pack", str(code), "--output", str(out), env={"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"})
    assert r.returncode == 0, r.stderr
    packed = pack(code)
    assert packed.sha256 in r.stdout and packed.object_name in r.stdout
    assert "6 files" in r.stdout  # train.py, requirements.txt, pkg/model.py, run.sh, .gitignore, .respawnignore
    assert "left out (2): data/, stale.pyc" in r.stdout
    assert "pkg/" in r.stdout
    assert out.read_bytes() == packed.data
    listed = respawn("jobs", "pack", str(code), "--list")
    modes = {line.split()[-1]: line.split()[0] for line in listed.stdout.splitlines() if line[:4] in ("0644", "0755")}
    assert list(modes) == [".gitignore", ".respawnignore", "pkg/", "pkg/model.py", "requirements.txt", "run.sh",
                           "train.py"]
    assert (modes["run.sh"], modes["train.py"], modes["pkg/"]) == ("0755", "0644", "0755")


# ---- refusals from Cloud Storage, through the real client ---------------------------------------------------

@pytest.fixture
def standin(tmp_path, monkeypatch):
    """Starts tests/gcs_standin.py with the given statuses and points STORAGE_EMULATOR_HOST at it; returns the
    path of its request log. Each server is stopped by its PID's process group at the end."""
    procs = []

    def start(get: int, upload: int, size: int = 0) -> Path:
        log = tmp_path / f"standin-{len(procs)}.log"
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "gcs_standin.py"), "--get", str(get),
                                 "--upload", str(upload), "--size", str(size), "--log", str(log)],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(proc)
        port = proc.stdout.readline().strip()
        if not port.isdigit():
            pytest.fail(f"tests/gcs_standin.py did not start (said {port!r}, exit {proc.poll()})", pytrace=False)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        return log

    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait(10)
        proc.stdout.close()


def test_permission_denied_names_the_object_and_the_permission(standin, code):
    log = standin(get=403, upload=403)
    packed = pack(code)
    with pytest.raises(codestore.CodeStoreError) as err:
        codestore.upload(packed, "gs://locked-bucket/jobs/a")
    message = str(err.value)
    assert f"permission denied writing gs://locked-bucket/respawn/workdirs/{packed.object_name}" in message
    assert "storage.objects.create on bucket 'locked-bucket'" in message
    assert "roles/storage.objectCreator" in message
    assert "alice@example.com does not have storage.objects.create access" in message  # what the server said
    assert any(line.startswith("POST /upload/") for line in log.read_text().splitlines())


def test_an_upload_that_loses_a_race_counts_as_done(standin, code):
    # Another registration created the object between our read (404) and our create-only upload (412).
    log = standin(get=404, upload=412)
    result = codestore.upload(pack(code), "gs://b/x")
    assert result.sent is False
    uploads = [line for line in log.read_text().splitlines() if line.startswith("POST /upload/")]
    assert len(uploads) == 1 and "ifGenerationMatch=0" in uploads[0], "the upload must be create-only"


def test_an_existing_object_is_not_sent_again(standin, code):
    packed = pack(code)
    log = standin(get=200, upload=500, size=packed.size)
    assert codestore.upload(packed, "gs://b/x").sent is False
    assert not any(line.startswith("POST") for line in log.read_text().splitlines())


def test_an_existing_object_of_the_wrong_size_is_refused(standin, code):
    packed = pack(code)
    standin(get=200, upload=500, size=packed.size + 1)
    with pytest.raises(codestore.CodeStoreError, match=r"exists but holds .*gcloud storage rm gs://b/respawn/workdirs/"):
        codestore.upload(packed, "gs://b/x")


def test_refused_credentials_say_how_to_log_in(standin, code):
    # A 401 makes the client refresh its credentials, which fails: the message says how to log in again.
    standin(get=404, upload=401)
    with pytest.raises(codestore.CodeStoreError, match=r"credentials could not be used.*gcloud auth application-default login"):
        codestore.upload(pack(code), "gs://b/x")


def test_no_credentials_say_how_to_log_in(firestore_db, project, code, tmp_path):
    # Firestore is the emulator's (no credentials needed); Cloud Storage is the real one, with no credentials at all.
    env = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST")}
    env.update({"CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "HOME": str(tmp_path), "NO_GCE_CHECK": "True",
                "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "COLUMNS": "200"})
    r = subprocess.run([sys.executable, "-m", "respawn", "jobs", "register", str(write_spec(tmp_path / "job.yaml")),
                        "--workdir", str(code), "--project", project], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 1
    assert "no Google Cloud credentials to upload the workdir" in r.stderr
    assert "gcloud auth application-default login" in r.stderr and "Traceback" not in r.stderr
    assert not firestore_db.collection(schema.JOBS).document("wd-job").get().exists
