"""The trainer's OCI image on the stand-ins (issue #47): what a user ships to Artifact Registry, made here offline.

Three layers, each a gzipped tar built once into the ignored .cache/trainer-images/<recipe hash>/ (a complete build
only ever has that name: a half-built one is named `.partial-PID` and removed by the next build):
1. the base: a Debian 12 (bookworm) minbase root made by debootstrap, with Debian's python3 (3.11), what `podman
   import` of the root's tar would make (its /dev, apt's caches and the docs left out);
2. the environment: torch and numpy as installed in this interpreter (torch 2.13.0 CPU, cp311: the ABI of Debian's
   3.11), with torch's declared requirements (sympy, networkx, jinja2, ...), copied by their RECORD files into
   /usr/local/lib/python3.11/dist-packages (their scripts, torchrun among them, into /usr/local/bin), compiled to .pyc (unchecked hashes: valid whatever the files' mtimes);
   torch's C++ headers, CMake files, test binaries and test libraries (nothing imports them) are left out;
3. the trainer: the demo's example workdir (examples/workdir: train.py reads through a 2-worker DataLoader and uses
   Respawn's checkpoint library) in /opt/trainer, and `python` → python3 as in the images users start from.
Respawn's library itself is not in the image: the node's agent provides it.

The tars are reproducible (sorted names, mtime 0, uid 0, no atime, ctime or PID in the pax headers): the same files
give the same digests, so the environment and trainer layers of one recipe are the same in every build; the base
root is debootstrap's and differs from one run to the next (its logs, /etc/shadow's date, ldconfig's aux-cache).
The environment and trainer layers are made while debootstrap runs. push() uploads the blobs to a registry over the
HTTP API v2 (a blob the registry has is not sent again) and returns the reference pinned by digest. `python -m sim.trainer_image` builds it and prints the figures.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "trainer-images"  # .gitignore'd
MIRROR = os.environ.get("RESPAWN_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
DEBOOTSTRAP = ("--variant=minbase", "--include=python3", "bookworm")
SITE = "usr/local/lib/python3.11/dist-packages"  # on Debian's python3.11's sys.path
DISTRIBUTIONS = ("torch", "numpy")  # and what they require, as pip would have installed them
# Not needed at run time: headers and CMake files for C++ extensions, torch's own test binaries and libraries.
LEAVE_OUT = re.compile(r"(^|/)__pycache__/|^torch/(include|share|test)/|^torch/bin/(test_|protoc|\w+Test$)"
                       r"|^torch/lib/(lib\w*test\w*|libaoti_custom_ops|libbackend_with_compiler)\.so$|\.pyi$")
BASE_LEAVE_OUT = ("./dev/*", "./proc/*", "./sys/*", "./run/*", "./tmp/*", "./var/cache/apt/*", "./var/lib/apt/lists/*",
                  "./usr/share/doc/*", "./usr/share/man/*", "./usr/share/info/*", "./usr/share/locale/*")
TRAINER = REPO / "examples" / "workdir"
TRAINER_DIR = "opt/trainer"
INSTALL_HINT = "apt-get install debootstrap (tests/system_packages.py installs it as root)"
BUILD_TIMEOUT_S = 1200

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"


class ImageError(RuntimeError):
    """The image could not be built or pushed; the message says what failed and what to do."""


def _closure(names: tuple[str, ...] = DISTRIBUTIONS) -> list[metadata.Distribution]:
    """The distributions and their requirements (no extras), as installed in this interpreter, sorted by name."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        try:
            dist = found[key] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise ImageError(f"{name} is not installed in {sys.executable}: the trainer image copies it from there "
                             f"(pip install -e .[dev] installs it)") from None
        todo += [re.match(r"[A-Za-z0-9_.\-]+", r).group(0) for r in dist.requires or [] if "extra ==" not in r]
    return [found[k] for k in sorted(found)]


SCRIPTS = "../../../bin/"  # a RECORD's console scripts (torchrun, …), relative to the site folder


