"""The trainer in the user's own OCI image (NodeSettings.image, pinned by digest): which runtime runs it and the
command line it runs with. Pure but for `find_runtime` and `find_accelerator`, which look at the node.

The design: the container shares the node's process, IPC and network namespaces (`--pid=host`, `--ipc=host`,
`--network=host`) and the node directory is mounted at the same path. So the trainer's processes are the node's
processes: the savers register their host pids in the notice directory, and `contract.deliver_notice`, the run
marker in their environment (supervisor.RUN_MARKER, passed in) and the deadline's kill reach them exactly as they
reach a bare trainer's, whatever the image's entrypoint (an `sh -c` without exec, a launcher, an init). The agent
still starts the runtime's foreground client (`docker run`/`podman run`) under supervisor.py's wrapper, so the
container's exit status is the wrapper's, trainer.exit records it, and an agent restarted by SIGHUP adopts it like
any trainer; the container's name is in trainer.json, and after the deadline's kill `rm -f` of that name leaves
nothing of it.

Environment values never appear on the command line: each variable is passed by name (`--env NAME`), the runtime
reading its value from its own environment, which is the trainer's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from respawn.contract import StoreUri
from respawn.logs import log

RUNTIMES = ("docker", "podman")
# The agent's own environment: forces a runtime (`docker` or `podman`), as the sim's nodes do.
ENV_RUNTIME = "RESPAWN_CONTAINER_RUNTIME"
DOCKER_SOCKET = "/var/run/docker.sock"
GPU, TPU = "gpu", "tpu"

# Labels on every container the agent starts: an adopting agent, and a person, find a node's containers by them.
LABEL_JOB, LABEL_ATTEMPT, LABEL_ROLE = "respawn.job", "respawn.attempt", "respawn.role"
ROLE_TRAINER, ROLE_SETUP, ROLE_LIBRARY, ROLE_HELPER = "trainer", "setup", "library", "helper"

# Variables of the agent's environment the trainer needs inside the container too (the endpoints the sim points
# the node at; on a VM they are unset): the rest of the node's environment (PATH, HOME, …) is the image's own.
ENDPOINT_VARS = ("GCE_METADATA_HOST", "GCE_METADATA_ROOT", "GCE_METADATA_IP", "STORAGE_EMULATOR_HOST",
                 "RESPAWN_STORAGE_HOST", "FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "http_proxy",
                 "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")

RUNTIME_HINT = ("the job's trainer.image needs Docker or podman on the node image: use a Deep Learning VM image "
                "(Docker with the NVIDIA container toolkit) or a TPU VM runtime image (Docker), or install podman; "
                "or drop trainer.image and run the trainer on the VM's Python")

_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_.-]")


class RuntimeMissing(Exception):
    pass


@dataclass(frozen=True)
class Runtime:
    name: str  # "docker" or "podman"
    exe: str  # its executable

    @property
    def is_docker(self) -> bool:
        return self.name == "docker"


def find_runtime(environ: Mapping[str, str] | None = None, *, docker_socket: str = DOCKER_SOCKET) -> Runtime:
    """The node's container runtime: ENV_RUNTIME when set; else Docker where its daemon is up (Deep Learning VM,
    Container-Optimized OS, the TPU VM images), else podman where installed, else a docker CLI alone. Logged once.
    RuntimeMissing (one line: what to do) when there is none."""
    env = os.environ if environ is None else environ
    path = env.get("PATH", os.defpath)
    forced = env.get(ENV_RUNTIME, "").strip()
    if forced:
        if forced not in RUNTIMES:
            raise RuntimeMissing(f"{ENV_RUNTIME}={forced!r} names no runtime the agent drives ({', '.join(RUNTIMES)})")
        exe = shutil.which(forced, path=path)
        if exe is None:
            raise RuntimeMissing(f"{ENV_RUNTIME}={forced} but no {forced} on PATH={path}: {RUNTIME_HINT}")
        runtime, why = Runtime(forced, exe), f"{ENV_RUNTIME}"
    else:
        docker, podman = shutil.which("docker", path=path), shutil.which("podman", path=path)
        if docker and os.path.exists(docker_socket):
            runtime, why = Runtime("docker", docker), f"the Docker daemon's socket {docker_socket}"
        elif podman:
            runtime, why = Runtime("podman", podman), "podman installed, no Docker daemon"
        elif docker:
            runtime, why = Runtime("docker", docker), f"a docker CLI (no {docker_socket} yet)"
        else:
            raise RuntimeMissing(f"no container runtime on this node (neither docker nor podman on PATH={path}): "
                                 f"{RUNTIME_HINT}")
    log("INFO", "container runtime", runtime=runtime.name, executable=runtime.exe, chosen_by=why)
    return runtime


def find_accelerator(dev: str = "/dev") -> str | None:
    """GPU where the NVIDIA driver's devices are (`/dev/nvidia0`), TPU where a TPU VM's are (`/dev/accel0`: v2–v4;
    `/dev/vfio/0`…: v5e, v5p, v6e); None on a node without either (the sim's)."""
    if os.path.exists(os.path.join(dev, "nvidia0")) or os.path.exists(os.path.join(dev, "nvidiactl")):
        return GPU
    if os.path.exists(os.path.join(dev, "accel0")):
        return TPU
    try:
        if any(name.isdigit() for name in os.listdir(os.path.join(dev, "vfio"))):
            return TPU
    except OSError:
        pass
    return None


def container_name(job_id: str, attempt: int, worker: int = 0, role: str = ROLE_TRAINER) -> str:
    """A node's container of `role`: respawn-{role}-{job}-{attempt}[-w{worker}] (one trainer per node at a time)."""
    name = f"respawn-{role}-{job_id}-{attempt}" + (f"-w{worker}" if worker else "")
    return _NAME_CHARS.sub("_", name)


def forwarded_names(env: Mapping[str, str], base: Mapping[str, str]) -> list[str]:
    """The variables of the trainer's environment `env` that go into the container: what the agent set or changed
    over its own environment `base` (settings.env, the node contract's RESPAWN_*, a generation's rendezvous:
    MASTER_ADDR, PET_*, RANK, …, PYTHONUNBUFFERED, the library's PYTHONPATH), every RESPAWN_* (the run marker
    included), and the node's endpoints (ENDPOINT_VARS). Sorted."""
    names = {k for k, v in env.items() if base.get(k) != v}
    names |= {k for k in env if k.startswith("RESPAWN_")}
    names |= {k for k in ENDPOINT_VARS if k in env}
    names.discard(ENV_RUNTIME)
    return sorted(names)


@dataclass
class RunSpec:
    """One container: `argv` (after the image's entrypoint, which stays) in `image`, named `name`, labelled."""

    image: str
    argv: Sequence[str]
    name: str
    labels: Mapping[str, str]
    env_names: Sequence[str] = ()
    mounts: Sequence[str] = ()  # host paths, each mounted at the same path, read-write
    workdir: str | None = None
    accelerator: str | None = None  # GPU, TPU or None
    remove: bool = True  # --rm: nothing is left once it exits (the deadline's kill also removes it by name)
    extra: Sequence[str] = field(default_factory=tuple)


def run_argv(runtime: Runtime, spec: RunSpec) -> list[str]:
    """The runtime's foreground `run` command line for `spec`, on the node's pid, IPC and network namespaces."""
    argv = [runtime.exe, "run"]
    if spec.remove:
        argv.append("--rm")
    argv += ["--name", spec.name]
    for key in sorted(spec.labels):
        argv += ["--label", f"{key}={spec.labels[key]}"]
    # The node's namespaces: the savers' pids are the node's (the notice directory, deliver_notice, the kill), the
    # DataLoader workers' shared memory is the node's /dev/shm (no --shm-size cap), the network is the VM's (a
    # multi-node rendezvous, the metadata server, the peers' checkpoint port).
    argv += ["--pid=host", "--ipc=host", "--network=host"]
    for path in spec.mounts:
        argv += ["--volume", f"{path}:{path}"]
    if spec.workdir:
        argv += ["--workdir", spec.workdir]
    for name in spec.env_names:
        argv += ["--env", name]
    argv += accelerator_flags(runtime, spec.accelerator)
    argv += list(spec.extra)
    argv += [spec.image, *spec.argv]
    return argv


def accelerator_flags(runtime: Runtime, accelerator: str | None) -> list[str]:
    """GPUs: Docker's `--gpus all` (the NVIDIA container toolkit, as the Deep Learning VM images configure it);
    podman's CDI device `nvidia.com/gpu=all` (`nvidia-ctk cdi generate`). A TPU VM: `--privileged` (the TPU devices,
    /dev/accel* or /dev/vfio/*, and their memory locking), as Google's TPU container guide runs it with --net=host.
    docs/gcp-facts.md, "Containers"."""
    if accelerator == GPU:
        return ["--gpus", "all"] if runtime.is_docker else ["--device", "nvidia.com/gpu=all"]
    if accelerator == TPU:
        return ["--privileged"]
    return []


def remove_argv(runtime: Runtime, name: str) -> list[str]:
    """Stop and remove a container by name at once (SIGKILL), whether it runs or not."""
    return [runtime.exe, "rm", "--force", name] if runtime.is_docker else [runtime.exe, "rm", "--force", "--time",
                                                                             "0", name]


def exists_argv(runtime: Runtime, name: str) -> list[str]:
    """Exit status 0 while a container of that name exists (running or not)."""
    return [runtime.exe, "container", "inspect", "--format", "{{.Id}}", name]


def remove(runtime: Runtime, name: str, env: Mapping[str, str] | None = None, *, timeout: float = 30.0) -> bool:
    """`rm -f` the container `name`, then check that none is left. True when none is; one ERROR line otherwise."""
    e = dict(os.environ if env is None else env)
    try:
        subprocess.run(remove_argv(runtime, name), stdin=subprocess.DEVNULL, capture_output=True, env=e,
                       timeout=timeout)
        left = subprocess.run(exists_argv(runtime, name), stdin=subprocess.DEVNULL, capture_output=True, env=e,
                              timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        log("ERROR", "cannot remove the trainer's container; remove it by hand", container=name,
            command=" ".join(remove_argv(runtime, name)), error=str(exc) or repr(exc))
        return False
    if left:
        log("ERROR", "the trainer's container is still there after rm --force; remove it by hand", container=name,
            command=" ".join(remove_argv(runtime, name)))
    return not left


def labels(job_id: str, attempt: int, role: str) -> dict[str, str]:
    return {LABEL_JOB: job_id, LABEL_ATTEMPT: str(attempt), LABEL_ROLE: role}


def checkpoint_mount(checkpoint_uri: str) -> str | None:
    """A file:/// checkpoint store's directory (mounted at the same path); None for gs://."""
    path = StoreUri.parse(checkpoint_uri).local_path
    return None if path is None else path.rstrip("/") or "/"


def registry_host(image: str) -> str:
    """The registry part of a pinned reference (contract.IMAGE_PINNED: always explicit)."""
    return image.split("/", 1)[0]


def same_path_mounts(node_dir: str, checkpoint_uri: str, workdir: str | None) -> list[str]:
    """What the container sees of the node, each at its own path: the node directory (the local checkpoints, the
    status file, the notice directory, the rejoin file, the workdirs, the library), a file:/// store, a workdir
    elsewhere. A path inside another is not mounted twice."""
    paths = [os.path.abspath(node_dir)]
    for extra in (checkpoint_mount(checkpoint_uri), workdir):
        if extra:
            real = os.path.abspath(extra)
            if not any(real == p or real.startswith(p.rstrip("/") + "/") for p in paths):
                paths.append(real)
    return paths

