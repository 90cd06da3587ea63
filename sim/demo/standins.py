"""The stand-ins a demo runs on, started in the order a deployment has them and stopped newest first: the Firestore,
Pub/Sub and Cloud Storage emulators (or a test session's, kept to the run's project), the sim (Compute Engine, Cloud
TPU, metadata servers, the audit-log sink) whose nodes boot the real startup script, the trainer's image in a local
registry when the scenario runs one, the four functions behind Pub/Sub push subscriptions, the Eventarc and Scheduler
bridges, a Slack receiver, and the deployment's self-test down every path. sim/demo/runner.py runs a job on them.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Callable

from respawn import deployment
from respawn.app import codestore
from respawn.app.workdir import WorkdirError, human_bytes, pack
from sim import emulators, functions_host, netns, node_image, registry, trainer_image
from sim.demo.scenario import Scenario
from sim.node_containers import NodeContainers
from sim.tpu import ENDPOINTS_HOSTNAMES

REPO = Path(__file__).resolve().parents[2]
BUCKET = "respawn-demo"  # on the storage emulator: the agent's release and the job's code
SELF_TEST_TIMEOUT_S = 60.0  # every function answers in seconds; a loaded machine starts the host slowly


class DemoError(RuntimeError):
    """A part of the demo could not start or run; the message says which and where its log is."""


class Stack:
    """Stops what was started, newest first; a failing stop is reported, the others still run."""

    def __init__(self, say: Callable[[str], None]):
        self._items: list[tuple[str, Callable[[], None]]] = []
        self._say = say
        self.pids: list[int] = []  # the processes (group leaders) the stops end

    def push(self, name: str, stop: Callable[[], None], pid: int | None = None) -> None:
        self._items.append((name, stop))
        if pid is not None:
            self.pids.append(pid)

    def close(self) -> None:
        while self._items:
            name, stop = self._items.pop()
            try:
                stop()
            except Exception as exc:  # keep stopping the rest
                self._say(f"stopping {name} failed: {exc}")
        self.pids.clear()



class Standins:
    """What a demo runs on, from start() to close(): `env` points a node or a function at the emulators, `cli_env`
    a user's shell (`respawn jobs …`); `sim` is the cloud, `slack` hears the alerts."""

    def __init__(self, sc: Scenario, out: Path, say: Callable[[str], None], *, project: str, with_image: bool,
                 firestore_host: str | None = None, pubsub_host: str | None = None):
        self.sc, self.out, self.say, self.project = sc, out, say, project
        self.with_image = with_image  # the scenario's trainer.image: built, and served from a local registry
        # Emulators already running (HOST:PORT), shared with others: used, emptied of this project, never stopped.
        self.firestore_host, self.pubsub_host = firestore_host, pubsub_host
        self.stack = Stack(say)
        self.env: dict[str, str] = {}
        self.cli_env: dict[str, str] = {}  # what points `respawn jobs …` in another shell at these stand-ins
        self.library: str | None = None  # the respawn wheel's respawn-library value (a trainer in an image)
        self.image: str | None = None  # the trainer's image in the local registry, pinned (a scenario's trainer.image)

    def start(self) -> None:
        self._emulators()
        self._sim()
        self._bridges(self._functions())

    def pids(self) -> list[int]:
        """The processes started that run now, each to be stopped by its PID: the emulators, the functions and the
        nodes (the sim, the bridges and the Slack receiver are threads of this process)."""
        nodes = [n["pid"] for n in self.sim.live_nodes() if n.get("pid")] if hasattr(self, "sim") else []
        return [*self.stack.pids, *nodes]

    def close(self) -> None:
        self.stack.close()

    def _emulators(self) -> None:
        fs_host, ps_host = self.firestore_host, self.pubsub_host
        given = {"Firestore": fs_host, "Pub/Sub": ps_host}
        for name, host in given.items():
            if host:
                emulators.check_running(name, host)
        own = [name for name, host in given.items() if not host] + ["Cloud Storage"]
        starting = (f"starting the {', '.join(own[:-1])} and {own[-1]} emulators" if len(own) > 1
                    else f"starting the {own[0]} emulator")
        shared = " and ".join(f"the {name} emulator at {host}" for name, host in given.items() if host)
        self.say(f"using {shared} (project {self.project}); {starting}" if shared else starting)
        if fs_host:
            # Pushed first, so done last: once nothing of the run can write any more.
            self.stack.push("the project's Firestore documents",
                            lambda host=fs_host: emulators.reset_firestore(host, self.project))
        else:
            fs = emulators.start_firestore(log_dir=self.out)
            self.stack.push("Firestore emulator", fs.stop, fs.proc.pid)
            fs_host = fs.host
        if ps_host:
            self.stack.push("the project's Pub/Sub topics",
                            lambda host=ps_host: emulators.delete_pubsub(host, self.project, "topics"))
        else:
            ps = emulators.start_pubsub(log_dir=self.out)
            self.stack.push("Pub/Sub emulator", ps.stop, ps.proc.pid)
            ps_host = ps.host
        gcs = emulators.start_storage(BUCKET, log_dir=self.out)
        self.stack.push("Cloud Storage emulator", gcs.stop, gcs.proc.pid)
        os.environ["FIRESTORE_EMULATOR_HOST"] = fs_host
        os.environ["PUBSUB_EMULATOR_HOST"] = ps_host
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.url  # `respawn jobs register --workdir` uploads through it
        self.env.update(FIRESTORE_EMULATOR_HOST=fs_host, PUBSUB_EMULATOR_HOST=ps_host)
        self.cli_env.update(self.env, STORAGE_EMULATOR_HOST=gcs.url, GOOGLE_CLOUD_PROJECT=self.project)
        self.storage = node_image.Storage(gcs.url, BUCKET)

    def _sim(self) -> None:
        from sim.audit_router import AuditRouter
        from sim.server import SimServer
        from sim.slack import SlackReceiver

        sc = self.sc
        self.slack = SlackReceiver().start()
        self.stack.push("Slack receiver", self.slack.stop)
        self.router = AuditRouter(self.project, topic=deployment.LOG_EVENTS_TOPIC)  # its faults: after the self-test
        self.stack.push("audit router", self.router.close)
        containers = self._trainer_image() if self.with_image else None
        self.say("publishing the agent zipapp to the storage emulator, as the build does")
        self.agent = node_image.publish_agent(self.out / "release", self.storage)
        if containers is not None:  # the image's python gets the checkpoint library from the node, as in production
            self.say("publishing the respawn wheel to the storage emulator, as the build does")
            try:
                self.library = node_image.publish_library(self.out / "release", self.storage)
            except RuntimeError as exc:
                raise DemoError(str(exc)) from None
        # The node image's python3 is this interpreter; a node boots the real startup script.
        boot_command, boot_env = node_image.boot(sys.executable, self.storage)
        node_env = {**self.env, **boot_env, "PYTHONUNBUFFERED": "1"}
        # Each node in a network namespace of its own where this process may make them (root): a lost node's
        # traffic stops as on a VPC, and a partition can be played. Else they share this machine's loopback.
        why_not = netns.available()
        if why_not is not None:
            self.say(f"nodes share this machine's network ({why_not})")
        if sc.accelerator == "tpu":
            names = ("the workers' hostnames" if why_not is None else "the workers' addresses (a hostname cannot be "
                     "made to resolve on a shared network)")
            self.say(f"TPU workers' worker-network-endpoints: {sc.tpu_endpoints}, "
                     + (names if sc.tpu_endpoints == ENDPOINTS_HOSTNAMES else "name:uid:IP"))
        self.sim = SimServer(self.project, notice_seconds=sc.notice_seconds, op_delay=0.3,
                             boot_command=boot_command, node_env=node_env, network="loopback" if why_not else "netns",
                             nodes_root=self.out / "nodes", audit_sink=self.router,
                             tpu_endpoints=sc.tpu_endpoints, run_duration_scale=sc.run_duration_scale,
                             node_containers=containers).start()
        self.stack.push("sim", self.sim.stop)
        self.cli_env[deployment.ENV_COMPUTE_ENDPOINT] = self.sim.endpoint  # `respawn doctor` writes its probe there
        if sc.faults.api_error_rate:
            self.sim.set_api_faults(rate=sc.faults.api_error_rate, methods=("insert", "create"))

    def _trainer_image(self) -> NodeContainers:
        """The trainer's image in a local registry (Artifact Registry's stand-in), built first if not cached; the
        nodes' podman configuration that pulls from it."""
        missing = [p for p in ("podman", "runc") if shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}")]
        if missing or os.geteuid() != 0:
            raise DemoError(f"the scenario runs the trainer in an image, which needs root and podman with runc "
                            f"(missing: {', '.join(missing) or 'root'}): apt-get install podman runc docker-registry")
        try:
            reg = registry.start(self.out / "registry")
        except registry.RegistryError as exc:
            raise DemoError(str(exc)) from None
        def stop() -> None:  # its blobs are copies of the cached image's: not part of the run's record
            reg.stop()
            shutil.rmtree(reg.root / "storage", ignore_errors=True)

        self.stack.push("registry", stop, reg.proc.pid)
        self.say(f"Artifact Registry's stand-in on {reg.host}; the trainer image: "
                 + ("cached" if trainer_image.cached() else "building it (a few minutes, once)"))
        started = time.monotonic()
        try:
            image = trainer_image.build(lambda line: self.say(f"trainer image: {line}"))
            self.image = trainer_image.push(image, reg.host, say=lambda line: self.say(f"trainer image: {line}"))
        except trainer_image.ImageError as exc:
            raise DemoError(str(exc)) from None
        self.say(f"trainer image {self.image} ({image.size / 1e6:.0f} MB) ready in {time.monotonic() - started:.0f} s")
        return NodeContainers(registries=(reg.host,))

    def _functions(self) -> dict[str, str]:
        """Serve the entry points with the Functions Framework, in one process (sim/functions_host.py); returns target
        → URL."""
        sc = self.sc
        env = {
            **os.environ, **self.env,
            "RESPAWN_PROJECT": self.project,
            "RESPAWN_COMPUTE_ENDPOINT": self.sim.endpoint,
            "RESPAWN_MONITORING_ENDPOINT": self.sim.endpoint,  # the job's goodput series, as in production
            "RESPAWN_TPU_ENDPOINT": self.sim.endpoint,
            "RESPAWN_BILLING_ENDPOINT": self.sim.endpoint,  # no SKUs set: the offline table prices the demo
            "RESPAWN_ALERTS_TOPIC": deployment.ALERTS_TOPIC,
            "RESPAWN_AGENT": self.agent,
            **({deployment.ENV_LIBRARY: self.library} if self.library else {}),
            "SLACK_WEBHOOK_URL": self.slack.url,
            "RESPAWN_SLACK_BACKOFF_SECONDS": "0.5",
            "RESPAWN_HEARTBEAT_SECONDS": str(sc.heartbeat_seconds),
            "RESPAWN_NOTICE_BUDGET_SECONDS": str(sc.notice_budget_seconds),
            "RESPAWN_STALE_HEARTBEAT_SECONDS": str(sc.stale_after_seconds),
            # A node boots, installs the agent and its library and beats well within this even on a loaded 2-core
            # machine running two demos (30 s was not: a slow first boot counted as a boot failure).
            "RESPAWN_BOOT_GRACE_SECONDS": "90",
            "RESPAWN_PROGRESS_TIMEOUT_SECONDS": str(sc.progress_timeout_seconds),
            # A budget's look-ahead, as in production: the sweep's period and a soft-off.
            "RESPAWN_BUDGET_LOOKAHEAD_SECONDS": str(sc.sweep_seconds + sc.notice_seconds),
            "RESPAWN_BACKOFF_BASE_SECONDS": "2",
            "RESPAWN_POLL_SECONDS": "0.5",
            "RESPAWN_POLL_BUDGET_SECONDS": "30",
            "RESPAWN_OP_TIMEOUT_SECONDS": "60",
            "PYTHONUNBUFFERED": "1",
        }
        port = emulators.free_port()
        log = self.out / "functions.log"
        handle = open(log, "wb")

        def stop() -> None:
            # Killed: the run is over and its alerts delivered, and the functions keep no state (their logs are
            # written line by line). A graceful stop waits for a request in flight (a sweep's pass): seconds of
            # each demo's teardown.
            emulators.stop_groups([proc], first=signal.SIGKILL)
            handle.close()

        self.say("starting the four functions with the Functions Framework")
        try:
            proc, urls = functions_host.start(env, port, handle, log)
        except functions_host.HostError as exc:
            handle.close()
            raise DemoError(str(exc)) from None
        self.stack.push("the functions", stop)
        self.stack.pids.append(proc.pid)
        if self.pubsub_host:  # before the functions stop: no push of the run's may reach another's on a reused port
            self.stack.push("the project's Pub/Sub subscriptions",
                            lambda: emulators.delete_pubsub(self.pubsub_host, self.project, "subscriptions"))
        functions_host.subscribe(self.project, urls)
        return urls

    def _bridges(self, urls: dict[str, str]) -> None:
        from sim.bridges import EventarcBridge, SweepScheduler

        bridge = EventarcBridge(self.project, urls["on_job_created"]).start()
        self.stack.push("Eventarc bridge", bridge.stop)
        sweep = SweepScheduler(self.project, topic=deployment.SWEEP_TOPIC, interval=self.sc.sweep_seconds).start()
        self.stack.push("sweep scheduler", sweep.stop)
        self._self_test(sweep.fire)

    def _self_test(self, tick) -> None:
        """The deployment's self-test, as the build's last step runs it: a probe down every path, each answered."""
        from respawn.app import selftest_run

        send = selftest_run.Senders(selftest_run.senders(self.project, None, self.sim.endpoint).write_log, tick)
        answers = selftest_run.run(self.project, send, timeout=SELF_TEST_TIMEOUT_S, say=self.say)
        failed = [line for ok, line in selftest_run.results(answers, SELF_TEST_TIMEOUT_S) if not ok]
        if failed:
            raise DemoError(f"the stand-ins' deployment failed its self-test: {failed[0][2:]}")
        self.slack.forget()
        # The faults armed now: the self-test's probe is not one of the scenario's audit events (dropped, it would
        # fail the self-test), nor its message one of the scenario's alerts.
        faults = self.sc.faults
        self.router.duplicates = faults.duplicate_events
        if faults.drop_events:
            self.router.drop_next(faults.drop_events)
        if faults.slack:
            self.slack.fail(status=faults.slack.status, count=faults.slack.count, retry_after=1)

    def upload_workdir(self, directory: Path) -> str:
        """Pack the directory and put it on the storage emulator, as `respawn jobs register` does."""
        try:
            packed = pack(directory)
        except WorkdirError as exc:
            raise DemoError(f"cannot pack trainer.workdir: {exc}") from None
        if warning := packed.size_warning():
            self.say(warning)
        sent = codestore.upload(packed, f"gs://{BUCKET}/demo", self.project)
        shown = directory.relative_to(REPO) if directory.is_relative_to(REPO) else directory
        self.say(f"packed {shown} ({packed.files} files, {human_bytes(packed.size)}) and uploaded it: "
                 f"trainer.workdir = {sent.uri}")
        return sent.uri