def _environment_files() -> list[tuple[str, Path]]:
    """(path in the image, file here) of every file of the environment layer: the packages under SITE, their console
    scripts under usr/local/bin."""
    files = []
    for dist in _closure():
        for f in dist.files or []:
            rel = str(f)
            if rel.startswith(SCRIPTS) and "/" not in rel[len(SCRIPTS):]:
                target = f"usr/local/bin/{rel[len(SCRIPTS):]}"
            elif rel.startswith("..") or rel.startswith("/") or LEAVE_OUT.search(rel):
                continue
            else:
                target = f"{SITE}/{rel}"
            path = Path(dist.locate_file(f))
            if path.is_file():
                files.append((target, path))
    return sorted(set(files))


@dataclass(frozen=True)
class Image:
    """A built image: its layer files (gzipped tars), their digests, the config and manifest, all in `folder`."""

    folder: Path

    def _meta(self) -> dict:
        return json.loads((self.folder / "image.json").read_text())

    @property
    def layers(self) -> list[dict]:
        return self._meta()["layers"]  # each: file, digest, size, diff_id

    @property
    def config(self) -> bytes:
        return (self.folder / "config.json").read_bytes()

    @property
    def manifest(self) -> bytes:
        return (self.folder / "manifest.json").read_bytes()

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()

    @property
    def size(self) -> int:
        return sum(layer["size"] for layer in self.layers)

    @property
    def timings(self) -> dict:
        return self._meta()["timings"]


def recipe() -> dict:
    """Everything the image is made of; its hash names the cache folder (change any and a fresh one is built)."""
    env = _environment_files()
    trainer = sorted(p for p in TRAINER.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return {
        "debootstrap": [*DEBOOTSTRAP, MIRROR], "base_leave_out": BASE_LEAVE_OUT, "site": SITE,
        "environment": [f"{d.metadata['Name']}=={d.version}" for d in _closure()],
        "environment_files": hashlib.sha256("\n".join(f"{rel} {p.stat().st_size}" for rel, p in env).encode()).hexdigest(),
        "trainer": {str(p.relative_to(TRAINER)): hashlib.sha256(p.read_bytes()).hexdigest() for p in trainer},
        "builder": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }


def image_dir() -> Path:
    return CACHE / ("bookworm-torch-" + hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:12])


def cached() -> Image | None:
    folder = image_dir()
    return Image(folder) if (folder / "manifest.json").is_file() else None


def _run(argv: list[str], log: Path, what: str, ok: tuple[int, ...] = (0,), **kwargs) -> None:
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(map(str, argv))}\n".encode())
        out.flush()
        try:
            code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=BUILD_TIMEOUT_S, **kwargs).returncode
        except subprocess.TimeoutExpired:
            code = None
    if code not in ok:
        why = f"ran past {BUILD_TIMEOUT_S} s" if code is None else f"exited with {code}"
        raise ImageError(f"{what} {why}; its log: {log}")


def _layer(tree: Path, out: Path, log: Path, exclude: tuple[str, ...] = ()) -> dict:
    """A reproducible gzipped tar of `tree`'s contents; its descriptor (digest of the gzip, diff id of the tar)."""
    # --xattrs makes it a pax archive: without the pax option its extended headers held each file's atime and
    # ctime and the packer's PID (PaxHeaders.PID), so no two builds had the same digests.
    tar = ["tar", "-C", str(tree), "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner",
           "--xattrs", "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
           *[f"--exclude={e}" for e in exclude], "-cf", "-", "."]
    with open(out, "wb") as dest, open(log, "ab") as err:
        producer = subprocess.Popen(tar, stdout=subprocess.PIPE, stderr=err)
        diff, packed = hashlib.sha256(), subprocess.Popen(["gzip", "-1", "-n"], stdin=subprocess.PIPE, stdout=dest)
        while chunk := producer.stdout.read(1 << 20):
            diff.update(chunk)
            packed.stdin.write(chunk)
        packed.stdin.close()
        if producer.wait() != 0 or packed.wait() != 0:
            raise ImageError(f"packing {tree} into a layer failed (tar {producer.returncode}, gzip "
                             f"{packed.returncode}); see {log}")
    digest = hashlib.sha256()
    with open(out, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return {"file": out.name, "digest": "sha256:" + digest.hexdigest(), "size": out.stat().st_size,
            "diff_id": "sha256:" + diff.hexdigest()}


def _debootstrap() -> str:
    """debootstrap's path; ImageError when it is missing or this is not root."""
    debootstrap = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.path.exists(p)), None)
    if debootstrap is None:
        raise ImageError(f"debootstrap is not installed: the trainer image's base is a Debian root made with it; "
                         f"{INSTALL_HINT}")
    if os.geteuid() != 0:
        raise ImageError("building the trainer image's base root needs root (debootstrap)")
    return debootstrap


