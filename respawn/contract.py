"""The node contract: what the control plane, the node agent and the trainer library agree on, defined once.

    control plane ── node metadata (ATTR_*, NodeSettings JSON) ──► node agent
    node agent ── trainer environment (ENV_*) ──► trainer (respawn.ckpt)
    trainer ── status file (TrainerStatus, read_status) and exit code (EXIT_*) ──► node agent
    node agent ── heartbeat (Heartbeat, in NODES_COLLECTION/heartbeat_id(node_name(job, attempt), worker)) ──► control plane
    Cloud TPU ── worker metadata (ATTR_WORKER_*, parse_worker_endpoints) ──► node agent (a multi-host slice)

Standard library only, and importable by the oldest Python a node image runs: all three sides import it.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import math
import os
import re
import signal
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Callable, Dict, List, Optional, Tuple, TypedDict

# ---- node metadata attributes (written by respawn.control.nodespec, read by respawn.agent.config) -------------

ATTR_JOB_ID = "respawn-job-id"
ATTR_ATTEMPT = "respawn-attempt"  # the node is named {job}-{attempt} (node_name below)
ATTR_PROJECT = "respawn-project"  # the project that holds Firestore
ATTR_SETTINGS = "respawn-settings"  # NodeSettings.to_json()
# Deployed artifacts, each "URI#sha256=HEX" (gs://… on Google Cloud, file:///… on the local stand-ins), checked
# against the digest after download:
ATTR_AGENT = "respawn-agent"  # the agent zipapp deploy/vm/startup.sh fetches and runs on the image's python3
ATTR_LIBRARY = "respawn-library"  # the respawn wheel the agent installs into the trainer's interpreter
ATTR_STARTUP = "startup-script"  # Compute Engine and Cloud TPU run this at every boot
# "True" on GPU VMs: older Deep Learning VM images installed the NVIDIA driver on first boot only when asked; the
# *-nvidia-580 families (the default) ship it, and images without the installer ignore the key (gcp-facts §9).
ATTR_INSTALL_NVIDIA_DRIVER = "install-nvidia-driver"
# Set by Cloud TPU itself on every TPU VM, one worker or many (each worker has its own metadata server), never by us:
# this worker's index, and every worker's address, worker 0 first, in one of two formats (parse_worker_endpoints):
# hostnames ("t1v-n-…-w-0,t1v-n-…-w-1") or name:uid:IP triples. A GPU VM or a node without them is a single host:
# worker 0 of 1.
ATTR_WORKER_NUMBER = "agent-worker-number"
ATTR_WORKER_ENDPOINTS = "worker-network-endpoints"
ATTR_ACCELERATOR_TYPE = "accelerator-type"  # e.g. v5litepod-16 (respawn.topology.tpu_hosts gives its workers)
# A member VM of a multi-node GPU job carries the membership it trains in (Generation.to_json(); "" until the first
# forms). The control plane rewrites it on every membership change (setMetadata); the agent waits on it and
# restarts its trainer for each new generation that names this node.
ATTR_GENERATION = "respawn-generation"
# A node created while the node it replaces still saves its emergency checkpoint (issue #25, "act on the notice"):
# Handover.to_json(). Its agent starts the trainer only once that node's final heartbeat says it stopped, or after
# `until` (the old VM is off by then whatever it did).
ATTR_HANDOVER = "respawn-handover"
# A flex-start node (scheduling.maxRunDuration): its run duration in seconds, counted from the VM's start. Its agent
# treats the end as a notice it knows in advance: the trainer commits an emergency checkpoint and stops before it,
# and the controller creates the next node (docs/gcp-facts.md §18).
ATTR_RUN_SECONDS = "respawn-run-seconds"
# A reservation-bound node (a calendar-mode reservation's VM, deleted at the reservation's end): that end, RFC 3339
# in UTC. Its agent acts on it as on ATTR_RUN_SECONDS's end, whatever the VM's boots since (docs/gcp-facts.md §26).
ATTR_RUN_ENDS_AT = "respawn-run-ends-at"
NOTICE_RUN_ENDING = "run-ending"  # the heartbeat's and the notice message's kind for that end
LABEL_JOB = "respawn-job"
LABEL_ATTEMPT = "respawn-attempt"
LABEL_SLOT = "respawn-slot"  # a member slot (0..nodes+spare_nodes-1); set only when the job has several slots
# Every label key Respawn writes on a node (respawn.control.nodespec.labels): a job's own labels may not use them,
# and must leave room for those a node of the job gets within the 64 a VM or TPU node may carry (gcp-facts §9).
RESPAWN_LABELS = (LABEL_JOB, LABEL_ATTEMPT, LABEL_SLOT)
MAX_NODE_LABELS = 64

# ---- the trainer's environment (set by the agent, read by respawn.ckpt) ----------------------------------------

ENV_JOB_ID = "RESPAWN_JOB_ID"
ENV_ATTEMPT = "RESPAWN_ATTEMPT"
ENV_CHECKPOINT_URI = "RESPAWN_CHECKPOINT_URI"  # where checkpoints must end up: gs://… or file:///…
ENV_LOCAL_CHECKPOINT_DIR = "RESPAWN_LOCAL_CHECKPOINT_DIR"  # the node's own disk, written first
ENV_STATUS_FILE = "RESPAWN_STATUS_FILE"  # where the trainer writes TrainerStatus
ENV_NOTICE_BUDGET = "RESPAWN_NOTICE_BUDGET_S"  # seconds from the notice to the emergency save's deadline
# Seconds a torch.distributed collective may block before it raises (the process groups respawn.ckpt makes and
# its examples' default group; respawn.ckpt.collective_timeout() reads it): a peer that vanished must end the
# survivors' trainers in minutes, not gloo's 30 (docs/checkpoint.md#collective-timeouts).
ENV_COLLECTIVE_TIMEOUT = "RESPAWN_COLLECTIVE_TIMEOUT_SECONDS"
# Where this node stands among the job's hosts: one process group per host, like torchrun's --node_rank/--nnodes/
# --master_addr and jax.distributed's process_id/num_processes/coordinator. Named for hosts in general, not TPU
# workers: the multi-node GPU generations set the same three. Always set; a single host is rank 0 of 1 with
# master 127.0.0.1 (SINGLE_HOST_MASTER_ADDR), so a trainer needs no branch for the single-host case.
ENV_NODE_RANK = "RESPAWN_NODE_RANK"  # this host's index: a TPU worker's agent-worker-number
ENV_NUM_NODES = "RESPAWN_NUM_NODES"  # hosts in the job: a TPU slice's workers
ENV_MASTER_ADDR = "RESPAWN_MASTER_ADDR"  # host 0's IP address or hostname (the coordinator runs there)
SINGLE_HOST_MASTER_ADDR = "127.0.0.1"
ENV_GENERATION = "RESPAWN_GENERATION"  # a multi-node member: the generation's number (unset otherwise)
# torchrun reads each of its options from PET_<OPTION> when its command line does not give it
# (torch/distributed/argparse_util.py, the `env` action; --rdzv-backend defaults to static), so a member's command
# stays `torchrun --nproc-per-node 8 train.py` in every generation.
TORCHRUN_MASTER_PORT = 29500  # torchrun's own default --master-port: the generations' ports start there
# What a member's agent connects to on its generation's master to tell it reachable (an answer, even a refusal, is
# one; silence or no route is none).
MASTER_PROBE_PORT = TORCHRUN_MASTER_PORT


def torchrun_env(node_rank: int, nnodes: int, master_addr: str, port: int) -> Dict[str, str]:
    """The PET_* variables that give torchrun one generation's static ranks and its port (generation_port)."""
    return {"PET_NNODES": str(nnodes), "PET_NODE_RANK": str(node_rank), "PET_MASTER_ADDR": master_addr,
            "PET_MASTER_PORT": str(port)}


