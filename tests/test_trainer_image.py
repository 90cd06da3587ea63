"""trainer.image (issue #47): the reference's syntax at `respawn jobs validate`, and at `respawn jobs register` the tag
resolved to a digest over the registry HTTP API against a real registry (Debian's docker-registry on 127.0.0.1,
tests/registry_fixtures.py), the image's platforms checked against the VM's, and the pinned image carried into the
node's settings. The CLI runs as a real process."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from registry_fixtures import push_image, push_index
from respawn import schema
from respawn.contract import NodeSettings
from respawn.control import composition
from sim import emulators
from test_cli import respawn

GPU = {"kind": "gpu", "machine_type": "g2-standard-8"}  # amd64
TPU = {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"}  # amd64 hosts
FILES = {"app/train.py": "print('training')\n"}


def write_spec(tmp_path: Path, image: str, accelerator: dict = GPU, **trainer) -> Path:
    spec = {"id": "img-job", "accelerator": accelerator,
            "zones": ["us-west4-a"] if accelerator["kind"] == "tpu" else ["us-central1-a"],
            "trainer": {"image": image, "command": ["python", "train.py"], **trainer},
            "checkpoint_uri": "gs://ckpt-bucket/img-job"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def one_error_line(r) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    return " ".join(lines)


@pytest.mark.parametrize("image, says", [
    ("MyTeam/trainer:v1", "repository names are lower case (myteam/trainer)"),
    ("ghcr.io/team/trainer:v1+cuda", "'v1+cuda' is not a tag"),
    ("us-docker.pkg.dev/proj/trainer:v1", "an Artifact Registry image is us-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE"),
    ("https://ghcr.io/team/trainer:v1", "no scheme"),
    ("ghcr.io/team/trainer@sha256:abc", "64 lowercase hex digits"),
])
def test_validate_refuses_a_reference_that_cannot_exist_in_one_line(tmp_path, image, says):
    r = respawn("jobs", "validate", str(write_spec(tmp_path, image)))
    assert r.returncode == 2
    assert "trainer.image" in r.stderr and says in one_error_line(r)


def test_validate_refuses_cache_with_an_image_and_accepts_docker_hub_names(tmp_path):
    r = respawn("jobs", "validate", str(write_spec(tmp_path, "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime",
                                                   setup=[["pip", "install", "-e", "."]], cache=[".venv"])))
    assert r.returncode == 2
    assert "trainer.cache: not with trainer.image" in one_error_line(r)
    r = respawn("jobs", "validate", str(write_spec(tmp_path, "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime",
                                                   setup=[["pip", "install", "-e", "."]])))
    assert r.returncode == 0, r.stderr


def test_register_pins_the_tag_and_the_node_runs_that_digest(firestore_db, project, registry, tmp_path):
    pinned = push_image(registry.host, "team/trainer", "v1", FILES)
    r = respawn("jobs", "register", str(write_spec(tmp_path, f"{registry.host}/team/trainer:v1")), "--project", project)
    assert r.returncode == 0, r.stderr
    assert f"→ {pinned} (linux/amd64)" in r.stdout
    doc = firestore_db.collection(schema.JOBS).document("img-job").get().to_dict()
    assert doc["spec"]["trainer"]["image"] == pinned

    # The controller admits the stored spec and gives its nodes the same bytes; a tag moved since changes nothing.
    push_image(registry.host, "team/trainer", "v1", {"app/train.py": "print('other')\n"})
    spec = composition.admit(doc["spec"], stored=True)
    settings = composition.node_settings(spec, heartbeat_seconds=10, notice_budget_seconds=25, sweep_topic=None)
    assert NodeSettings.from_json(settings.to_json()).image == pinned


def test_the_controller_refuses_a_stored_image_that_is_not_pinned():
    spec = {"id": "img-job", "accelerator": GPU, "zones": ["us-central1-a"], "checkpoint_uri": "gs://ckpt-bucket/img-job",
            "trainer": {"image": "ghcr.io/team/trainer:v1", "command": ["python", "train.py"]}}
    composition.admit(spec)  # as written: what `jobs validate` reads
    with pytest.raises(schema.SpecError, match="trainer.image: ghcr.io/team/trainer:v1 is not pinned by digest"):
        composition.admit(spec, stored=True)


def dry_run(tmp_path: Path, image: str, accelerator: dict = GPU):
    return respawn("jobs", "register", str(write_spec(tmp_path, image, accelerator)), "--dry-run")


def test_register_checks_a_digest_and_the_architecture_of_an_index_or_a_single_manifest(registry, tmp_path):
    both = push_index(registry.host, "team/multi", "v1", ["amd64", "arm64/v8"], FILES)
    arm = push_index(registry.host, "team/arm", "v1", ["arm64/v8"], FILES)
    single_arm = push_image(registry.host, "team/single-arm", "v1", FILES, architecture="arm64")
    single_amd = push_image(registry.host, "team/single-amd", "v1", FILES)

    r = dry_run(tmp_path, both)  # a digest reference: kept, after it is found
    assert r.returncode == 0, r.stderr
    assert f"→ {both} (linux/amd64, linux/arm64/v8)" in r.stdout
    r = dry_run(tmp_path, single_amd.split(":v1@")[0] + "@" + single_amd.split("@")[1], TPU)  # TPU hosts: amd64
    assert r.returncode == 0, r.stderr

    for image, offers in ((arm, "linux/arm64/v8"), (single_arm, "linux/arm64")):
        r = dry_run(tmp_path, image.split("@")[0])
        assert r.returncode == 2
        assert f"is built for {offers}; the job's VMs are linux/amd64" in one_error_line(r)


def test_register_refuses_a_tag_or_digest_the_registry_does_not_have(registry, tmp_path):
    push_image(registry.host, "team/trainer", "v1", FILES)
    r = dry_run(tmp_path, f"{registry.host}/team/trainer:v2")
    assert r.returncode == 2
    assert "has no tag 'v2' (HTTP 404: MANIFEST_UNKNOWN)" in one_error_line(r)
    r = dry_run(tmp_path, f"{registry.host}/team/trainer@sha256:{'0' * 64}")
    assert r.returncode == 2
    assert f"has no digest sha256:{'0' * 64}" in one_error_line(r)


def test_register_names_an_unreachable_registry(tmp_path):
    host = f"127.0.0.1:{emulators.free_port()}"  # nothing listens there
    r = dry_run(tmp_path, f"{host}/team/trainer:v1")
    assert r.returncode == 2
    assert f"registry {host} unreachable" in one_error_line(r)


def test_register_gives_up_on_a_silent_registry_at_the_deadline(tmp_path):
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        host = f"127.0.0.1:{silent.getsockname()[1]}"
        r = dry_run(tmp_path, f"{host}/team/trainer:v1")
    assert r.returncode == 2
    assert f"registry {host} did not answer within 10 s" in one_error_line(r)


class _TokenGate(http.server.BaseHTTPRequestHandler):
    """A registry that wants a bearer token from its token service (both here), in front of the real one."""
    upstream = ""
    token = "pull-token-for-team-private"
    scopes: list[str] = []

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        host = f"127.0.0.1:{self.server.server_address[1]}"
        if self.path.startswith("/token?"):
            self.scopes.append(self.path)
            self._send(200, {"Content-Type": "application/json"}, json.dumps({"token": self.token}).encode())
            return
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            challenge = f'Bearer realm="http://{host}/token",service="{host}",scope="repository:team/private:pull"'
            self._send(401, {"WWW-Authenticate": challenge, "Content-Type": "application/json"},
                       b'{"errors":[{"code":"UNAUTHORIZED"}]}')
            return
        req = urllib.request.Request(self.upstream + self.path, headers={"Accept": self.headers.get("Accept", "*/*")})
        try:
            with urllib.request.urlopen(req, timeout=10) as answer:
                status, headers, body = answer.status, answer.headers, answer.read()
        except urllib.error.HTTPError as exc:
            status, headers, body = exc.code, exc.headers, exc.read()
        self._send(status, {k: headers[k] for k in ("Content-Type", "Docker-Content-Digest") if headers.get(k)}, body)

    def _send(self, status: int, headers: dict, body: bytes) -> None:
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


def test_register_follows_a_bearer_challenge_anonymously(registry, tmp_path):
    pinned = push_image(registry.host, "team/private", "v1", FILES)
    _TokenGate.upstream, _TokenGate.scopes = registry.url, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TokenGate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        gate = f"127.0.0.1:{server.server_address[1]}"
        r = dry_run(tmp_path, f"{gate}/team/private:v1")
        assert r.returncode == 0, r.stderr
        assert f"→ {gate}/team/private:v1@{pinned.split('@')[1]}" in r.stdout
        assert _TokenGate.scopes and "scope=repository%3Ateam%2Fprivate%3Apull" in _TokenGate.scopes[0]
    finally:
        server.shutdown()
        server.server_close()
