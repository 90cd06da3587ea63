"""The trainer's image on this node: pulled with the node's service account, once.

A boot stage (`prepare stage`, stage `image_pull`; goodput counts it in "starting up"), started first in the
preparation and run in a thread of its own, so that it overlaps the workdir's and the library's downloads
(preparation.py). Skipped when the runtime already has the image: a node restarted in place keeps the runtime's
storage (its disk), so only a new VM pulls.

Credentials: Artifact Registry (and Container Registry) take an OAuth access token as the password of the user
`oauth2accesstoken` (docs/gcp-facts.md, "Containers"). The agent gets the token from the metadata server
(`instance/service-accounts/default/token`, metadata.ServiceAccountToken) and writes it, for the registry of the
image only, into a Docker-format auth file in the node directory (`registry-auth/config.json`, mode 0600, rewritten
for each pull), which podman reads with `--authfile` and Docker through `DOCKER_CONFIG`. The token is never logged
nor on a command line. Only Google's registries get it (TOKEN_REGISTRIES); another registry is pulled without
credentials unless it is named in RESPAWN_REGISTRY_TOKEN_HOSTS (the sim's local registry).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import time
from typing import Callable, Mapping

from respawn.logs import log

from .container import Runtime, registry_host
from .metadata import TokenError
from .storage import Interrupted

AUTH_DIR = "registry-auth"  # in the node directory: config.json, 0600, in the Docker config format
AUTH_USER = "oauth2accesstoken"
# Registries that take the node's access token: Artifact Registry (LOCATION-docker.pkg.dev) and Container Registry.
TOKEN_REGISTRIES = (".pkg.dev", "gcr.io")
ENV_TOKEN_HOSTS = "RESPAWN_REGISTRY_TOKEN_HOSTS"  # the agent's environment: more hosts (comma-separated) that get it
PULL_TIMEOUT_S = 3600.0
STAGE = "image_pull"


class PullFailed(Exception):
    def __init__(self, command: list[str], message: str, *, exit_code: int | None = None, output_tail: str = ""):
        self.command, self.exit_code, self.output_tail = command, exit_code, output_tail or message
        super().__init__(message)


def takes_token(host: str, environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    extra = {h.strip() for h in env.get(ENV_TOKEN_HOSTS, "").split(",") if h.strip()}
    name = host.split(":", 1)[0]
    return host in extra or name == "gcr.io" or any(name.endswith(s if s.startswith(".") else "." + s)
                                                     for s in TOKEN_REGISTRIES)


def auth_json(host: str, token: str) -> str:
    """The Docker config format's credentials for `host`: user oauth2accesstoken, the token as the password."""
    auth = base64.b64encode(f"{AUTH_USER}:{token}".encode()).decode()
    return json.dumps({"auths": {host: {"auth": auth}}})


def write_auth(node_dir: str, host: str, token: str) -> str:
    """Write the auth file (mode 0600 from its creation, replaced whole); its path."""
    directory = os.path.join(node_dir, AUTH_DIR)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, "config.json")
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(auth_json(host, token))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def pull_argv(runtime: Runtime, image: str, auth_file: str | None) -> list[str]:
    if runtime.is_docker or auth_file is None:
        return [runtime.exe, "pull", image]
    return [runtime.exe, "pull", "--authfile", auth_file, image]


def pull_env(runtime: Runtime, env: Mapping[str, str], auth_file: str | None) -> dict[str, str]:
    e = dict(env)
    if runtime.is_docker and auth_file is not None:
        e["DOCKER_CONFIG"] = os.path.dirname(auth_file)
    return e


def present(runtime: Runtime, image: str, env: Mapping[str, str]) -> bool:
    """Whether the runtime's storage holds `image` (its digest) already."""
    try:
        return subprocess.run([runtime.exe, "image", "inspect", "--format", "{{.Id}}", image],
                              stdin=subprocess.DEVNULL, capture_output=True, env=dict(env), timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pull(runtime: Runtime, image: str, node_dir: str, env: Mapping[str, str], token: Callable[[], str], *,
         interrupted: Callable[[], bool] = lambda: False, timeout: float = PULL_TIMEOUT_S) -> bool:
    """Make `image` present: skipped when it is (False), pulled otherwise (True). PullFailed (one line naming the
    image and what to do) when it cannot be."""
    started = time.monotonic()
    if present(runtime, image, env):
        log("INFO", "prepare stage", stage=STAGE, skipped=True, reason="the image is on this disk already",
            image=image, runtime=runtime.name, seconds=round(time.monotonic() - started, 3))
        return False
    host = registry_host(image)
    auth_file = None
    if takes_token(host):
        try:
            auth_file = write_auth(node_dir, host, token())
        except TokenError as exc:
            raise PullFailed([runtime.exe, "pull", image], f"cannot pull {image}: {exc}") from None
    argv = pull_argv(runtime, image, auth_file)
    log("INFO", "pulling the trainer's image", image=image, runtime=runtime.name,
        credentials=f"{AUTH_USER} (the node's service account)" if auth_file else "none")
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=pull_env(runtime, env, auth_file), start_new_session=True)
    except OSError as exc:
        raise PullFailed(argv, f"cannot run {runtime.exe}: {exc}") from None
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(child.stdout.read() if child.stdout else b""), daemon=True)
    reader.start()
    while child.poll() is None:
        if interrupted() or time.monotonic() - started > timeout:
            child.kill()
            child.wait()
            if interrupted():
                raise Interrupted("image pull")
            raise PullFailed(argv, f"pulling {image} took longer than {timeout:.0f} s; check the node's network "
                                   "and the image's size")
        time.sleep(0.05)
    reader.join(5)
    tail = b"".join(out).decode("utf-8", errors="replace").strip()[-2000:]
    if child.returncode != 0:
        hint = ("the node's service account needs roles/artifactregistry.reader on the repository, and the reference "
                "must exist (respawn jobs register resolves it)") if auth_file else (
                "the registry must allow anonymous pulls, or host the image in Artifact Registry")
        raise PullFailed(argv, f"cannot pull {image} with {runtime.name} (exit {child.returncode}): "
                               f"{tail.splitlines()[-1] if tail else 'no output'}; {hint}",
                         exit_code=child.returncode, output_tail=tail)
    log("INFO", "prepare stage", stage=STAGE, image=image, runtime=runtime.name,
        seconds=round(time.monotonic() - started, 3))
    return True


class BackgroundPull(threading.Thread):
    """pull() in a thread; `result()` waits for it and raises what it raised."""

    def __init__(self, runtime: Runtime, image: str, node_dir: str, env: Mapping[str, str], token: Callable[[], str],
                 interrupted: Callable[[], bool]):
        super().__init__(name="image-pull", daemon=True)
        self.args = (runtime, image, node_dir, env, token)
        self.interrupted = interrupted
        self.error: BaseException | None = None
        self.pulled: bool | None = None

    def run(self) -> None:
        try:
            self.pulled = pull(*self.args, interrupted=self.interrupted)
        except BaseException as exc:  # handed to result()
            self.error = exc

    def result(self) -> bool:
        self.join()
        if self.error is not None:
            raise self.error
        return bool(self.pulled)
