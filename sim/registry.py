"""Artifact Registry's stand-in for `respawn demo` (issue #47): Debian's `docker-registry` (the CNCF distribution
registry) serving plain http on a free 127.0.0.1 port, its storage and config in a folder of the run's, stopped by
its process group. The tests start theirs the same way (tests/registry_fixtures.py)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sim import emulators

BINARY = "/usr/bin/docker-registry"
INSTALL_HINT = "apt-get install docker-registry"


class RegistryError(RuntimeError):
    """The registry could not start; the message says why and what to do."""


@dataclass
class LocalRegistry:
    host: str  # 127.0.0.1:PORT, the references' registry part
    root: Path
    proc: subprocess.Popen

    def stop(self) -> None:
        emulators.stop_group(self.proc)


def start(root: Path, timeout: float = 30) -> LocalRegistry:
    """A registry on a free loopback port with its storage under `root`, once /v2/ answers."""
    if not Path(BINARY).exists():
        raise RegistryError(f"no {BINARY} (Artifact Registry's stand-in): {INSTALL_HINT}")
    root.mkdir(parents=True, exist_ok=True)
    port = emulators.free_port()
    config, log_path = root / "config.yml", root / "registry.log"
    config.write_text(json.dumps({  # JSON is YAML
        "version": 0.1, "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(root / "storage")}}, "http": {"addr": f"127.0.0.1:{port}"}}))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([BINARY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    registry = LocalRegistry(f"127.0.0.1:{port}", root, proc)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{registry.host}/v2/", timeout=2):
                return registry
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    registry.stop()
    raise RegistryError(f"docker-registry did not answer on {registry.host} (exit {proc.poll()}); see {log_path}")
