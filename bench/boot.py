"""Boot-time benchmark (issue 14): what a node spends between power-on and its trainer's first step, stage by
stage, for a fresh node and for a restart in place, beside the pip-install-at-boot path it replaced.

    python -m bench.boot [--repeats 3] [--warmup 1] [--state-mb 8] [--quick] [--json] [--firestore HOST:PORT] [--image]

With --image, also the pull stage of a trainer in an OCI image against the environment cache for the same
environment (torch's wheels), in the same run: bench/image_pull.py.

Users pay for boot time at every preemption. Per repeat the benchmark boots, on this machine, through the real
deploy/vm/startup.sh (sim/node_image.py, sim/nodes.py):
  fresh     a new sim node (an empty disk): the startup script downloads the agent zipapp from the storage
            emulator with the metadata server's token; the agent downloads and unpacks the workdir
            (examples/workdir, packed and uploaded as `respawn jobs register --workdir` does), downloads the respawn
            wheel (respawn-library) and pip-installs it into the trainer's interpreter (--no-deps, then its storage
            extra, already satisfied there), runs the setup command (prepare.py), starts the trainer (train.py →
            respawn.ckpt.examples.torch_mlp), which restores the newest checkpoint from the job's store and trains.
            When its first step is done the node is powered off (SIGTERM, as a preemption): the trainer saves an
            emergency checkpoint and the agent writes its final heartbeat to the Firestore emulator.
  in place  the same node booted again (same disk): the agent zipapp, the workdir, the library and the setup are
            reused; the agent uploads what the previous life left on the local disk, the trainer restores the
            emergency checkpoint.
  baseline  the path this replaced (bench/pip_boot_startup.sh, the startup script before the zipapp, verbatim):
            at a fresh boot it creates a venv (--system-site-packages) and pip-installs `respawn[agent,storage]`
            from the wheel it downloads; on a restart in place its marker skips both. pip runs offline
            (--no-index) from a wheelhouse this run makes from the installed distributions; the image lacks what
            it lacks for the new path too (below). Only the script is run (systemctl is a recorder): the old agent
            is not started.

The node image: a stand-in for a Deep Learning VM's python3, built once per run in the work directory: this
interpreter's binary and standard library with a site-packages of its own that holds exactly pip, torch, NumPy and
google-cloud-storage (and what they require), linked from this environment, and not respawn. The agent runs on it
and it is the job's trainer.interpreter. Before each fresh node the respawn the previous one installed is removed.

Stages (seconds; from the node's console, one JSON line each; times from the same host clock):
  agent_fetch           startup.sh: fetch + verify the zipapp (fresh), or find it present (in place)
  startup_other         startup.sh: the rest (interpreter check, metadata, the unit)
  agent_start           from the script's end to the agent's preparation: the systemctl stand-in, the agent's
                        interpreter and zipapp, its configuration from the metadata server, the first notice reads
  workdir_download      the workdir archive from the storage emulator (fresh)
  workdir_unpack        checked and unpacked member by member, synced (fresh)
  library_download      the respawn wheel (fresh)
  library_install       pip install of the wheel into the trainer's interpreter (fresh; skipped in place)
  previous_life_upload  `python -m respawn.ckpt upload-pending`: the local checkpoints of the last life (in place)
  prepare_other         the rest of the preparation (finding and probing the interpreter, ...) and the trainer's
                        spawn
  setup                 the user's setup command (fresh; skipped in place: same inputs)
  interpreter_start     the trainer process's spawn → its restore begins: Python, the user's imports (torch,
                        respawn.ckpt), building the model
  restore               the library's restore (list the stores, verify, read the newest checkpoint)
  first_step            the restore's end → the first step done (state loaded in place, the periodic-save buffers,
                        one step)
Respawn's own share is every stage above `setup`: power-on to the trainer's spawn, less the user's setup command.
The user's share: setup, interpreter_start, restore, first_step (the framework's import and the checkpoint's size are
the job's). Goals: in place ≤ 5 s; fresh ≤ the archives downloaded (zipapp + workdir + wheel) at the disk's
sequential write speed + 5 s, the speed measured in the run (write + fsync of max(64 MiB, the archives) in the work
directory). Reported: median [min–max] over the repeats, after --warmup uncounted fresh + in-place boots.

Baseline stages (the old script, timed by recording wrappers around python3, curl and systemctl):
  venv          `python3 -m venv --system-site-packages` (with ensurepip)
  wheel_fetch   the token, the wheel's download
  pip_install   `pip install 'respawn[agent,storage] @ file://…'`: resolves, installs what the image lacks
  startup_other the rest (metadata, the unit)
Compared: installing Respawn at boot = the startup script + library_download + library_install (new) against the
old startup script (baseline), fresh and in place.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from datetime import datetime
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
LEGACY_EXEC_START = "ExecStart=/opt/respawn/venv/bin/python -m respawn.agent"  # the old unit's one different line
PROJECT = "respawn-bench"
BUCKET = "respawn-bench"
JOB = "boot-bench"
WORKDIR = ROOT / "examples" / "workdir"
LEGACY_STARTUP = ROOT / "bench" / "pip_boot_startup.sh"
IMAGE_PACKAGES = ("pip", "torch", "numpy", "google-cloud-storage")  # a Deep Learning VM's python3, roughly
LEGACY_EXTRAS = ("agent", "storage")  # what the old control plane asked nodes to install

RESPAWN_STAGES = ("agent_fetch", "startup_other", "agent_start", "workdir_download", "workdir_unpack",
                  "library_download", "library_install", "previous_life_upload", "prepare_other")
USER_STAGES = ("setup", "interpreter_start", "restore", "first_step")
STAGES = RESPAWN_STAGES + USER_STAGES
SUMS = ("respawn_s", "user_s", "total_s", "install_s")
BASELINE_STAGES = ("venv", "wheel_fetch", "pip_install", "startup_other")
KINDS = ("fresh", "in_place")
IN_PLACE_GOAL_S = 5.0
FRESH_SLACK_S = 5.0
BOOT_TIMEOUT = 300  # power-on to the first step; a loaded machine's fresh boot takes ~10-20 s
POWER_OFF_GRACE = 60
LEGACY_TIMEOUT = 600
# Offline pip everywhere (the node's library install and the baseline): no configuration file (it may name an
# index), no index, no cache (a fresh node has none).
# main() drops every other PIP_* variable from the environment the nodes inherit.
PIP_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_NO_CACHE_DIR": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


class BenchError(RuntimeError):
    pass


def _legacy_startup(directory: Path) -> Path:
    """The baseline script with its unit filled in: today's node unit (deploy/vm/startup.sh) with that day's
    ExecStart, since the unit is defined once."""
    from respawn import deployment

    unit = re.sub(r"^ExecStart=.*$", LEGACY_EXEC_START, deployment.agent_unit(), count=1, flags=re.M)
    script = directory / LEGACY_STARTUP.name
    script.write_text(re.sub(r"^@AGENT_UNIT@\n", lambda _: unit, LEGACY_STARTUP.read_text(), count=1, flags=re.M))
    return script


def _epoch(stamp: str) -> float:
    """A log line's `time` (respawn.logs.now: RFC 3339, UTC) in seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(nothing)"


