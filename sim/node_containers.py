"""A sim node's container runtime (issue #47): rootful podman with runc, configured by files the node owns.

This kind of machine runs podman with runc only (crun fails on cgroups in hybrid mode, and setrlimit without
CAP_SYS_RESOURCE: ../shared/reference/local-testing.md), so each node gets, under `<node dir>/etc/containers/`:
- containers.conf: runtime runc, the cgroupfs manager, default ulimits the machine's hard limits allow, podman's
  temporary state in the node's /run;
- storage.conf: the image layers and containers on the node's disk (`<node dir>/containers/storage`: a restart in
  place keeps the pulled layers, a deleted VM loses them), the run state in the node's /run;
- registries.conf: the sim's registries reached over plain http (the local stand-in for Artifact Registry), each
  with its relay on the bridge as a mirror for a node in a network namespace of its own (its 127.0.0.1 is its own).
and the environment that points podman at them (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF,
CONTAINERS_REGISTRIES_CONF), the agent's runtime (RESPAWN_CONTAINER_RUNTIME=podman) and the registries that get the
node's token (RESPAWN_REGISTRY_TOKEN_HOSTS). A power-off takes the node's containers too (sim/nodes.py guest_pids:
conmon names the node's storage). The machine's /etc/containers is never read for these nor changed.

The node's /run (run_dir: a short path under /run, as podman needs), a tmpfs on a VM, is emptied at every boot, so
podman sees a reboot (its containers from before the power-off are stopped, not running) as it does on a VM.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str, str]]:
    """(file system type, options, mount point) of this machine's cgroup hierarchies (v1 and v2)."""
    found = []
    with open(mountinfo) as f:
        for line in f:
            mine, _, theirs = line.partition(" - ")
            fstype, _, superopts = theirs.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                options = ",".join(o for o in superopts.split(",") if o not in ("rw", "ro"))
                found.append((fstype, options, mine.split()[4]))
    return found


def netns_prefix() -> list[str]:
    """What a node in a network namespace of its own runs its boot command under (after `ip netns exec`, which
    gives it a mount namespace of its own with a fresh /sys, and so no cgroup hierarchy: runc fails with "no cgroup
    mount found in mountinfo"): the machine's cgroup hierarchies mounted again in that mount namespace alone (a
    mount of an existing hierarchy attaches to it; nothing of the machine's mounts changes), then exec."""
    steps = ["mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup"]
    for fstype, options, point in cgroup_mounts():
        if point.startswith("/sys/fs/cgroup/"):
            opts = f" -o {shlex.quote(options)}" if options else ""
            steps.append(f"mkdir -p {shlex.quote(point)} && mount -t {fstype}{opts} {fstype} {shlex.quote(point)}")
    return ["sh", "-c", " && ".join(steps) + ' && exec "$@"', "node-cgroups"]


# A node's /run: podman refuses a runroot longer than 50 characters (its cleanup after a container's exit fails,
# and `podman run` then waits for it for ever), so it is not in the node's directory, whose path can be long.
RUN_ROOT = Path("/run/respawn-sim")


def run_dir(node_dir: Path) -> Path:
    """The node's /run: RUN_ROOT/<12 hex of the node directory's path>."""
    return RUN_ROOT / hashlib.sha256(str(Path(node_dir).resolve()).encode()).hexdigest()[:12]


def forget(node_dir: Path) -> None:
    """A deleted node's /run goes with it."""
    shutil.rmtree(run_dir(node_dir), ignore_errors=True)


def _emptied(run: Path, wait_s: float = 10.0) -> None:
    """`run` made anew and empty, as a boot finds its tmpfs. A podman of the last boot may still write there for a
    moment (conmon's cleanup after a `run --rm`, late under load: seen once in CI, the directory back before the
    mkdir): removed again until it stays removed."""
    deadline = time.monotonic() + wait_s
    while True:
        shutil.rmtree(run, ignore_errors=True)
        try:
            run.mkdir(parents=True)
            return
        except FileExistsError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{run}, a sim node's /run, cannot be emptied: a process still writes there "
                                   "(stop the node's podman processes)") from None
            time.sleep(0.1)


# The highest limits runc can set here (higher ones fail with "error setting rlimit type 7/6").
ULIMITS = ("nofile=20000:20000", "nproc=32768:32768")


def _toml_list(items) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


@dataclass(frozen=True)
class NodeContainers:
    """What every node of a sim gets to run containers: `registries` (HOST:PORT) are reached over plain http."""

    registries: tuple[str, ...] = ()

    def prepare(self, node_dir: Path, reach: Callable[[str], str] | None = None) -> dict[str, str]:
        """At boot: the node's /run emptied, its configuration written; the environment that points podman at it.
        `reach` maps a registry's HOST:PORT on this machine to where the node reaches it (the sim's netns mode: its
        relay on the bridge), which registries.conf names as the registry's mirror: the image's reference (and the
        token's host) stay the registry's own, as on Google Cloud, and a pull by digest goes to the mirror."""
        etc, run = node_dir / "etc" / "containers", run_dir(node_dir)
        _emptied(run)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "containers.conf").write_text(
            "[containers]\n"
            f"default_ulimits = {_toml_list(ULIMITS)}\n"
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'events_logfile_path = "{run}/libpod/events.log"\n'
            f'tmp_dir = "{run}/libpod"\n')
        (etc / "storage.conf").write_text(
            "[storage]\n"
            'driver = "overlay"\n'
            f'graphroot = "{node_dir}/containers/storage"\n'
            f'runroot = "{run}/storage"\n')
        registries = ""
        for host in self.registries:
            registries += f'[[registry]]\nlocation = "{host}"\ninsecure = true\n'
            mirror = reach(host) if reach is not None else host
            if mirror != host:
                registries += f'[[registry.mirror]]\nlocation = "{mirror}"\ninsecure = true\n'

        (etc / "registries.conf").write_text(f"unqualified-search-registries = []\n{registries}")
        return {"CONTAINERS_CONF": str(etc / "containers.conf"),
                "CONTAINERS_STORAGE_CONF": str(etc / "storage.conf"),
                "CONTAINERS_REGISTRIES_CONF": str(etc / "registries.conf"),
                # The agent's runtime is podman here (a VM's Deep Learning image has Docker: node_agent/container.py),
                # and it hands the node's metadata token to the local registry as it does to Artifact Registry.
                "RESPAWN_CONTAINER_RUNTIME": "podman",
                "RESPAWN_REGISTRY_TOKEN_HOSTS": ",".join(self.registries)}
