"""The pull stage of a trainer in an OCI image (issue #47 item 4) against the environment cache for the same
environment, in one run: `python -m bench.boot --image` (part of the boot benchmark).

The same environment both ways: the demo's trainer image (sim/trainer_image.py) carries torch 2.13.0 CPU, NumPy and
torch's requirements as its `environment` layer; the environment cache (trainer.cache, node_agent/envcache.py) of a
bare trainer carries exactly those trees (the layer unpacked: the site-packages and their scripts), archived by the
agent's own write_archive.

Per repeat, on a new sim node's disk (sim/node_containers.py: podman with runc, its storage on the node's disk):
  pull_fresh      `podman pull` of the pinned reference from the local registry (Artifact Registry's stand-in), as
                  the agent's image_pull stage runs it on a new VM: every layer downloaded, checked, unpacked
  pull_in_place   the same node restarted (its /run emptied, its disk kept): `podman image exists`, what the agent
                  asks before it would pull
  cache_download  the cache archive from the storage emulator (the JSON API's media download the agent's Fetcher
                  makes), with its sha256 as the restore checks it
  cache_unpack    envcache.unpack_archive into the node's disk (checked member by member, renamed into place)
  cache_restore   cache_download + cache_unpack: what a fresh node's restore costs instead of setup
Reported with the sizes (the image's compressed layers, the cache's uncompressed tar) and the one-off push.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable

STAGES = ("pull_fresh", "pull_in_place", "cache_download", "cache_unpack", "cache_restore")


class PullBenchError(RuntimeError):
    pass


def _podman(env: dict[str, str], *args: str) -> float:
    started = time.monotonic()
    r = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                       timeout=900)
    if r.returncode not in (0, 1) or (r.returncode == 1 and args[0] != "image"):
        raise PullBenchError(f"podman {' '.join(args)} exited with {r.returncode}: {r.stderr.strip()[-500:]}")
    return time.monotonic() - started


def _download(url: str, dest: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with urllib.request.urlopen(url, timeout=300) as answer, open(dest, "wb") as out:
        while chunk := answer.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return size, digest.hexdigest()


def measure(work: Path, storage, repeats: int, progress: Callable[[str], None]) -> dict:
    """`storage`: the run's storage emulator (sim.node_image.Storage). Returns the runs of every stage and the
    sizes."""
    from node_agent import envcache
    from sim import node_image, registry, trainer_image
    from sim.node_containers import NodeContainers

    if shutil.which("podman") is None:
        raise PullBenchError("the pull stage runs podman: apt-get install podman runc docker-registry")
    try:
        image = trainer_image.build(lambda line: progress(f"trainer image: {line}"))
    except trainer_image.ImageError as exc:
        raise PullBenchError(str(exc)) from None
    try:
        reg = registry.start(work / "registry")
    except registry.RegistryError as exc:
        raise PullBenchError(str(exc)) from None
    try:
        started = time.monotonic()
        ref = trainer_image.push(image, reg.host)
        push_s = time.monotonic() - started
        progress(f"pushed the trainer image ({image.size / 1e6:.0f} MB) to {reg.host} in {push_s:.1f} s")

        [layer] = [layer for layer in image.layers if layer["name"] == "environment"]
        tree = work / "environment"
        tree.mkdir()
        subprocess.run(["tar", "-xzf", str(image.folder / layer["file"]), "-C", str(tree)], check=True)
        trees = [str(tree / trainer_image.SITE), str(tree / "usr/local/bin")]
        archive = work / "envcache.tar"
        with open(archive, "wb") as out:
            counts = envcache.write_archive(trees, out)
        shutil.rmtree(tree)
        name = "bench/envcache/environment.tar"
        node_image.upload(storage, name, archive.read_bytes())
        cache_bytes = archive.stat().st_size
        archive.unlink()
        progress(f"environment cache of the same trees: {counts['files']} files, {cache_bytes / 1e6:.0f} MB "
                 f"(uncompressed tar), uploaded to the storage emulator")
        url = (f"{storage.url}/storage/v1/b/{urllib.parse.quote(storage.bucket, safe='')}/o/"
               f"{urllib.parse.quote(name, safe='')}?alt=media")

        runs: dict[str, list[float]] = {stage: [] for stage in STAGES}
        for i in range(repeats):
            node = work / f"pull-node-{i}"
            env = {**os.environ, **NodeContainers(registries=(reg.host,)).prepare(node)}
            progress(f"pull {i + 1}/{repeats}: a new VM pulls the image ...")
            runs["pull_fresh"].append(_podman(env, "pull", "--quiet", ref))
            env = {**os.environ, **NodeContainers(registries=(reg.host,)).prepare(node)}  # restarted in place
            runs["pull_in_place"].append(_podman(env, "image", "exists", ref))
            progress(f"pull {i + 1}/{repeats}: a new VM restores the environment cache instead ...")
            cache = node / "envcache"
            cache.mkdir()
            started = time.monotonic()
            size, _ = _download(url, cache / "archive.tar")
            runs["cache_download"].append(time.monotonic() - started)
            if size != cache_bytes:
                raise PullBenchError(f"the cache archive came back with {size} bytes, not {cache_bytes}")
            started = time.monotonic()
            envcache.unpack_archive(str(cache / "archive.tar"), [str(node / "restored" / "site"),
                                                                 str(node / "restored" / "bin")])
            runs["cache_unpack"].append(time.monotonic() - started)
            runs["cache_restore"].append(runs["cache_download"][-1] + runs["cache_unpack"][-1])
            progress(f"pull {i + 1}/{repeats}: pull {runs['pull_fresh'][-1]:.1f} s (in place "
                     f"{runs['pull_in_place'][-1]:.2f} s), cache restore {runs['cache_restore'][-1]:.1f} s")
            shutil.rmtree(node, ignore_errors=True)
        return {"runs": runs, "push_s": round(push_s, 3), "image_bytes": image.size,
                "image_layers": {layer["name"]: layer["size"] for layer in image.layers},
                "cache_bytes": cache_bytes, "cache_files": counts["files"], "reference": ref}
    finally:
        reg.stop()