def _base_root(debootstrap: str, partial: Path, log: Path, say: Callable[[str], None]) -> Path:
    root = partial / "root"
    say(f"debootstrap {' '.join(DEBOOTSTRAP)} from {MIRROR} (about a minute)")
    # dpkg in the chroot without its fsync per unpacked file (the root is packed into a layer, never booted as
    # it is; a build cut short is removed whole). The same files; on the loaded 2-core VM (2026-12-07) a plain and
    # an unsafe-io debootstrap run side by side took 144 s and 119 s (dpkg's phases 93 s and 70 s). DPKG_FORCE
    # replaces dpkg's default force flags: they are kept (downgrade, security-mac).
    env = {**os.environ, "DPKG_FORCE": "unsafe-io,downgrade,security-mac"}
    _run([debootstrap, *DEBOOTSTRAP, str(root), MIRROR], log, "debootstrap of the trainer image's base", env=env)
    return root


def _environment_tree(dest: Path, log: Path, say: Callable[[str], None]) -> None:
    files = _environment_files()
    names = ", ".join(f"{d.metadata['Name']} {d.version}" for d in _closure())
    say(f"copying {names} from {sys.executable} ({len(files)} files)")
    for rel, path in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        if rel.startswith("usr/local/bin/"):  # pip wrote this interpreter's path into the script: the image's python3
            lines = target.read_bytes().split(b"\n", 1)
            if lines[0].startswith(b"#!"):
                target.write_bytes(b"#!/usr/bin/python3\n" + (lines[1] if len(lines) > 1 else b""))
    say("compiling them to .pyc (once, so a container's first import of torch compiles nothing)")
    # -d: each .pyc names its source by its path in the image, not by this build's folder (which has the builder's
    # PID in it: no two builds' layers had the same digest).
    _run([sys.executable, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash",
          "-d", f"/{SITE}", str(dest / SITE)],
         log, "compiling the environment's .pyc", ok=(0, 1))  # 1: a file it cannot compile (torch's py312 tests)


def _trainer_tree(dest: Path, log: Path, say: Callable[[str], None]) -> None:
    shutil.copytree(TRAINER, dest / TRAINER_DIR, ignore=shutil.ignore_patterns("__pycache__", "build"))
    (dest / "usr/bin").mkdir(parents=True)
    (dest / "usr/bin/python").symlink_to("python3")


def build(say: Callable[[str], None] = lambda line: None) -> Image:
    """The cached image of the current recipe, built first if absent (a few minutes, once)."""
    import fcntl

    folder = image_dir()
    if (folder / "manifest.json").is_file():
        return Image(folder)
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second builder waits, then finds the first one's image
        if (folder / "manifest.json").is_file():
            return Image(folder)
        for stale in CACHE.glob(f"{folder.name}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
        partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
        partial.mkdir()
        log = folder.with_name(folder.name + ".build.log")
        log.write_bytes(b"")
        say(f"building the trainer image (a few minutes, once) into {folder}; log: {log}")
        try:
            timings, made = {}, {}
            started = time.monotonic()

            def layer(name: str, tree: Path, exclude: tuple[str, ...] = ()) -> None:
                say(f"packing the {name} layer")
                made[name] = {"name": name, **_layer(tree, partial / f"{name}.tar.gz", log, exclude)}

            def own_trees() -> None:  # the environment and trainer layers: no base needed
                for name, make in (("environment", _environment_tree), ("trainer", _trainer_tree)):
                    t0 = time.monotonic()
                    tree = partial / name
                    tree.mkdir()
                    make(tree, log, say)
                    layer(name, tree)
                    shutil.rmtree(tree)
                    timings[f"{name}_s"] = round(time.monotonic() - t0, 1)

            # Made while debootstrap downloads and unpacks (its waits on the mirror and the disk): side by side on
            # the 2-core VM (2026-12-07) the build took 125 s against 179 s one layer after the other.
            debootstrap = _debootstrap()
            with ThreadPoolExecutor(1) as pool:
                others = pool.submit(own_trees)
                root = _base_root(debootstrap, partial, log, say)
                timings["debootstrap_s"] = round(time.monotonic() - started, 1)
                t0 = time.monotonic()
                layer("base", root, BASE_LEAVE_OUT)
                timings["base_s"] = round(time.monotonic() - t0, 1)
                others.result()
            shutil.rmtree(root)
            layers = [made[name] for name in ("base", "environment", "trainer")]
            config = json.dumps({
                "architecture": "amd64", "os": "linux",
                "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                   "PYTHONUNBUFFERED=1"],
                           "WorkingDir": f"/{TRAINER_DIR}", "Cmd": ["python", "train.py"]},
                "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"] for layer in layers]},
            }, sort_keys=True).encode()
            manifest = json.dumps({
                "schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
                           "size": len(config)},
                "layers": [{"mediaType": OCI_LAYER_GZIP, "digest": layer["digest"], "size": layer["size"]}
                           for layer in layers],
            }, sort_keys=True).encode()
            timings["build_s"] = round(time.monotonic() - started, 1)
            (partial / "config.json").write_bytes(config)
            (partial / "image.json").write_text(json.dumps({"layers": layers, "timings": timings,
                                                            "recipe": recipe()}, indent=1))
            (partial / "manifest.json").write_bytes(manifest)
            partial.rename(folder)  # only a complete image ever has the cache's name
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    image = Image(folder)
    say(f"trainer image built in {timings['build_s']:.0f} s: {image.size / 1e6:.0f} MB in {len(layers)} layers")
    return image