# ------------------------------------------------------------------------------------------ the node image


def _canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def _distributions(site: Path) -> dict[str, importlib.metadata.Distribution]:
    return {_canonical(d.metadata["Name"]): d for d in importlib.metadata.distributions(path=[str(site)])}


def closure(requirements: list[str], dists: dict[str, importlib.metadata.Distribution]) -> dict[str, set[str]]:
    """The installed distributions that `requirements` need, transitively: canonical name → extras asked for."""
    from packaging.requirements import Requirement

    seen: dict[str, set[str]] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = _canonical(req.name)
        if name not in dists:
            raise BenchError(f"{req} is needed but not installed in {sys.prefix}; install the dev extra "
                             "(pip install -e '.[dev]')")
        extras = set(req.extras)
        if name in seen and extras <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | extras
        for text in dists[name].requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in seen[name] | {""}):
                todo.append(sub)
    return seen


def _record_files(dist: importlib.metadata.Distribution) -> list[PurePosixPath]:
    """The distribution's files inside site-packages (no scripts outside it, no byte-code)."""
    return [PurePosixPath(str(f)) for f in dist.files or []
            if f.parts and f.parts[0] != ".." and "__pycache__" not in f.parts and f.suffix != ".pyc"]


def mirror(src: Path, dest: Path, names: set[str], dists: dict[str, importlib.metadata.Distribution]) -> int:
    """Link exactly the files of `names` from site-packages `src` into `dest`: a whole directory where no other
    distribution has a file under it, else file by file. Returns the number of links."""
    blocked: set[tuple[str, ...]] = set()
    for name, dist in dists.items():
        if name not in names:
            for f in _record_files(dist):
                blocked.update(f.parts[:i] for i in range(1, len(f.parts) + 1))
    linked: set[tuple[str, ...]] = set()
    for name in sorted(names):
        for f in _record_files(dists[name]):
            parts = f.parts
            i = next(i for i in range(1, len(parts) + 1) if parts[:i] not in blocked)
            prefix = parts[:i]
            if any(prefix[:j] in linked for j in range(1, i + 1)) or not (src.joinpath(*prefix)).exists():
                continue
            target = dest.joinpath(*prefix)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(src.joinpath(*prefix))
            linked.add(prefix)
    return len(linked)