# A trainer started without torchrun (one process per node) joins its generation with torch's own variables
# (init_process_group's env://). Each generation has a port of its own, torchrun's and env://'s: the previous one's
# rendezvous server may still run as the next generation meets (a master's torchrun given its notice budget to stop,
# a process that rejoins (REJOIN_FILE) until the objects built on that process group are freed), and a member that
# met it there waited out the store's 300 s. MASTER_PORT in the job's env moves the ports' base (GENERATION_PORTS of
# them from there); a torchrun command that gives --master-port keeps that one port in every generation.
GENERATION_PORTS = 100


def generation_port(number: int, base: int = TORCHRUN_MASTER_PORT) -> int:
    return base + number % GENERATION_PORTS


def torch_env(node_rank: int, nnodes: int, master_addr: str, port: int) -> Dict[str, str]:
    """torch.distributed's env:// variables for one process per node (torchrun sets its workers' own over these)."""
    return {"MASTER_ADDR": master_addr, "MASTER_PORT": str(port), "RANK": str(node_rank), "WORLD_SIZE": str(nnodes),
            "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


# In-process rejoin (issue #25, "survivors keep their processes"): a member's trainer that runs TrainingLoop with
# on_rejoin, one process per node, says so in its status file (`rejoin`: one of REJOIN_STATES) and is not restarted
# for a generation of new members: the agent writes the generation into REJOIN_FILE (Rejoin) and sends REJOIN_SIGNAL
# to the status file's pid; the trainer stops at its next step boundary as on a notice, leaves its process group,
# writes the new number in its status (`generation`: the agent's acknowledgement) and joins the new world.
ENV_REJOIN_FILE = "RESPAWN_REJOIN_FILE"
REJOIN_FILE = "rejoin.json"
REJOIN_SIGNAL = "SIGUSR1"
# ready: trains in its generation and can leave it; waiting: left it (a peer's notice stopped its world) and waits
# for the next; joining: joining the generation its status names.
REJOIN_READY, REJOIN_WAITING, REJOIN_JOINING = "ready", "waiting", "joining"
REJOIN_STATES = (REJOIN_READY, REJOIN_WAITING, REJOIN_JOINING)


@dataclass(frozen=True)
class Rejoin:
    """REJOIN_FILE: the generation handed to a running trainer and the environment a new process would get in it."""

    generation: int
    env: Dict[str, str]

    def to_json(self) -> str:
        return json.dumps({"generation": self.generation, "env": self.env}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Rejoin":
        try:
            data = json.loads(text)
            number, env = data["generation"], data["env"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{REJOIN_FILE} is not {{generation, env}} JSON ({exc}): {text[:200]!r}") from None
        if isinstance(number, bool) or not isinstance(number, int) or number < 1 or not isinstance(env, dict) or \
                not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError(f"{REJOIN_FILE} needs a positive generation and string env values: {text[:200]!r}")
        return cls(number, dict(env))


def read_rejoin(path: str) -> Optional[Rejoin]:
    """The generation handed over at `path`, or None while there is none (or it is not complete yet)."""
    try:
        with open(path) as f:
            return Rejoin.from_json(f.read())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Generation:
    """One membership of a multi-node job's training world (ATTR_GENERATION): members are node names in node-rank
    order, members[0] the master, whose address is master_addr. `number` grows by one with every change.
    `handover`: members of the previous generation that left it during their notice and may still be saving their
    emergency checkpoint; a member that starts a new trainer in this one waits for them first (as ATTR_HANDOVER)."""

    number: int
    members: Tuple[str, ...]
    master_addr: str
    handover: Tuple["Handover", ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.members)

    def node_rank(self, node: str) -> int:
        """This node's rank; ValueError for a node that is not a member."""
        try:
            return self.members.index(node)
        except ValueError:
            raise ValueError(f"{node} is not a member of generation {self.number} ({', '.join(self.members)})") from None

    def to_json(self) -> str:
        data: Dict[str, Any] = {"number": self.number, "members": list(self.members), "master_addr": self.master_addr}
        if self.handover:
            data["handover"] = [{"node": h.node, "until": h.until} for h in self.handover]
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Generation":
        """Parse and check ATTR_GENERATION; ValueError names what is wrong."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{ATTR_GENERATION} is not JSON ({exc}): {text[:200]!r}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{ATTR_GENERATION} must be a JSON object, got {text[:200]!r}")
        number, members, master = data.get("number"), data.get("members"), data.get("master_addr")
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ValueError(f"{ATTR_GENERATION}.number must be a positive integer, got {number!r}")
        if (not isinstance(members, list) or not members or not all(isinstance(m, str) and m for m in members)
                or len(set(members)) != len(members)):
            raise ValueError(f"{ATTR_GENERATION}.members must be a non-empty list of distinct node names, "
                             f"got {members!r}")
        try:
            ipaddress.ip_address(master)
        except ValueError:
            raise ValueError(f"{ATTR_GENERATION}.master_addr must be an IP address, got {master!r}") from None
        handover = data.get("handover") or []
        try:
            leaving = tuple(Handover(str(h["node"]), str(h["until"])) for h in handover)
        except (KeyError, TypeError):
            raise ValueError(f"{ATTR_GENERATION}.handover must be a list of {{node, until}}, got {handover!r}") from None
        return cls(number, tuple(members), master, leaving)

# ---- exit codes --------------------------------------------------------------------------------------------

# EX_TEMPFAIL for both: "not finished, run me again".
EXIT_PREEMPTED = 75  # the trainer stopped on a notice, and its emergency checkpoint of the step it reached committed
# The trainer stopped on a notice without that checkpoint (its save failed, was abandoned at the deadline, or a rank
# never began it): not finished either, but the restart resumes from an older step (docs/checkpoint.md, exit codes).
EXIT_NOTICE_UNSAVED = 76
EXITS_ON_NOTICE = (EXIT_PREEMPTED, EXIT_NOTICE_UNSAVED)
EXIT_AGENT_DETACH = 75  # the agent after SIGHUP: systemd (Restart=on-failure) starts a new agent, which adopts the trainer
EXIT_CONFIG_ERROR = 2  # the agent cannot read its configuration (metadata attributes, node directory)


def exit_on_notice(committed: bool) -> int:
    """A trainer's exit code after the notice: whether its emergency checkpoint of the step it reached committed."""
    return EXIT_PREEMPTED if committed else EXIT_NOTICE_UNSAVED

# ---- files in the node directory (the agent's RESPAWN_NODE_DIR) ----------------------------------------------

STATUS_FILE = "status.json"
NOTICE_DIR = "notice"  # the run's savers (below); emptied for each trainer run
LOCAL_CHECKPOINT_DIR = "checkpoints"
WORKDIRS_DIR = "workdirs"  # workdirs/sha256-HEX/: the user's code, unpacked once per content digest

# ---- checkpoints read from a peer (issue #25: a replacement restores from a survivor) -------------------------

# A checkpoint's layout as the agent must know it to serve one (respawn.ckpt.format writes it): a step directory,
# its manifest (the data files' names, sizes and checksums) and the marker that commits it, written last.
CHECKPOINT_STEP_RE = re.compile(r"^step_(\d{12})$")
CHECKPOINT_MANIFEST = "manifest.json"
CHECKPOINT_MARKER = "COMMITTED"


def committed_files(step_dir: str) -> Optional[Dict[str, Any]]:
    """The files {name: {size, checksum}} a committed step directory's manifest lists; None where the directory
    holds no marker (a torn or in-progress save: respawn.ckpt.commit.seal writes it last) or no readable manifest.
    The agent's reading of a step (node_agent/peers.py); the trainer also checks the manifest against the marker."""
    if not os.path.isfile(os.path.join(step_dir, CHECKPOINT_MARKER)):
        return None
    try:
        with open(os.path.join(step_dir, CHECKPOINT_MANIFEST)) as f:
            files = json.load(f).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return files if isinstance(files, dict) else None
# A multi-node member's agent serves the committed steps in its LOCAL_CHECKPOINT_DIR, read-only, on its own address
# at PEER_PORT (node_agent/peers.py); a trainer reads the newest committed step from the agents in ENV_PEERS before
# Cloud Storage, every byte checked against the store's manifest (respawn.ckpt.peers). Below torchrun's ports
# (TORCHRUN_MASTER_PORT and the GENERATION_PORTS above it) so no generation's rendezvous takes it; the job's
# firewall rule admits every port between its nodes (docs/deploy.md).
PEER_PORT = 29400
ENV_PEER_PORT = "RESPAWN_PEER_PORT"  # the agent's own environment: another port (tests run agents side by side)
ENV_PEERS = "RESPAWN_PEERS"  # the trainer's: "host:port,…" of the agents holding committed steps ("" or unset: none)


def peer_endpoint(address: str, port: int) -> str:
    """One ENV_PEERS entry: host:port, an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def parse_peers(text: str) -> List[Tuple[str, int]]:
    """ENV_PEERS → [(host, port)]; ValueError names an entry that is not host:port."""
    out: List[Tuple[str, int]] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{ENV_PEERS} entry {entry!r} is not host:port")
        out.append((host, int(port)))
    return out

# ---- node settings -----------------------------------------------------------------------------------------

DEFAULT_HEARTBEAT_SECONDS = 15.0
DEFAULT_NOTICE_BUDGET_SECONDS = 25.0  # of a Spot VM's 30 s notice, leaving time for the final heartbeat
# After the soft-off a VM has at most this long before it is powered off (docs/gcp-facts.md §3); a Spot VM created
# with a preemption notice duration (JobSpec.notice_seconds, §17) gets that notice before the soft-off.
SOFT_OFF_SECONDS = 30.0
DEFAULT_METADATA_WAIT_SECONDS = 60.0  # one hanging GET on the metadata server before it is re-issued
DEFAULT_INTERPRETER = "python3"  # the image's own, found on PATH
# One setup command may run this long before it is stopped and the job fails: a hung `pip install` must not hold a
# paid node forever (the node heartbeats "preparing", so the controller sees it alive).
DEFAULT_SETUP_TIMEOUT_SECONDS = 3600.0

# ---- store URIs -----------------------------------------------------------------------------------------------

STORE_SCHEMES = ("gs://", "file:///")  # what StoreUri.parse accepts: Cloud Storage, or a local directory (local runs)
CHECKPOINT_SCHEMES = STORE_SCHEMES
WORKDIR_SCHEMES = STORE_SCHEMES
STORE_URI_SHAPES = "gs://BUCKET/PREFIX, or file:///ABSOLUTE/PATH for local runs"


@dataclass(frozen=True)
class StoreUri:
    """Where checkpoints, logs and workdir archives are: gs://BUCKET/PATH (Cloud Storage) or file:///PATH (a local
    directory: local runs, the demo). The one parser of such URIs; str() gives the canonical text back (the text
    parsed, except that a bare bucket's trailing slash goes: gs://b/ is gs://b).

    scheme: GS or FILE. bucket: the Cloud Storage bucket (GS), "" for FILE. path: for GS the object name or prefix
    below the bucket as written ("" for the bucket itself; a trailing / is kept, as a listing prefix needs it); for
    FILE the absolute path. Only the structure is checked: Cloud Storage's bucket naming rules are the job spec's
    (respawn.schema), so a node or a test may use any non-empty bucket name."""

    GS = "gs"
    FILE = "file"

    scheme: str
    bucket: str
    path: str

    def __post_init__(self) -> None:
        problem = _store_uri_problem(self.scheme, self.bucket, self.path)
        if problem:
            raise ValueError(f"{self!r} {problem}")  # built from parts, not parsed: name the parts

    @classmethod
    def parse(cls, text: Any) -> "StoreUri":
        """gs://BUCKET[/PATH] or file:///PATH → its StoreUri; ValueError (one line naming `text` and what a valid
        URI looks like) for anything else: another scheme, no bucket, a relative file:// path, a non-string."""
        scheme = bucket = path = ""
        if isinstance(text, str) and text.startswith("gs://"):
            scheme = cls.GS
            bucket, _, path = text[len("gs://"):].partition("/")
        elif isinstance(text, str) and text.startswith("file://"):
            scheme, path = cls.FILE, text[len("file://"):]
        problem = _store_uri_problem(scheme, bucket, path)
        if problem:
            raise ValueError(f"{text!r} {problem}")
        return cls(scheme, bucket, path)

    @property
    def local_path(self) -> Optional[str]:
        """A file:/// URI's path, as written; None for gs://."""
        return self.path if self.scheme == self.FILE else None

    def join(self, child: str) -> "StoreUri":
        """The URI of `child` (a name, or names joined by /) below this one: one / between them, whatever this
        one ends with."""
        base = self.path.rstrip("/")
        return StoreUri(self.scheme, self.bucket, f"{base}/{child}" if base or self.scheme == self.FILE else child)

    def __str__(self) -> str:
        if self.scheme == self.FILE:
            return "file://" + self.path
        return f"gs://{self.bucket}/{self.path}" if self.path else f"gs://{self.bucket}"


def _store_uri_problem(scheme: str, bucket: str, path: str) -> str:
    """What is wrong with these parts of a StoreUri, for the end of a message naming the URI; "" if nothing."""
    if scheme == StoreUri.GS:
        if not bucket:
            return "names no bucket: expected gs://BUCKET/PREFIX"
        if "/" in bucket:
            return "has a / in its bucket name: expected gs://BUCKET/PREFIX"
        return ""
    if scheme == StoreUri.FILE:
        if bucket:
            return "has a bucket: a file:/// URI names a local path"
        if not path.startswith("/"):
            return "is not an absolute path: expected file:///ABSOLUTE/PATH (three slashes)"
        return ""
    return f"is not a store URI: expected {STORE_URI_SHAPES}"


# A workdir archive is named by its content: .../sha256-<64 hex>.tar.gz (respawn.app.workdir packs it).
WORKDIR_SUFFIX = ".tar.gz"


def workdir_digest(uri: str) -> str:
    """The sha256 a workdir archive's name promises; SettingsError if the URI is not a content-addressed archive."""
    name = uri.rsplit("/", 1)[-1]
    digest = ""
    if name.startswith("sha256-") and name.endswith(WORKDIR_SUFFIX):
        digest = name[len("sha256-"):-len(WORKDIR_SUFFIX)]
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise SettingsError(
            f"workdir must name a content-addressed archive …/sha256-<64 hex>{WORKDIR_SUFFIX}, got {uri!r}")
    return digest


# The environment cache (trainer.cache; node_agent/envcache.py): what setup produced, archived by the first node
# whose setup ran and restored instead of setup by later fresh nodes with the same inputs. Under the job's
# checkpoint_uri (the node identity may write there, nowhere else): ENV_CACHE_DIR/<key>/<id>.tar, then
# ENV_CACHE_DIR/<key>.json, the manifest, written last (it commits the archive, as a checkpoint's marker does).
ENV_CACHE_DIR = ".respawn-env"
# The heartbeat's env_cache.state: restoring → restored | miss (no archive: setup runs) | fallback (one that failed
# to download, verify or unpack: setup runs); after setup ran: uploading → ready | upload-failed | upload-stopped
# (a notice); ready also when another node's archive was there already.
ENV_CACHE_STATES = ("restoring", "restored", "miss", "fallback", "uploading", "ready", "upload-failed",
                    "upload-stopped")
HOME_PREFIX = "~/"  # a cache path under the trainer's HOME


def env_cache_uri(checkpoint_uri: str) -> str:
    return checkpoint_uri.rstrip("/") + "/" + ENV_CACHE_DIR



# Per-attempt logs (node_agent/logship.py writes them, `respawn jobs logs` reads them, the controller's sweep deletes
# expired ones): under the job's checkpoint_uri, the one place its node identity may write (docs/architecture.md,
# "Isolation between jobs"), so a node never writes another job's logs. One object per chunk:
#   {checkpoint_uri}/LOGS_DIR/{attempt:06d}/{host}/{stream}/{offset:015d}.log
# host = heartbeat_id(node, worker); offset = where the chunk starts in that host's stream file. Names sort in the
# order written (zero-padded), one prefix lists an attempt, and a chunk re-sent by a restarted agent from the same
# offset replaces the earlier one (a superset of its bytes) instead of repeating them.
LOGS_DIR = ".respawn-logs"
LOG_STREAMS = ("setup", "trainer", "agent")  # setup commands' output, the trainer's, the agent's own JSON lines
LOG_FLUSH_SECONDS = 5.0  # a chunk at least this often while a stream grows…
LOG_CHUNK_BYTES = 256 * 1024  # …or as soon as this much is waiting; and never a bigger chunk
# The last chunk after a notice is sent once the emergency save and the final heartbeat are done, for at most this
# long: a Spot VM has 30 s in all, and what the save needs comes first.
LOG_FINAL_FLUSH_S = 2.0
LOG_RETENTION_DAYS = 30  # JobSpec.logs.retention_days's default
_LOG_CHUNK = re.compile(r"(\d{6})/([A-Za-z0-9-]+)/([a-z]+)/(\d{15})\.log")


@dataclass(frozen=True)
class LogChunk:
    attempt: int
    host: str  # heartbeat_id: the node, or {node}-w{i} for worker i of a multi-host slice
    stream: str
    offset: int

    def name(self) -> str:
        """The object's name below logs_uri(checkpoint_uri)."""
        return f"{log_attempt_prefix(self.attempt)}{self.host}/{self.stream}/{self.offset:015d}.log"

    @staticmethod
    def parse(name: str) -> "Optional[LogChunk]":
        """A name below logs_uri(...) back into its parts; None for anything else."""
        m = _LOG_CHUNK.fullmatch(name)
        if m is None or m.group(3) not in LOG_STREAMS:
            return None
        return LogChunk(int(m.group(1)), m.group(2), m.group(3), int(m.group(4)))


def log_labels(job_id: str, attempt: int, node: str, rank: Optional[int]) -> Dict[str, Optional[str]]:
    """The labels of every line the agent logs (respawn.logs.set_labels → Cloud Logging's entry labels): the job, the
    attempt, the host (heartbeat_id) and its rank (a slice's worker; a member's rank in its generation; None until a
    generation gives it one). Underscores, not the VM labels' hyphens: a Logging filter then needs no quotes
    (labels.respawn_job="JOB")."""
    return {"respawn_job": job_id, "respawn_attempt": str(attempt), "respawn_node": node,
            "respawn_rank": None if rank is None else str(rank)}


def log_attempt_prefix(attempt: int) -> str:
    """The names of one attempt's chunks below logs_uri() start with this."""
    return f"{attempt:06d}/"


def logs_uri(checkpoint_uri: str, attempt: Optional[int] = None) -> str:
    """Where a job's logs are (with a trailing /), or one attempt's."""
    base = checkpoint_uri.rstrip("/") + "/" + LOGS_DIR + "/"
    return base if attempt is None else base + log_attempt_prefix(attempt)
def check_cache_paths(paths: Any) -> Tuple[str, ...]:
    """trainer.cache → its paths, normalised: relative to the workdir (`.venv`) or to the trainer's HOME
    (`~/.cache/pip`); SettingsError naming the path otherwise. Absolute paths are refused (the image's own
    directories are the image's, not setup's), as are `..`, the workdir or HOME itself, and two paths of which one
    holds the other (restored twice)."""
    if isinstance(paths, (str, bytes)) or not isinstance(paths, (list, tuple)):
        raise SettingsError('cache must be a list of paths, e.g. [".venv", "~/.cache/pip"]')
    out: List[str] = []
    for raw in paths:
        if not isinstance(raw, str) or not raw.strip() or "\0" in raw:
            raise SettingsError(f"cache: {raw!r} is not a path")
        home = raw == "~" or raw.startswith(HOME_PREFIX)
        if raw.startswith("/"):
            raise SettingsError(f"cache: {raw!r} is absolute; name a path in the workdir (.venv) or under the "
                                "trainer's HOME (~/.cache/pip): the image's own directories are not cached")
        if raw.startswith("~") and not home:
            raise SettingsError(f"cache: {raw!r}: only the trainer's own HOME (~/…) is known, not another user's")
        parts = [p for p in raw[1 if home else 0:].split("/") if p not in ("", ".")]
        if ".." in parts:
            raise SettingsError(f"cache: {raw!r} climbs out with '..'; name the path inside the workdir or HOME")
        if not parts:
            raise SettingsError(f"cache: {raw!r} is the {'HOME directory' if home else 'workdir'} itself; name "
                                "what setup writes into it (.venv, ~/.cache/pip)")
        out.append((HOME_PREFIX if home else "") + "/".join(parts))
    for i, a in enumerate(out):
        for b in out[i + 1:]:
            if a == b or b.startswith(a + "/") or a.startswith(b + "/"):
                raise SettingsError(f"cache: {a!r} and {b!r} overlap; name each directory once")
    return tuple(out)


def split_artifact(value: str) -> Tuple[str, str]:
    """"URI#sha256=HEX" (ATTR_AGENT, ATTR_LIBRARY) → (URI, HEX); ValueError naming what is wrong."""
    uri, sep, fragment = value.strip().partition("#sha256=")
    if not sep or len(fragment) != 64 or any(c not in "0123456789abcdef" for c in fragment):
        raise ValueError(f"expected URI#sha256=<64 lowercase hex>, got {value!r}")
    try:
        StoreUri.parse(uri)
    except ValueError:
        raise ValueError(f"expected a gs:// or file:/// URI, got {uri!r}") from None
    return uri, fragment


_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")  # RFC 1123: 1-63 characters


def _is_hostname(name: str) -> bool:
    """An RFC 1123 host name (dot-separated labels of letters, digits and inner hyphens; 253 characters at most)."""
    return 0 < len(name) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


def parse_worker_endpoints(value: str) -> List[str]:
    """ATTR_WORKER_ENDPOINTS → every worker's address, worker 0 first: a hostname or an IP address, either of which
    a trainer can connect to (the master address). Each comma-separated entry is a hostname or IP address (the
    current format) or name:uid:IP (the older one; the IP is taken), as JAX reads it (gcp-facts §13; the sim
    serves both: sim.tpu.format_worker_endpoints). Strict: ValueError naming the
    entry when it is empty, has two or more than three fields, or its address is neither an IP address nor an
    RFC 1123 hostname."""
    addresses = []
    for i, entry in enumerate(value.strip().split(",")):
        entry = entry.strip()
        fields = entry.split(":")
        if len(fields) == 1 and _is_hostname(entry):  # a dotted IPv4 address is a valid hostname too
            addresses.append(entry)
            continue
        if len(fields) == 3 and fields[0] and fields[1]:
            try:
                addresses.append(str(ipaddress.ip_address(fields[2])))
                continue
            except ValueError:
                pass
        raise ValueError(f"entry {i} ({entry!r}) is neither a hostname nor name:uid:IP; expected every worker, "
                         f"worker 0 first, comma-separated, as hostnames (t1v-n-…-w-0,t1v-n-…-w-1,…) or as "
                         f"name:uid:IP triples (t1v-n-…-w-0:UID:10.0.0.2,…), got {value!r}")
    return addresses


class SettingsError(ValueError):
    """A NodeSettings value is invalid; the message names the key."""


def _seconds(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SettingsError(f"{key} must be a positive number of seconds, got {value!r}")
    return float(value)


_DATABASE_ID = re.compile(r"^[a-z][a-z0-9-]{2,61}[a-z0-9]$")  # Firestore's rule for a named database's id


# An OCI image reference pinned by digest, as nodes receive it: REGISTRY/PATH[:TAG]@sha256:HEX (a tag, when kept,
# is for people; the digest decides what runs).
IMAGE_PINNED = re.compile(r"^[a-z0-9][a-z0-9.-]*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+"
                          r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?@sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class NodeSettings:
    """What a node runs and how: metadata attribute ATTR_SETTINGS. The writer (to_json) and the validator
    (from_json, and construction) are this one class; unknown keys are ignored so an older agent accepts the
    settings of a newer control plane."""

    command: Tuple[str, ...]
    checkpoint_uri: str
    env: Dict[str, str] = field(default_factory=dict)
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    notice_budget_seconds: float = DEFAULT_NOTICE_BUDGET_SECONDS
    # Of notice_budget_seconds, the VM's notice before its soft-off (JobSpec.notice_seconds): after a soft-off the
    # save has notice_budget_seconds - notice_seconds left, whenever the soft-off comes.
    notice_seconds: float = 0.0
    metadata_wait_seconds: float = DEFAULT_METADATA_WAIT_SECONDS
    workdir: Optional[str] = None  # the user's code: a content-addressed archive (workdir_digest), unpacked as cwd
    setup: Tuple[Tuple[str, ...], ...] = ()  # argv commands run in the workdir once per node life, before the trainer
    interpreter: str = DEFAULT_INTERPRETER  # runs the trainer (a command's leading python/python3) and the library
    setup_timeout_seconds: float = DEFAULT_SETUP_TIMEOUT_SECONDS  # per setup command
    # The controller's sweep topic (an id in ATTR_PROJECT's project, or projects/P/topics/T): where the agent
    # publishes sweep_nudge(job) when its trainer or setup fails, so the controller acts now rather than at its next
    # scheduled sweep. None: no nudge (the scheduled sweep still finds the failure).
    sweep_topic: Optional[str] = None
    # The Firestore database the agent writes its heartbeats to: the one its node identity alone may write
    # (respawn.deployment.heartbeat_database). None: NODES_DATABASE (a deployment without node identities).
    heartbeat_database: Optional[str] = None
    # What setup produced, restored on a fresh node instead of running setup (check_cache_paths; ENV_CACHE_DIR).
    cache: Tuple[str, ...] = ()
    # The shipped log chunks also written to Cloud Logging as entries labelled with log_labels (JobSpec.logs).
    cloud_logging: bool = False
    # The trainer's OCI image, pinned by digest (IMAGE_PINNED: `jobs register` resolves a tag): the agent runs
    # command, setup and the trainer inside it. None: a bare process on the node's own interpreter.
    image: Optional[str] = None

    def __post_init__(self) -> None:
        command = self.command
        if isinstance(command, (str, bytes)) or not isinstance(command, (list, tuple)) or not command \
                or not all(isinstance(a, str) and a for a in command):
            raise SettingsError('command must be a non-empty argv list of strings, e.g. ["python", "train.py"]')
        object.__setattr__(self, "command", tuple(command))
        env = self.env if self.env is not None else {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise SettingsError("env must be an object of string values")
        object.__setattr__(self, "env", dict(env))
        try:
            StoreUri.parse(self.checkpoint_uri)
        except ValueError:
            raise SettingsError(f"checkpoint_uri must be gs://BUCKET/PREFIX or file:///PATH, "
                                f"got {self.checkpoint_uri!r}") from None
        for key in ("heartbeat_seconds", "notice_budget_seconds", "metadata_wait_seconds", "setup_timeout_seconds"):
            object.__setattr__(self, key, _seconds(key, getattr(self, key)))
        notice = self.notice_seconds
        if isinstance(notice, bool) or not isinstance(notice, (int, float)) or not 0 <= notice <= self.notice_budget_seconds:
            raise SettingsError(f"notice_seconds must be a number of seconds from 0 to notice_budget_seconds "
                                f"({self.notice_budget_seconds:g}), got {notice!r}")
        object.__setattr__(self, "notice_seconds", float(notice))
        if self.workdir is not None:
            try:
                StoreUri.parse(self.workdir)
            except ValueError:
                raise SettingsError(f"workdir must be gs://BUCKET/… or file:///PATH, got {self.workdir!r}") from None
            workdir_digest(self.workdir)
        setup = self.setup
        if isinstance(setup, (str, bytes)) or not isinstance(setup, (list, tuple)) or not all(
                isinstance(c, (list, tuple)) and c and all(isinstance(a, str) and a for a in c) for c in setup):
            raise SettingsError('setup must be a list of argv lists, e.g. [["pip", "install", "-r", "requirements.txt"]]')
        object.__setattr__(self, "setup", tuple(tuple(c) for c in setup))
        object.__setattr__(self, "cache", check_cache_paths(self.cache))
        if not isinstance(self.interpreter, str) or not self.interpreter or "\0" in self.interpreter:
            raise SettingsError(f"interpreter must be a program name or path, got {self.interpreter!r}")
        if self.sweep_topic is not None:
            topic_path("project", self.sweep_topic)  # SettingsError naming what is wrong
        if not isinstance(self.cloud_logging, bool):
            raise SettingsError(f"cloud_logging must be true or false, got {self.cloud_logging!r}")
        if self.heartbeat_database is not None and not _DATABASE_ID.match(str(self.heartbeat_database)):
            raise SettingsError(f"heartbeat_database must be a Firestore database id, got {self.heartbeat_database!r}")
        if self.image is not None and not (isinstance(self.image, str) and IMAGE_PINNED.match(self.image)):
            raise SettingsError(f"image must be an image reference pinned by digest (NAME@sha256:HEX), "
                                f"got {self.image!r}")

    def to_json(self) -> str:
        body = asdict(self)
        body["command"] = list(self.command)
        body["setup"] = [list(c) for c in self.setup]
        body["cache"] = list(self.cache)
        return json.dumps(body, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "NodeSettings":
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise SettingsError(f"not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise SettingsError(f"must be a JSON object, got {type(raw).__name__}")
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        for key in ("command", "checkpoint_uri"):
            if key not in known:
                raise SettingsError(f"{key} is missing")
        return cls(**known)


def topic_path(project: str, topic: str) -> str:
    """A Pub/Sub topic (an id in `project`, or projects/P/topics/T) as projects/P/topics/T; SettingsError when it
    is neither."""
    parts = topic.split("/") if isinstance(topic, str) else []
    if len(parts) == 1 and parts[0]:
        return f"projects/{project}/topics/{topic}"
    if len(parts) == 4 and parts[0] == "projects" and parts[2] == "topics" and parts[1] and parts[3]:
        return topic
    raise SettingsError(f"sweep_topic must be a topic id or projects/PROJECT/topics/TOPIC, got {topic!r}")


def sweep_nudge(job_id: str) -> Dict[str, str]:
    """The message that makes the controller reconcile one job now (on_sweep; the CLI and the agent send it)."""
    return {"task": "sweep", "job_id": job_id}


def notice_nudge(job_id: str, node: str, notice: str, at: str) -> Dict[str, Any]:
    """The agent's message on a preemption or maintenance notice (`at`: RFC 3339, when it saw it): the controller
    reconciles the job at once, knowing `node` is about to go, and may create its replacement during the notice."""
    return {**sweep_nudge(job_id), "notice": {"node": node, "kind": notice, "at": at}}


@dataclass(frozen=True)
class Handover:
    """ATTR_HANDOVER: the node this one replaces during its notice, and when that node is off at the latest."""

    node: str
    until: str  # RFC 3339

    def to_json(self) -> str:
        return json.dumps({"node": self.node, "until": self.until}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "Handover":
        try:
            data = json.loads(text)
            return cls(str(data["node"]), str(data["until"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{ATTR_HANDOVER} is not {{node, until}} JSON ({exc}): {text[:200]!r}") from None


# ---- the status file (written by respawn.ckpt.status.StatusWriter, read by the agent) --------------------------

EMERGENCY_STATES = ("idle", "saving", "committed", "abandoned", "failed", "not-started")
EMERGENCY_ENDED = ("committed", "abandoned", "failed")  # what the trainer writes when its save ended
# Written by the agent, never the trainer: the notice came, and a process that saves never began its save (it ended
# first, or was killed at the deadline before its step boundary, or no process of the run handles the notice).
NOT_STARTED = "not-started"
COMMITTED_KINDS = ("periodic", "emergency")
DURABILITY = ("local", "remote")  # remote: in ENV_CHECKPOINT_URI's store


class EmergencyStatus(TypedDict, total=False):
    state: str  # one of EMERGENCY_STATES
    step: Optional[int]
    reason: Optional[str]
    # In a heartbeat: each saver's own outcome (SaverOutcome), as the agent read them from the run's NOTICE_DIR.
    ranks: List[Dict[str, Any]]


class TrainerStatus(TypedDict):
    """The status file: one JSON object, replaced atomically (temp file, fsync, rename)."""

    step: int  # steps completed so far
    committed_step: Optional[int]  # newest committed checkpoint
    committed_kind: Optional[str]  # one of COMMITTED_KINDS
    committed_durable: Optional[str]  # one of DURABILITY
    emergency: EmergencyStatus
    total_steps: Optional[int]
    updated_at: float  # unix time
    pid: int
    generation: Optional[int]  # a member's trainer that can rejoin: the generation of its process group
    rejoin: Optional[str]  # one of REJOIN_STATES; None: it cannot rejoin (restarted for every generation)
    # This process's first step past the step it restored (or past 0), and when it was done (unix time): where its
    # training began, by its own clock: a recovery's end (respawn.control.recovery_time), exact even when the whole
    # resumed run fits between two of the agent's beats. None before it (and from trainers that do not write it).
    first_step: Optional[int]
    first_step_at: Optional[float]


def idle_emergency() -> EmergencyStatus:
    return {"state": "idle", "step": None, "reason": None}


def new_status(total_steps: Optional[int], pid: int, now: float) -> TrainerStatus:
    return {"step": 0, "committed_step": None, "committed_kind": None, "committed_durable": None,
            "emergency": idle_emergency(), "total_steps": total_steps, "updated_at": now, "pid": pid,
            "generation": None, "rejoin": None, "first_step": None, "first_step_at": None}


def read_status(path: str) -> Optional[Dict[str, Any]]:
    """The last complete status object at `path`, or None if the file is missing, empty or not (yet) valid JSON.
    One small read, no locking: the writer replaces the file by rename."""
    try:
        with open(path, "rb") as f:
            obj = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


# ---- the run's savers (registered by respawn.ckpt; read by the agent and respawn.ckpt.launch) ------------------
#
# The notice goes to the processes that save, never to the trainer's whole process group: a DataLoader worker (torch's
# worker handler re-raises a SIGTERM that is not its parent's), a forkserver, a shell that did not exec, torchrun
# (which then signals each rank's group) all die of it or pass it on, and with a loader worker dead torch raises in
# the rank's main thread, inside the step or the save. Each process that holds a notice handler registers in the
# run's ENV_NOTICE_DIR (a file per pid: Saver). Whoever delivers the notice writes NOTICE_MARK first, then SIGTERMs
# each live saver (deliver_notice); a saver that registers after the mark finds it and takes it as its notice. A run
# with no saver (not started yet, or a trainer that does not use respawn.ckpt) gets the notice on its process group.
ENV_NOTICE_DIR = "RESPAWN_NOTICE_DIR"
NOTICE_MARK = "noticed"
_SAVER_SUFFIX = ".saver.json"


def process_start_time(pid: int) -> Optional[str]:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot): with the pid, one process for good; None
    when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    return None if fields[0] == "Z" else fields[19]


@dataclass
class Saver:
    """One process that saves on the notice: `rank` (torch's RANK; None for one process), and its emergency save's
    outcome once it ended (EmergencyStatus: state, step, reason)."""

    pid: int
    start_time: Optional[str]
    rank: Optional[int]
    outcome: Optional[Dict[str, Any]] = None

    def alive(self) -> bool:
        return self.start_time is not None and process_start_time(self.pid) == self.start_time

    def write(self, directory: str) -> None:
        path = os.path.join(directory, f"{self.pid}{_SAVER_SUFFIX}")
        os.makedirs(directory, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(asdict(self), f)
        os.replace(path + ".tmp", path)


def read_savers(directory: str) -> List[Saver]:
    """The savers registered in `directory`, by rank (unreadable entries skipped: a writer replaces by rename)."""
    found = []
    try:
        names = [n for n in os.listdir(directory) if n.endswith(_SAVER_SUFFIX)]
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(directory, name)) as f:
                found.append(Saver(**json.load(f)))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(found, key=lambda s: (s.rank is None, s.rank or 0, s.pid))


def notice_marked(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, NOTICE_MARK))


def deliver_notice(directory: str, owns: Callable[[int], bool]) -> List[int]:
    """Mark the run noticed, then SIGTERM each live saver that `owns` accepts; the pids signalled (none: the
    caller signals the run's process group instead)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, NOTICE_MARK), "w") as f:
        f.write(str(time.time()))
    sent = []
    for saver in read_savers(directory):
        if saver.alive() and owns(saver.pid):
            try:
                os.kill(saver.pid, signal.SIGTERM)
                sent.append(saver.pid)
            except OSError:  # gone meanwhile
                continue
    return sent


# ---- the node's name and its heartbeat (written by the agent, read by the control plane as respawn.schema.Heartbeat)

NODES_COLLECTION = "nodes"  # nodes/{node_name(job, attempt)}: one heartbeat document per node
# Heartbeats live in Firestore databases of their own, never beside the jobs the controller acts on: one per node
# identity, which alone may write there (respawn.deployment.heartbeat_database, named in NodeSettings), or this one
# in a deployment without node identities (local runs).
NODES_DATABASE = "respawn-nodes"
# Node names are `{job}-{attempt}`; attempts up to 6 digits keep every node name within GCE/TPU's 63 characters.
MAX_ATTEMPT = 999_999


def node_name(job_id: str, attempt: int) -> str:
    """The name of a job's node for one attempt: the VM or TPU node, and the key of its heartbeat document."""
    if not 1 <= attempt <= MAX_ATTEMPT:
        raise ValueError(f"attempt {attempt} is outside 1..{MAX_ATTEMPT}")
    return f"{job_id}-{attempt}"


def heartbeat_id(node: str, worker: int = 0) -> str:
    """The heartbeat document of one host of a node: the node's name for worker 0 (so a single-host node or GPU VM
    keeps nodes/{node}, where the control plane has always read it) and `{node}-w{worker}` for the other workers of
    a multi-host TPU slice. Only a document id, never a resource name, so the 63-character limit of node names does
    not apply (Firestore ids may be 1500 bytes); and it can never equal another node's name, which always ends in
    `-{attempt digits}`, never in `-w{digits}`."""
    if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
        raise ValueError(f"worker must be a non-negative integer, got {worker!r}")
    return node if worker == 0 else f"{node}-w{worker}"


class NodeState(str, enum.Enum):
    """What the agent says in its heartbeat."""

    STARTING = "starting"
    PREPARING = "preparing"  # fetching the workdir, installing the library, running setup
    SETUP_FAILED = "setup-failed"  # a setup command failed: not a preemption; the job fails (failed_command)
    TRAINING = "training"
    PREEMPTING = "preempting"
    WAITING = "waiting"  # a multi-node member between generations: prepared, no trainer running
    EXITED = "exited"


class Heartbeat(TypedDict):
    """The nodes/{node} document as the agent composes it (respawn.agent.heartbeat.compose_heartbeat): Python
    values, datetimes as datetimes (Firestore timestamps). respawn.schema.Heartbeat reads it with these fields."""

    job_id: str
    attempt: int
    worker: int  # this host's index in a multi-host TPU slice (ATTR_WORKER_NUMBER); 0 on a single host
    zone: Optional[str]
    state: NodeState
    step: Optional[int]  # the trainer's status file (TrainerStatus)
    committed_step: Optional[int]
    total_steps: Optional[int]
    exit_code: Optional[int]  # how the trainer ended (EXIT_PREEMPTED after a notice)
    output_tail: Optional[str]  # the end of a failed trainer's (or setup command's) output
    failed_command: Optional[List[str]]  # SETUP_FAILED: the setup step that failed, as argv
    notice: Optional[str]  # what told the agent: preempted, maintenance-event, run-ending (a flex-start run), sigterm
    # The trainer's emergency-save outcome (EmergencyStatus); after a notice the agent's, with each rank's (`ranks`)
    emergency: Optional[Dict[str, Any]]
    started_at: Optional[datetime]  # when the trainer started
    # The running trainer's first step past its restore, and when: the trainer's own record in its status file
    # (TrainerStatus.first_step_at), else when the agent saw it at a beat (as fine as heartbeat_seconds): where this
    # life's training began (respawn/app/report.py, respawn.control.recovery_time).
    first_step: Optional[int]
    first_step_at: Optional[datetime]
    generation: Optional[int]  # a multi-node member: the generation its trainer runs (or last ran); else None
    # Seconds since the running trainer's step last changed, by the agent's clock when it composed the beat; None
    # while no trainer runs or before its first step (a start is not timed). The control plane's stall rule reads it.
    step_idle_seconds: Optional[float]
    # A multi-node member other than its generation's master: whether the master's address answered a TCP connect
    # (accepted or refused) at the agent's last probe (MASTER_PROBE_PORT); None: not probed (the master, one node).
    master_reachable: Optional[bool]
    # trainer.cache on this node: {state (ENV_CACHE_STATES), key (its first 12 hex), bytes (moved so far)}; None
    # without a cache or before the agent looked.
    env_cache: Optional[Dict[str, Any]]
    heartbeat_at: datetime  # written as Firestore's commit time (HEARTBEAT_SERVER_TIME_FIELDS)


HEARTBEAT_FIELDS: Tuple[str, ...] = tuple(Heartbeat.__annotations__)
# Fields the writer leaves to Firestore: the commit time, so that heartbeat ages never depend on a node's clock.
HEARTBEAT_SERVER_TIME_FIELDS: Tuple[str, ...] = ("heartbeat_at",)
