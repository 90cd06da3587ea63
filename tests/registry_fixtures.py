"""Debian's `docker-registry` (the CNCF distribution registry) on 127.0.0.1, standing in for Artifact Registry (issue
#47), and tiny OCI images pushed to it by hand over the registry HTTP API v2: no podman, no Docker.

`registry` (session fixture): one registry per session (per xdist worker), filesystem storage in a folder of its own,
plain http on a free port; it yields a Registry (`.host` is `127.0.0.1:PORT`) and is stopped by its process group.

push_image(host, repo, files=...) -> the pinned reference `HOST/REPO:TAG@sha256:HEX` of a one-platform image;
push_index(host, repo, platforms=...) -> the same for an OCI image index over several platforms.
Tools reach the registry over plain http: podman needs `--tls-verify=false` for it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence, Union

import pytest

import system_packages
from sim import emulators

BINARY = "/usr/bin/docker-registry"
INSTALL_HINT = "apt-get install docker-registry (tests/system_packages.py installs it as root)"

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"

# A file's content, or (content, mode); content as text or bytes. A script (content starting "#!") is 0755.
FileContent = Union[str, bytes, tuple]
# A layer: a dict of files (path inside the image -> content) made into a tar.gz here, or a Path to a tar or tar.gz
# made elsewhere (a root filesystem: its name says whether it is gzipped).
Layer = Union[Mapping[str, FileContent], Path]


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT: the reference's registry part, and the http address
    root: Path  # its storage and config
    proc: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def stop(self) -> None:
        emulators.stop_group(self.proc)


def start_registry(root: Path, timeout: float = 30) -> Registry:
    """A registry serving plain http on a free 127.0.0.1 port, its storage and config under `root`; returns once
    /v2/ answers. RuntimeError naming the install command when the binary is missing, or its log when it does not
    start."""
    system_packages.wait_installed()
    if not Path(BINARY).exists():
        raise RuntimeError(f"no {BINARY}: {INSTALL_HINT}")
    root.mkdir(parents=True, exist_ok=True)
    port = emulators.free_port()
    config = root / "config.yml"
    # JSON is YAML: the registry reads this as its config file.
    config.write_text(json.dumps({
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(root / "storage")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}"},
    }))
    log = (root / "registry.log").open("ab")
    proc = subprocess.Popen([BINARY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    log.close()
    reg = Registry(host=f"127.0.0.1:{port}", root=root, proc=proc)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{reg.url}/v2/", timeout=2) as answer:
                if answer.status == 200:
                    return reg
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            reg.stop()
            tail = (root / "registry.log").read_text(errors="replace")[-800:]
            raise RuntimeError(f"docker-registry did not answer on {reg.host}/v2/ (exit {proc.poll()}): {tail}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def registry():
    """The session's registry on 127.0.0.1 (a Registry: `.host`, `.url`)."""
    root = Path(tempfile.mkdtemp(prefix="respawn-registry-"))
    try:
        reg = start_registry(root)
    except RuntimeError as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(str(exc), pytrace=False)
    yield reg
    reg.stop()
    shutil.rmtree(root, ignore_errors=True)


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar(files: Mapping[str, FileContent]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for path in sorted(files):
            content, mode = files[path] if isinstance(files[path], tuple) else (files[path], None)
            data = content.encode() if isinstance(content, str) else bytes(content)
            name = path.lstrip("/")
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):  # the parent directories, each once, before their files
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode if mode is not None else (0o755 if data.startswith(b"#!") else 0o644)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _request(method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None):
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    with urllib.request.urlopen(req, timeout=120) as answer:
        return answer.status, answer.headers, answer.read()


def push_blob(host: str, repo: str, data: bytes) -> str:
    """One blob (a monolithic upload: POST, then PUT with its digest); its digest."""
    digest = _sha256(data)
    status, headers, _ = _request("POST", f"http://{host}/v2/{repo}/blobs/uploads/")
    location = headers["Location"]
    if location.startswith("/"):
        location = f"http://{host}{location}"
    sep = "&" if "?" in location else "?"
    _request("PUT", f"{location}{sep}digest={digest}", data, {"Content-Type": "application/octet-stream"})
    return digest