def _image_python_info(python: Path) -> dict:
    code = ("import json, site, sys, sysconfig; print(json.dumps({'prefix': sys.prefix, 'base': sys.base_prefix, "
            "'purelib': sysconfig.get_path('purelib'), 'site': site.getsitepackages(), "
            "'version': '%d.%d.%d' % sys.version_info[:3]}))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, env=env,
                         cwd=python.parent)
    if out.returncode != 0:
        raise BenchError(f"the node image's python {python} does not run: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout)


def build_image(dest: Path) -> tuple[Path, Path, list[str]]:
    """A python3 installation of its own at `dest` (this interpreter's binary, its standard library linked, a real
    site-packages holding IMAGE_PACKAGES' closure linked from this environment). Returns (python, its site-packages,
    the distributions in it)."""
    exe = Path(os.path.realpath(sys.executable))
    base = Path(os.path.realpath(sys.base_prefix))
    stdlib = Path(os.path.realpath(sysconfig.get_paths()["stdlib"]))
    try:
        rel_exe, rel_stdlib = exe.relative_to(base), stdlib.relative_to(base)
    except ValueError:
        raise BenchError(f"{exe} or {stdlib} is not under sys.base_prefix {base}: cannot lay out a node image "
                         "from this interpreter") from None
    python = dest / rel_exe
    python.parent.mkdir(parents=True)
    shutil.copy2(exe, python)  # a copy, not a link: Python finds its prefix from where its binary really is
    (dest / rel_stdlib).mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name not in ("site-packages", "dist-packages"):
            (dest / rel_stdlib / entry.name).symlink_to(entry)
    info = _image_python_info(python)
    site = Path(info["purelib"])
    if Path(info["prefix"]) != dest or info["prefix"] != info["base"] or str(site) not in info["site"] \
            or not str(site).startswith(str(dest) + os.sep):
        raise BenchError(f"the node image's python {python} does not see itself as an installation at {dest} "
                         f"({info}); this interpreter's layout is not supported by bench.boot")
    site.mkdir(parents=True, exist_ok=True)
    src = Path(sysconfig.get_path("purelib"))
    dists = _distributions(src)
    names = set(closure(list(IMAGE_PACKAGES), dists))
    if "respawn" in names:
        raise BenchError("the node image would hold respawn; it must not")
    mirror(src, site, names, dists)
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u, json; print(json.dumps([bool(u.find_spec(m)) for m in "
                            "('respawn', 'torch', 'numpy', 'google.cloud.storage', 'pip')]))"],
        capture_output=True, text=True, timeout=120, cwd=dest,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")})
    if probe.returncode != 0 or json.loads(probe.stdout) != [False, True, True, True, True]:
        raise BenchError(f"the node image's python must find torch, numpy, google.cloud.storage and pip but not "
                         f"respawn: {probe.stdout.strip()} {probe.stderr.strip()[-2000:]}")
    return python, site, sorted(names)


def reset_image(site: Path) -> None:
    """Remove what a node's agent installed into the image (respawn), so that the next fresh node finds it pristine."""
    for entry in site.iterdir():
        if entry.name == "respawn" or (entry.name.startswith("respawn-") and entry.name.endswith(".dist-info")):
            if entry.is_symlink():
                raise BenchError(f"{entry} is a link into this environment; refusing to touch it")
            shutil.rmtree(entry)


# ------------------------------------------------------------------------------------------ wheels


def build_wheel(out: Path) -> Path:
    """The respawn wheel of this checkout, built from a copy of its sources (offline: no build isolation)."""
    src = out / "src"
    from deploy import layout

    src.mkdir(parents=True)
    for part in layout.wheel_sources(ROOT):
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / part, src / part)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "-w", str(out / "dist"), str(src)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, **PIP_ENV})
    found = sorted((out / "dist").glob("respawn-*.whl"))
    if r.returncode != 0 or len(found) != 1:
        raise BenchError(f"building the respawn wheel failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
    return found[0]


def _urlsafe_sha256(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(dist: importlib.metadata.Distribution, out: Path) -> Path:
    """An installed distribution as a wheel again (its RECORD's files inside site-packages, a fresh RECORD; the
    scripts pip writes from entry_points.txt are left out, pip writes them anew)."""
    site = Path(str(dist.locate_file("")))
    files = _record_files(dist)
    infos = {f.parts[0] for f in files if f.parts[0].endswith(".dist-info")}
    if len(infos) != 1:
        raise BenchError(f"{dist.metadata['Name']}: {len(infos)} .dist-info folders in its RECORD")
    (info,) = infos
    tags = [line.split(":", 1)[1].strip() for line in (site / info / "WHEEL").read_text().splitlines()
            if line.startswith("Tag:")]
    py, abi, plat = (".".join(sorted({t.split("-")[i] for t in tags})) for i in range(3))
    path = out / f"{info[: -len('.dist-info')]}-{py}-{abi}-{plat}.whl"
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for f in files:
            if f.parts[0] == info and f.name in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue
            source = site / str(f)
            if not source.is_file():
                continue
            data = source.read_bytes()
            z.write(source, str(f))
            record.append(f"{f},sha256={_urlsafe_sha256(data)},{len(data)}")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def legacy_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist for respawn[agent,storage] (markers evaluated)."""
    from email.parser import BytesParser

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        meta = BytesParser().parsebytes(z.read(name), headersonly=True)
    out = []
    for text in meta.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *LEGACY_EXTRAS)):
            req.marker = None
            out.append(str(req))
    return out


def build_wheelhouse(out: Path, wheel: Path, image: list[str]) -> list[str]:
    """Wheels of what respawn[agent,storage] needs beyond the image, repacked from this environment."""
    out.mkdir(parents=True)
    src = Path(sysconfig.get_path("purelib"))
    dists = _distributions(src)
    needed = sorted(set(closure(legacy_requirements(wheel), dists)) - set(image))
    for name in needed:
        repack(dists[name], out)
    return needed


# ------------------------------------------------------------------------------------------ measurements


def disk_write_speed(directory: Path, size: int) -> float:
    """MiB/s of a sequential write of `size` bytes, fsync'd, in `directory`."""
    block = os.urandom(1 << 20)
    path = directory / "disk-probe.bin"
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = size
        while left > 0:
            left -= f.write(block[: min(left, len(block))])
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return size / (1 << 20) / seconds


def _json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                out.append(entry)
    return out


def timeline(lines: list[dict], t_boot: float) -> dict:
    """One boot's stages from its console lines; raises BenchError if one is missing."""
    startup = {e["stage"]: e for e in lines if e.get("stage") in ("agent_fetch", "total")
               and str(e.get("message", "")).startswith("respawn startup:")}
    prepare: dict[str, dict] = {}
    for e in lines:
        if e.get("message") == "prepare stage":
            prepare[e["stage"]] = e
    by_message = {}
    for e in lines:
        by_message.setdefault(e.get("message"), e)
    restored = by_message.get("restored checkpoint") or by_message.get("no committed checkpoint found; starting from scratch")
    wanted = {"startup agent_fetch": startup.get("agent_fetch"), "startup total": startup.get("total"),
              "preparation finished": by_message.get("preparation finished"),
              "trainer started": by_message.get("trainer started"), "the trainer's restore": restored,
              "first step done": by_message.get("first step done")}
    missing = [k for k, v in wanted.items() if v is None]
    if missing:
        raise BenchError(f"the console lacks {', '.join(missing)}")
    t_spawn = datetime.fromisoformat(by_message["trainer started"]["started_at"]).timestamp()
    prep_s = float(by_message["preparation finished"]["seconds"])
    startup_s = float(startup["total"]["seconds"])

    def seconds(stage: str) -> float:
        e = prepare.get(stage)
        return 0.0 if e is None or e.get("skipped") else float(e.get("seconds") or 0.0)

    s = {"agent_fetch": float(startup["agent_fetch"]["seconds"])}
    s["startup_other"] = startup_s - s["agent_fetch"]
    s["agent_start"] = (t_spawn - prep_s) - (t_boot + startup_s)
    for stage in ("workdir_download", "workdir_unpack", "library_download", "library_install",
                  "previous_life_upload", "setup"):
        s[stage] = seconds(stage)
    s["prepare_other"] = prep_s - sum(s[k] for k in ("workdir_download", "workdir_unpack", "library_download",
                                                       "library_install", "previous_life_upload", "setup"))
    restore_end = _epoch(restored["time"])
    s["restore"] = float(restored["seconds"])
    s["interpreter_start"] = restore_end - s["restore"] - t_spawn
    first = by_message["first step done"]
    s["first_step"] = _epoch(first["time"]) - restore_end
    result = {k: round(v, 4) for k, v in s.items()}
    result["respawn_s"] = round(sum(s[k] for k in RESPAWN_STAGES), 4)
    result["user_s"] = round(sum(s[k] for k in USER_STAGES), 4)
    result["total_s"] = round(_epoch(first["time"]) - t_boot, 4)
    result["install_s"] = round(startup_s + s["library_download"] + s["library_install"], 4)
    downloaded = 0
    if startup["agent_fetch"].get("downloaded"):
        downloaded += int(startup["agent_fetch"].get("bytes") or 0)
    for stage in ("workdir_download", "library_download"):
        downloaded += int((prepare.get(stage) or {}).get("bytes") or 0)
    result["downloaded_bytes"] = downloaded
    result["agent_downloaded"] = bool(startup["agent_fetch"].get("downloaded"))
    result["observed"] = sorted({"agent_fetch", "startup_total", "preparation", "trainer_spawn", "restore",
                                 "first_step"} | {k for k, e in prepare.items() if not e.get("skipped")})
    result["skipped"] = sorted(k for k, e in prepare.items() if e.get("skipped"))
    result["restored_step"] = restored.get("step")
    return result


class Bench:
    """The emulators, the published artifacts, the node image; boots nodes and runs the baseline."""

    def __init__(self, work: Path, firestore_host: str | None, state_mb: float):
        self.work = work
        self.firestore_host = firestore_host
        self.state_mb = state_mb
        self.emulators: list = []
        self.nodes: list = []
        self.servers: list = []
        self.children: list[subprocess.Popen] = []
        self.attempt = 0

    # --- setup ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        from respawn import contract, deployment
        from respawn.app import codestore
        from respawn.app.workdir import pack
        from sim import emulators, node_image

        _progress("starting the storage emulator" + ("" if self.firestore_host else " and the Firestore emulator"))
        gcs = emulators.start_storage(BUCKET, log_dir=self.work)
        self.emulators.append(gcs)
        if self.firestore_host is None:
            fs = emulators.start_firestore(log_dir=self.work)
            self.emulators.append(fs)
            self.firestore_host = fs.host
        else:
            emulators.reset_firestore(self.firestore_host, PROJECT)
        self.storage = node_image.Storage(gcs.url, BUCKET)
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.url  # codestore.upload goes through it

        _progress("building the node image (python3 with pip, torch, numpy, google-cloud-storage; no respawn)")
        self.image_python, self.image_site, self.image_packages = build_image(self.work / "image")
        _progress("building the respawn wheel and the agent zipapp; publishing them to the storage emulator")
        self.wheel = build_wheel(self.work / "wheel")
        data = self.wheel.read_bytes()
        self.library = deployment.release_artifact(BUCKET, "bench", self.wheel.name, hashlib.sha256(data).hexdigest())
        self.wheel_object = f"{deployment.RELEASES_PREFIX}/bench/{self.wheel.name}"
        node_image.upload(self.storage, self.wheel_object, data)
        self.agent = node_image.publish_agent(self.work / "release", self.storage, release="bench")
        packed = pack(WORKDIR)
        self.workdir_uri = codestore.upload(packed, f"gs://{BUCKET}/bench", PROJECT).uri
        _progress(f"packed {WORKDIR.relative_to(ROOT)} ({packed.files} files, {packed.size} bytes) and uploaded it")
        _progress("building the baseline's wheelhouse (what respawn[agent,storage] needs beyond the image)")
        self.wheelhouse = self.work / "wheelhouse"
        self.wheelhouse_dists = build_wheelhouse(self.wheelhouse, self.wheel, self.image_packages)

        self.checkpoint_uri = (self.work / "checkpoints").as_uri()
        command = ["python", "train.py", "--framework", "torch", "--steps", "1000000", "--state-mb", f"{self.state_mb:g}",
                   "--checkpoint-every", "100", "--step-seconds", "0.02", "--log-every", "1000000"]
        self.settings = contract.NodeSettings(
            command=tuple(command), checkpoint_uri=self.checkpoint_uri, env={"PYTHONUNBUFFERED": "1"},
            heartbeat_seconds=5.0, workdir=self.workdir_uri, setup=(("python", "prepare.py", "--framework", "torch"),),
            interpreter=str(self.image_python)).to_json()
        boot_command, boot_env = node_image.boot(str(self.image_python), self.storage)
        self.boot_command = boot_command
        self.node_env = {**boot_env, **PIP_ENV, "PYTHONUNBUFFERED": "1", "FIRESTORE_EMULATOR_HOST": self.firestore_host}

    def stop(self) -> None:
        from sim.emulators import stop_group

        for node in self.nodes:
            node.crash()
        for proc in self.children:
            if proc.poll() is None:
                stop_group(proc, timeout=5)
        for server in self.servers:
            server.stop()
        for emulator in reversed(self.emulators):
            emulator.stop()

    # --- a node ---------------------------------------------------------------------------------------------

    def new_node(self, tag: str):
        from respawn import contract
        from sim.nodes import NodeRuntime

        self.attempt += 1
        name = f"{JOB}-{self.attempt}"
        attributes = {contract.ATTR_JOB_ID: JOB, contract.ATTR_ATTEMPT: str(self.attempt),
                      contract.ATTR_PROJECT: PROJECT, contract.ATTR_SETTINGS: self.settings,
                      contract.ATTR_AGENT: self.agent, contract.ATTR_LIBRARY: self.library}
        node = NodeRuntime(directory=self.work / "nodes" / tag, boot_command=self.boot_command, node_env=self.node_env,
                           metadata_kwargs={"name": name, "project": PROJECT, "attributes": attributes})
        self.nodes.append(node)
        return node

    def boot(self, node, what: str) -> dict:
        """Power on, wait for the trainer's first step, power off (a preemption); the boot's stages."""
        console = node.console_log
        offset = console.stat().st_size if console.exists() else 0
        t_boot = time.time()
        node.boot()
        deadline = time.monotonic() + BOOT_TIMEOUT
        text = ""
        while True:
            try:
                with open(console, "rb") as f:
                    f.seek(offset)
                    text = f.read().decode("utf-8", errors="replace")
            except OSError:
                text = ""
            lines = _json_lines(text)
            messages = {e.get("message") for e in lines}
            if "first step done" in messages:
                break
            failed = [e for e in lines if e.get("severity") == "ERROR"]
            if failed or time.monotonic() > deadline or not node.running():
                why = (f"it logged: {failed[0].get('message')}" if failed else
                       f"no first step within {BOOT_TIMEOUT} s" if time.monotonic() > deadline else "it stopped")
                node.crash()
                raise BenchError(f"{what}: the node did not reach its first step ({why}); its console "
                                 f"({console}):\n" + "\n".join(text.splitlines()[-40:]))
            time.sleep(0.1)
        clean = node.power_off(grace=POWER_OFF_GRACE)
        with open(console, "rb") as f:
            f.seek(offset)
            lines = _json_lines(f.read().decode("utf-8", errors="replace"))
        try:
            result = timeline(lines, t_boot)
        except BenchError as exc:
            raise BenchError(f"{what}: {exc}; its console: {console}") from None
        handled = [e for e in lines if e.get("message") == "notice handled; agent exiting"]
        uploaded = [e for e in lines if e.get("message") == "previous-life upload done"]
        result["previous_life_uploaded_steps"] = uploaded[-1].get("uploaded_steps") if uploaded else None
        durable = [e for e in lines if str(e.get("message", "")).startswith("emergency checkpoint ")
                   and e.get("component") == "trainer" and "durable" in e]
        result["emergency_durable"] = durable[-1].get("durable") if durable else None
        result["powered_off_cleanly"] = clean
        result["emergency_exit_code"] = handled[-1].get("exit_code") if handled else None
        result["final_heartbeat_written"] = bool(handled and handled[-1].get("final_heartbeat_written"))
        return result

    # --- the baseline ---------------------------------------------------------------------------------------

    def start_legacy(self) -> None:
        from sim.metadata import MetadataServer

        requirement = f"respawn[{','.join(LEGACY_EXTRAS)}] @ gs://{BUCKET}/{self.wheel_object}"
        self.legacy_metadata = MetadataServer(name="legacy", project=PROJECT,
                                              attributes={"respawn-install": requirement}).start()
        self.servers.append(self.legacy_metadata)

    @staticmethod
    def _recorder(path: Path, real: str, calls: Path) -> Path:
        path.write_text("#!/bin/sh\n"
                        f'printf "start %s %s %s\\n" "$$" "$(date +%s.%N)" "$*" >> "{calls}"\n'
                        f'"{real}" "$@"\nrc=$?\n'
                        f'printf "end %s %s %s\\n" "$$" "$(date +%s.%N)" "$*" >> "{calls}"\n'
                        "exit $rc\n")
        path.chmod(0o755)
        return path

    def legacy(self, directory: Path, fresh: bool, what: str) -> dict:
        """Run the old startup script once on `directory` (its /opt/respawn and unit folder); its stages."""
        directory.mkdir(parents=True, exist_ok=True)
        wrappers = directory / "bin"
        wrappers.mkdir(exist_ok=True)
        calls = directory / "calls.txt"
        calls.unlink(missing_ok=True)
        curl = shutil.which("curl")
        if curl is None:
            raise BenchError("curl is needed by the startup scripts; install it")
        python = self._recorder(wrappers / "python3", str(self.image_python), calls)
        self._recorder(wrappers / "curl", curl, calls)
        systemctl = wrappers / "systemctl"
        systemctl.write_text(f'#!/bin/sh\nprintf "systemctl %s %s\\n" "$(date +%s.%N)" "$*" >> "{calls}"\n'
                             '[ "$1" = is-active ] && exit 3\nexit 0\n')
        systemctl.chmod(0o755)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(PIP_ENV)
        env.update({"PIP_FIND_LINKS": str(self.wheelhouse), "GCE_METADATA_HOST": self.legacy_metadata.host,
                    "RESPAWN_STORAGE_HOST": self.storage.url, "RESPAWN_ROOT": str(directory / "opt"),
                    "SYSTEMD_UNIT_DIR": str(directory / "units"), "SYSTEMCTL": str(systemctl), "PYTHON": str(python),
                    "PATH": f"{wrappers}{os.pathsep}{env.get('PATH', os.defpath)}"})
        log = directory / ("fresh.log" if fresh else "in-place.log")
        with open(log, "wb") as out:
            t0 = time.time()
            proc = subprocess.Popen(["bash", str(_legacy_startup(directory))], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    cwd=directory)
            self.children.append(proc)
            try:
                rc = proc.wait(timeout=LEGACY_TIMEOUT)
            except subprocess.TimeoutExpired:
                from sim.emulators import stop_group

                stop_group(proc, timeout=5)
                raise BenchError(f"{what}: the old startup script ran past {LEGACY_TIMEOUT} s; its output:\n"
                                 f"{_tail(log)}") from None
            t_end = time.time()
            self.children.remove(proc)
        if rc != 0:
            raise BenchError(f"{what}: the old startup script exited with code {rc}; its output ({log}):\n{_tail(log)}")
        said = log.read_text(errors="replace")
        starts: dict[str, tuple[float, str]] = {}
        ends: dict[str, float] = {}
        systemctl_at: list[float] = []
        for line in calls.read_text().splitlines():
            word, rest = line.split(" ", 1)
            if word == "systemctl":
                systemctl_at.append(float(rest.split(" ", 1)[0]))
                continue
            pid, at, *args = rest.split(" ", 2)
            if word == "start":
                starts[pid] = (float(at), args[0] if args else "")
            else:
                ends[pid] = float(at)

        def call(predicate) -> tuple[float, float] | None:
            found = [(at, ends.get(pid, at)) for pid, (at, args) in starts.items() if predicate(args)]
            return min(found) if found else None

        total = t_end - t0
        s = {k: 0.0 for k in BASELINE_STAGES}
        if fresh:
            venv = call(lambda a: a.startswith("-m venv"))
            token = call(lambda a: "service-accounts/default/token" in a)
            download = call(lambda a: "alt=media" in a)
            if not (venv and token and download and systemctl_at) or "installing" not in said:
                raise BenchError(f"{what}: the old startup script did not create a venv, download the wheel and "
                                 f"install it; its output ({log}):\n{_tail(log)}\ncalls:\n{_tail(calls)}")
            s["venv"] = venv[1] - venv[0]
            s["wheel_fetch"] = download[1] - token[0]
            s["pip_install"] = min(systemctl_at) - download[1]
            venv_site = next((directory / "opt" / "venv" / "lib").glob("python*/site-packages"))
            installed = sorted(p.name for p in venv_site.glob("*.dist-info"))
            if not any(n.startswith("respawn-") for n in installed):
                raise BenchError(f"{what}: pip did not install respawn into the venv ({installed})")
        elif "agent already installed" not in said:
            raise BenchError(f"{what}: the old startup script did not skip the install on a restart in place; its "
                             f"output ({log}):\n{_tail(log)}")
        s["startup_other"] = total - sum(s[k] for k in ("venv", "wheel_fetch", "pip_install"))
        result = {k: round(v, 4) for k, v in s.items()}
        result["total_s"] = round(total, 4)
        if fresh:
            result["installed_distributions"] = len([n for n in installed if not n.startswith(("pip-", "setuptools-"))])
        return result


# ------------------------------------------------------------------------------------------ the run


def _stats(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "runs": [round(v, 3) for v in values]}


def measure(bench: Bench, repeats: int, warmup: int, probe_bytes: int) -> dict:
    runs: dict = {"fresh": [], "in_place": [], "baseline_fresh": [], "baseline_in_place": [], "disk_mib_s": []}
    total = warmup + repeats
    for i in range(total):
        counted = i >= warmup
        label = f"repeat {i - warmup + 1}/{repeats}" if counted else f"warm-up {i + 1}/{warmup}"
        tag = f"r{i}" if counted else f"w{i}"
        reset_image(bench.image_site)
        node = bench.new_node(tag)
        for kind in KINDS:
            _progress(f"{label}: {kind.replace('_', ' ')} node booting ...")
            r = bench.boot(node, f"{label} {kind}")
            _progress(f"{label}: {kind.replace('_', ' ')}: first step {r['total_s']:.2f} s after power-on "
                      f"(Respawn {r['respawn_s']:.2f} s, user {r['user_s']:.2f} s"
                      f"{'' if r['emergency_exit_code'] == 75 else '; no emergency exit 75: ' + str(r['emergency_exit_code'])})")
            if counted:
                runs[kind].append(r)
        node.destroy()
        bench.nodes.remove(node)
        reset_image(bench.image_site)  # the baseline's venv sees the image: without respawn, as a fresh VM's
        _progress(f"{label}: baseline (pip install at boot) fresh ...")
        directory = bench.work / "legacy" / tag
        b_fresh = bench.legacy(directory, True, f"{label} baseline fresh")
        b_again = bench.legacy(directory, False, f"{label} baseline in place")
        _progress(f"{label}: baseline: fresh {b_fresh['total_s']:.2f} s (venv {b_fresh['venv']:.2f} s, pip "
                  f"{b_fresh['pip_install']:.2f} s), in place {b_again['total_s']:.2f} s")
        shutil.rmtree(directory, ignore_errors=True)
        if counted:
            runs["baseline_fresh"].append(b_fresh)
            runs["baseline_in_place"].append(b_again)
            size = max(probe_bytes, max(r["downloaded_bytes"] for r in runs["fresh"]))
            runs["disk_mib_s"].append(disk_write_speed(bench.work, size))
    return runs


def summarize(runs: dict, bench: Bench, repeats: int, warmup: int, probe_bytes: int) -> dict:
    out: dict = {"repeats": repeats, "warmup": warmup, "python": platform.python_version(), "cpus": os.cpu_count(),
                 "machine": f"{platform.system()} {platform.machine()}", "state_mb": bench.state_mb,
                 "image_packages": bench.image_packages, "baseline_wheelhouse": bench.wheelhouse_dists,
                 "stages": {}, "observed": {}, "skipped": {}}
    for kind in KINDS:
        rs = runs[kind]
        out["stages"][kind] = {k: _stats([r[k] for r in rs]) for k in STAGES + SUMS}
        out["observed"][kind] = sorted(set().union(*(r["observed"] for r in rs)))
        out["skipped"][kind] = sorted(set().union(*(r["skipped"] for r in rs)))
        out[f"{kind}_downloaded_bytes"] = int(statistics.median(r["downloaded_bytes"] for r in rs))
        out[f"{kind}_restored_steps"] = [r["restored_step"] for r in rs]
        out[f"{kind}_emergency_exit_codes"] = [r["emergency_exit_code"] for r in rs]
        out[f"{kind}_final_heartbeats_written"] = all(r["final_heartbeat_written"] for r in rs)
        out[f"{kind}_emergency_durable"] = [r["emergency_durable"] for r in rs]
        out[f"{kind}_previous_life_uploaded_steps"] = [r["previous_life_uploaded_steps"] for r in rs]
    out["baseline"] = {}
    for kind in KINDS:
        rs = runs[f"baseline_{kind}"]
        out["baseline"][kind] = {k: _stats([r[k] for r in rs]) for k in BASELINE_STAGES + ("total_s",)}
    out["baseline_installed_distributions"] = max(r["installed_distributions"] for r in runs["baseline_fresh"])
    disk = _stats(runs["disk_mib_s"])
    out["disk_write_mib_s"] = disk
    out["disk_probe_bytes"] = max(probe_bytes, out["fresh_downloaded_bytes"])
    download_s = out["fresh_downloaded_bytes"] / (1 << 20) / disk["median"]
    fresh_limit = download_s + FRESH_SLACK_S
    goals = {
        "in_place": {"limit_s": IN_PLACE_GOAL_S, "respawn_s": out["stages"]["in_place"]["respawn_s"]["median"]},
        "fresh": {"limit_s": round(fresh_limit, 3), "download_at_disk_speed_s": round(download_s, 4),
                  "respawn_s": out["stages"]["fresh"]["respawn_s"]["median"]},
    }
    for g in goals.values():
        g["pass"] = g["respawn_s"] <= g["limit_s"]
    out["goals"] = goals
    out["install_s"] = {kind: {"respawn": out["stages"][kind]["install_s"]["median"],
                               "baseline": out["baseline"][kind]["total_s"]["median"]} for kind in KINDS}
    for kind in KINDS:
        i = out["install_s"][kind]
        i["baseline/respawn"] = round(i["baseline"] / i["respawn"], 2) if i["respawn"] > 0 else None
    return out


def _cell(s: dict, digits: int = 3) -> str:
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def table(result: dict) -> str:
    rows = [("stage", "owner", "fresh", "in place")]
    for stage in STAGES:
        owner = "respawn" if stage in RESPAWN_STAGES else "user"
        rows.append((stage, owner) + tuple(_cell(result["stages"][k][stage]) for k in KINDS))
    rows.append(None)
    for key, label in (("respawn_s", "Respawn's share"), ("user_s", "user's share"), ("total_s", "power-on to step 1")):
        rows.append((label, "") + tuple(_cell(result["stages"][k][key]) for k in KINDS))
    rows.append(None)
    rows.append(("installing Respawn at boot:", "", "", ""))
    rows.append(("  zipapp + library (this)", "") + tuple(_cell(result["stages"][k]["install_s"]) for k in KINDS))
    for stage in BASELINE_STAGES:
        rows.append((f"  pip at boot: {stage}", "baseline") + tuple(_cell(result["baseline"][k][stage]) for k in KINDS))
    rows.append(("  pip at boot: total", "baseline") + tuple(_cell(result["baseline"][k]["total_s"]) for k in KINDS))
    rows.append(("  baseline / this", "") + tuple(
        f"{result['install_s'][k]['baseline/respawn']:.1f}x" if result["install_s"][k]["baseline/respawn"] else "-"
        for k in KINDS))
    widths = [max(len(r[i]) for r in rows if r) for i in range(4)]
    rule = "-" * (sum(widths) + 6)
    lines = []
    for r in rows:
        if r is None:
            lines.append(rule)
            continue
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    lines.insert(1, rule)
    g = result["goals"]
    lines += [
        "",
        f"median [min-max] seconds of {result['repeats']} boots each (after {result['warmup']} warm-up); "
        f"Python {result['python']}, {result['cpus']} CPUs, {result['machine']}; checkpoint state {result['state_mb']:g} MiB",
        f"fresh node downloads {result['fresh_downloaded_bytes']} bytes (zipapp, workdir, wheel); disk sequential write "
        f"{_cell(result['disk_write_mib_s'], 0)} MiB/s (write + fsync of {result['disk_probe_bytes'] >> 20} MiB)",
        f"goal in place: Respawn's share {g['in_place']['respawn_s']:.2f} s <= {g['in_place']['limit_s']:.2f} s: "
        f"{'PASS' if g['in_place']['pass'] else 'MISS'}",
        f"goal fresh:    Respawn's share {g['fresh']['respawn_s']:.2f} s <= download at disk speed "
        f"{g['fresh']['download_at_disk_speed_s']:.3f} s + {FRESH_SLACK_S:.0f} s = {g['fresh']['limit_s']:.2f} s: "
        f"{'PASS' if g['fresh']['pass'] else 'MISS'}",
        f"baseline: the old startup script installed {result['baseline_installed_distributions']} distributions into "
        f"its venv at each fresh boot (pip --no-index from a local wheelhouse; from PyPI on a real VM)",
        f"restored steps: fresh {result['fresh_restored_steps']}, in place {result['in_place_restored_steps']}; "
        f"emergency exits {result['fresh_emergency_exit_codes'] + result['in_place_emergency_exit_codes']}, durable "
        f"{result['fresh_emergency_durable'] + result['in_place_emergency_durable']}; previous-life upload uploaded "
        f"{result['in_place_previous_life_uploaded_steps']}",
    ]
    pull = result.get("image_pull")
    if pull:
        lines += [
            "",
            f"trainer image against the environment cache, the same environment (torch {pull['reference']}):",
            f"  image pull, new VM       {_cell(pull['pull_fresh'], 2)} s   ({pull['image_bytes'] / 1e6:.0f} MB of "
            f"gzipped layers; pushed once in {pull['push_s']:.1f} s)",
            f"  image, restart in place  {_cell(pull['pull_in_place'], 2)} s   (the layers on the node's disk)",
            f"  env cache restore        {_cell(pull['cache_restore'], 2)} s   ({pull['cache_bytes'] / 1e6:.0f} MB "
            f"uncompressed tar: download {_cell(pull['cache_download'], 2)} s, unpack {_cell(pull['cache_unpack'], 2)} s)",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.boot", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=None, help="counted fresh + in-place boots (default 3; --quick: 1)")
    p.add_argument("--warmup", type=int, default=None, help="uncounted boots first (default 1; --quick: 0)")
    p.add_argument("--state-mb", type=float, default=8.0, help="extra checkpoint state of the example trainer (MiB)")
    p.add_argument("--quick", action="store_true", help="one repeat, no warm-up, a small disk probe: for CI")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--image", action="store_true", help="also the pull stage of a trainer image against the "
                   "environment cache of the same environment (bench/image_pull.py; needs podman, runc, "
                   "docker-registry)")
    p.add_argument("--firestore", metavar="HOST:PORT", default=None,
                   help=f"use this running Firestore emulator (project {PROJECT} is emptied) instead of starting one")
    args = p.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    warmup = args.warmup if args.warmup is not None else (0 if args.quick else 1)
    if repeats < 1 or warmup < 0:
        p.error("--repeats must be at least 1 and --warmup at least 0")
    probe_bytes = (16 if args.quick else 64) << 20

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # like Ctrl-C: the finally below stops everything
    for name in list(os.environ):  # the node image must not see this checkout, pip no index or configuration
        if name in ("PYTHONPATH", "PYTHONHOME") or name.startswith("PIP_"):
            os.environ.pop(name)
    from bench.image_pull import PullBenchError as ImagePullError
    from sim.emulators import EmulatorError

    work = Path(tempfile.mkdtemp(prefix="respawn-boot-"))
    bench = Bench(work, args.firestore, args.state_mb)
    keep = True
    try:
        bench.start()
        bench.start_legacy()
        runs = measure(bench, repeats, warmup, probe_bytes)
        if args.image:
            from bench import image_pull

            pulled = image_pull.measure(work / "pull", bench.storage, repeats, _progress)
        keep = False
    except (BenchError, EmulatorError, TimeoutError, ImagePullError) as exc:
        _progress(f"boot benchmark failed: {exc}")
        return 1
    except (KeyboardInterrupt, SystemExit) as exc:
        keep = False
        _progress("boot benchmark interrupted; stopping what it started")
        return 130 if isinstance(exc, KeyboardInterrupt) else exc.code
    finally:
        bench.stop()
        if keep:
            _progress(f"the nodes' consoles, the baseline's output and the emulators' logs are kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    result = summarize(runs, bench, repeats, warmup, probe_bytes)
    if args.image:
        result["image_pull"] = {**{k: v for k, v in pulled.items() if k != "runs"},
                                **{stage: _stats(values) for stage, values in pulled["runs"].items()}}
    print(json.dumps(result) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