def _request(method: str, url: str, body=None, headers: dict | None = None, timeout: float = 600):
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    with urllib.request.urlopen(req, timeout=timeout) as answer:
        return answer.status, answer.headers


def _has_blob(host: str, repo: str, digest: str) -> bool:
    try:
        return _request("HEAD", f"http://{host}/v2/{repo}/blobs/{digest}", timeout=30)[0] == 200
    except urllib.error.HTTPError:
        return False


def _upload(host: str, repo: str, digest: str, path: Path | None = None, data: bytes | None = None) -> None:
    _, headers = _request("POST", f"http://{host}/v2/{repo}/blobs/uploads/", timeout=30)
    location = headers["Location"]
    location = f"http://{host}{location}" if location.startswith("/") else location
    sep = "&" if "?" in location else "?"
    size = path.stat().st_size if path is not None else len(data)
    head = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
    if path is not None:
        with open(path, "rb") as body:
            _request("PUT", f"{location}{sep}digest={digest}", body, head)
    else:
        _request("PUT", f"{location}{sep}digest={digest}", data, head)


def push(image: Image, host: str, repo: str = "team/trainer", tag: str = "v1",
         say: Callable[[str], None] = lambda line: None) -> str:
    """Upload `image` to the registry at `host` (plain http, 127.0.0.1:PORT) as REPO:TAG; the pinned reference
    `HOST/REPO:TAG@sha256:HEX`. ImageError naming the registry when it refuses."""
    try:
        for layer in image.layers:
            if not _has_blob(host, repo, layer["digest"]):
                say(f"pushing the {layer['name']} layer ({layer['size'] / 1e6:.0f} MB) to {host}/{repo}")
                _upload(host, repo, layer["digest"], path=image.folder / layer["file"])
        config = image.config
        _upload(host, repo, "sha256:" + hashlib.sha256(config).hexdigest(), data=config)
        _request("PUT", f"http://{host}/v2/{repo}/manifests/{tag}", image.manifest,
                 {"Content-Type": OCI_MANIFEST}, timeout=60)
    except (urllib.error.URLError, OSError) as exc:
        raise ImageError(f"pushing the trainer image to the registry at {host} failed: {exc}; is it running "
                         f"(its log is in its folder)?") from None
    return f"{host}/{repo}:{tag}@{image.digest}"


if __name__ == "__main__":  # build it, print its figures (tests' start_building runs this in the background)
    try:
        built = build(lambda line: print(f"[trainer image] {line}", file=sys.stderr, flush=True))
    except ImageError as exc:
        print(f"[trainer image] {exc}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"folder": str(built.folder), "digest": built.digest, "size": built.size,
                      "layers": [{k: layer[k] for k in ("name", "size")} for layer in built.layers],
                      "timings": built.timings}))