def _layer(host: str, repo: str, layer: Layer) -> tuple[dict, str]:
    """(the manifest's descriptor, the diff id) of one layer, pushed."""
    if isinstance(layer, Path):
        data = layer.read_bytes()
        gzipped = data[:2] == b"\x1f\x8b"
        diff_id = _sha256(gzip.decompress(data) if gzipped else data)
        media = OCI_LAYER_GZIP if gzipped else OCI_LAYER
    else:
        raw = _tar(layer)
        diff_id = _sha256(raw)
        data = gzip.compress(raw, mtime=0)
        media = OCI_LAYER_GZIP
    return {"mediaType": media, "digest": push_blob(host, repo, data), "size": len(data)}, diff_id


def push_manifest(host: str, repo: str, reference: str, body: bytes, media_type: str) -> str:
    """PUT a manifest or an index under `reference` (a tag or a digest); its digest (Docker-Content-Digest)."""
    _, headers, _ = _request("PUT", f"http://{host}/v2/{repo}/manifests/{reference}", body,
                             {"Content-Type": media_type})
    digest = headers.get("Docker-Content-Digest") or _sha256(body)
    assert digest == _sha256(body), f"the registry's digest {digest} is not the body's {_sha256(body)}"
    return digest


def _image_manifest(host: str, repo: str, layers: Sequence[Layer], architecture: str, os_: str,
                    variant: str | None, config: Mapping | None) -> tuple[bytes, dict]:
    pushed = [_layer(host, repo, layer) for layer in layers]
    image_config = {"architecture": architecture, "os": os_, "config": dict(config or {}),
                    "rootfs": {"type": "layers", "diff_ids": [diff for _, diff in pushed]}}
    if variant:
        image_config["variant"] = variant
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "digest": push_blob(host, repo, config_bytes),
                           "size": len(config_bytes)},
                "layers": [descriptor for descriptor, _ in pushed]}
    platform = {"architecture": architecture, "os": os_, **({"variant": variant} if variant else {})}
    return json.dumps(manifest, sort_keys=True).encode(), platform


def push_image(host: str, repo: str, tag: str = "latest", files: Mapping[str, FileContent] | None = None, *,
               layers: Sequence[Layer] = (), architecture: str = "amd64", os_: str = "linux",
               variant: str | None = None, config: Mapping | None = None) -> str:
    """Push a one-platform OCI image and tag it; its pinned reference `HOST/REPO:TAG@sha256:HEX`.

    `files` is one layer (path inside the image -> content); `layers` adds more (dicts, or tar/tar.gz Paths), in
    order after it. `config` is the image config's `config` object: Entrypoint, Cmd, Env, WorkingDir, User…
    `repo` is lower case, as references are (`team/trainer`)."""
    all_layers = ([files] if files is not None else []) + list(layers)
    body, _ = _image_manifest(host, repo, all_layers, architecture, os_, variant, config)
    return f"{host}/{repo}:{tag}@{push_manifest(host, repo, tag, body, OCI_MANIFEST)}"


def push_index(host: str, repo: str, tag: str = "latest", platforms: Sequence[str] = ("amd64", "arm64"),
               files: Mapping[str, FileContent] | None = None, *, config: Mapping | None = None) -> str:
    """Push an OCI image index with one image per platform ("amd64", "arm64", "arm64/v8", "linux/arm64"…; os linux
    unless given), each with `files` (and a file /etc/respawn-platform naming its platform, so their digests
    differ), and tag it; the index's pinned reference `HOST/REPO:TAG@sha256:HEX`."""
    entries = []
    for spec in platforms:
        parts = spec.split("/")
        os_ = parts.pop(0) if parts[0] in ("linux", "windows") else "linux"
        architecture, variant = parts[0], (parts[1] if len(parts) > 1 else None)
        layer = {**(files or {}), "etc/respawn-platform": f"{spec}\n"}
        body, platform = _image_manifest(host, repo, [layer], architecture, os_, variant, config)
        digest = push_manifest(host, repo, _sha256(body), body, OCI_MANIFEST)
        entries.append({"mediaType": OCI_MANIFEST, "digest": digest, "size": len(body), "platform": platform})
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}, sort_keys=True).encode()
    return f"{host}/{repo}:{tag}@{push_manifest(host, repo, tag, index, OCI_INDEX)}"
