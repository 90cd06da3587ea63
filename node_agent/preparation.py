"""A node life's preparation as the agent runs it, before its first trainer: the workdir, the interpreter, the
library (prepare.py), a previous life's local-only checkpoints uploaded (previous_life.py), setup or the environment
cache's archive of it (envcache.py), the newest checkpoint prefetched (prefetch.py) — and the trainer's environment
all of them share.

A failure is recorded in prepare.failed.json for this boot: an agent restarted in the same boot (a crash, SIGHUP)
reports it again and never runs it again; a new boot prepares afresh.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from respawn import contract
from respawn.logs import log

from . import container
from .config import AgentConfig
from .envcache import EnvCache
from .image_run import ImageRun
from .metadata import MetadataClient, ServiceAccountToken
from .notice import Notice
from .prepare import AGENT, PrepareFailed, Preparer, read_json, write_json
from .prefetch import Prefetch
from .previous_life import upload_previous_life
from .pull import BackgroundPull, PullFailed
from .storage import Fetcher, Interrupted, Uploader
from .supervisor import boot_id

PREPARE_FAILED = "prepare.failed.json"  # this boot's failed preparation: reported again, never run again
# How long a preparation step killed by a signal waits for the agent's own SIGTERM or the notice (they arrive
# together on a power-off) before it counts as a failed setup.
SHUTDOWN_SIGNAL_GRACE_S = 3.0


class Preparation:
    """`run()` prepares the node life; `prepared` is its result (None until it succeeded), `failure` what failed
    (None unless it did), `env_cache` the environment cache (None without settings.cache and setup)."""

    def __init__(self, cfg: AgentConfig, md: MetadataClient, notice: Notice, *, upload_timeout_seconds: float,
                 on_change: Callable[[], None]):
        self.cfg, self.md, self.notice = cfg, md, notice
        self.settings, self.node_dir = cfg.settings, cfg.node_dir
        self.local_ckpt_dir = os.path.join(self.node_dir, contract.LOCAL_CHECKPOINT_DIR)
        self.upload_timeout_seconds = upload_timeout_seconds
        self.on_change = on_change  # the environment cache's state changed: the heartbeat says so at once
        self.prepared: Preparer | None = None
        self.failure: PrepareFailed | None = None
        self.env_cache: EnvCache | None = None

    def trainer_env(self) -> dict[str, str]:
        """The agent's environment + settings.env + the node contract's variables (a host's place in its slice
        included): what the trainer, setup and the previous-life upload run with."""
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")  # the output log should follow the trainer live
        env.update(self.settings.env)
        env.update({
            contract.ENV_JOB_ID: self.cfg.job_id,
            contract.ENV_ATTEMPT: str(self.cfg.attempt),
            contract.ENV_CHECKPOINT_URI: self.settings.checkpoint_uri,
            contract.ENV_LOCAL_CHECKPOINT_DIR: self.local_ckpt_dir,
            contract.ENV_STATUS_FILE: os.path.join(self.node_dir, contract.STATUS_FILE),
            contract.ENV_NOTICE_DIR: os.path.join(self.node_dir, contract.NOTICE_DIR),
            contract.ENV_NOTICE_BUDGET: f"{self.settings.notice_budget_seconds:g}",
            contract.ENV_NODE_RANK: str(self.cfg.hosts.worker),
            contract.ENV_NUM_NODES: str(self.cfg.hosts.count),
            contract.ENV_MASTER_ADDR: self.cfg.hosts.master_addr,
        })
        return env

    def run(self) -> Preparer | None:
        """Prepare (prepare.py). None when it failed (`failure` says what) or was interrupted by a notice or
        SIGHUP."""
        interrupted = self.notice.interrupted
        failed_key = {"job_id": self.cfg.job_id, "attempt": self.cfg.attempt, "boot_id": boot_id(),
                      "settings": self.settings.to_json(), "library": list(self.cfg.library or ())}
        failed_path = os.path.join(self.node_dir, PREPARE_FAILED)
        earlier = read_json(failed_path)
        if isinstance(earlier, dict) and earlier.get("key") == failed_key:
            log("WARNING", "preparation failed earlier in this boot; reporting it again without running it again",
                failed_command=earlier.get("failed_command"), exit_code=earlier.get("exit_code"))
            self.failure = PrepareFailed(earlier.get("failed_command") or ["?"], earlier.get("message") or "",
                                         exit_code=earlier.get("exit_code"), output_tail=earlier.get("output_tail"))
            return None
        started = time.monotonic()
        fetcher = Fetcher(self.md)
        if self.settings.cache and self.settings.setup:
            self.env_cache = EnvCache(self.settings.checkpoint_uri, self.node_dir, fetcher, Uploader(self.md),
                                      interrupted=interrupted, on_change=self.on_change)
        image: ImageRun | None = None
        pull: BackgroundPull | None = None
        try:
            if self.settings.image:
                # The job's image (image_run.py): its pull starts first and overlaps the workdir's and the library's
                # downloads; whatever runs the image waits for it (image_ready).
                try:
                    runtime = container.find_runtime()
                except container.RuntimeMissing as exc:
                    raise PrepareFailed([AGENT, "run-image", self.settings.image], str(exc)) from None
                image = ImageRun(runtime, self.settings.image, self.node_dir, job_id=self.cfg.job_id,
                                 attempt=self.cfg.attempt, worker=self.cfg.worker,
                                 checkpoint_uri=self.settings.checkpoint_uri,
                                 accelerator=container.find_accelerator(), base_env=os.environ)
                pull = BackgroundPull(runtime, self.settings.image, self.node_dir, os.environ,
                                      ServiceAccountToken(self.md).get, interrupted)
                pull.start()

            def image_ready() -> None:
                if pull is not None:
                    try:
                        pull.result()
                    except PullFailed as exc:
                        raise PrepareFailed(exc.command, str(exc), exit_code=exc.exit_code,
                                            output_tail=exc.output_tail) from None

            prep = Preparer(self.settings, self.node_dir, self.trainer_env(), fetcher=fetcher,
                            library=self.cfg.library, interrupted=interrupted, cache=self.env_cache, image=image,
                            image_ready=image_ready)
            prep.fetch_workdir()
            prep.find_interpreter()
            prep.install_library()
            image_ready()
            # The library is in the interpreter's environment now: a previous life's local-only checkpoints go up
            # before anything else runs (setup can take long; a checkpoint only on this disk is at risk).
            uploaded = upload_previous_life(self.local_ckpt_dir, self.settings.checkpoint_uri,
                                            timeout=self.upload_timeout_seconds, interrupted=interrupted,
                                            python=prep.python, env=prep.env,
                                            prefix=prep.helper(container.ROLE_HELPER))
            if image is not None and not uploaded:
                image.clear(container.ROLE_HELPER, prep.env)  # stopped early or failed: none of it may go on
            if interrupted():
                raise Interrupted("previous-life upload")
            prefetch = Prefetch(self.local_ckpt_dir, self.settings.checkpoint_uri, python=prep.python, env=prep.env,
                                prefix=prep.helper(container.ROLE_HELPER))
            try:
                if prep.run_setup() and prep.cache_plan is not None and self.env_cache is not None:
                    self.env_cache.upload_in_background(*prep.cache_plan, self.settings.cache)
                prefetch.wait(self.upload_timeout_seconds, interrupted)
            finally:
                prefetch.stop()
                if image is not None and prefetch.child is not None and prefetch.child.returncode != 0:
                    image.clear(container.ROLE_HELPER, prep.env)
        except Interrupted as exc:
            log("WARNING", "preparation stopped: the trainer is not started", during=str(exc),
                reason="notice" if self.notice.kind is not None else "SIGHUP")
            return None
        except (PrepareFailed, OSError) as exc:
            # OSError: the node's own trouble (a full disk, …); reported like a failed step rather than crashing the
            # agent, which systemd would restart into the same preparation again and again.
            failure = exc if isinstance(exc, PrepareFailed) else PrepareFailed(
                [AGENT, "prepare"], f"preparing the node failed: {exc}; check the node's disk "
                                              f"(df -h {self.node_dir})")
            if self._killed_by_shutdown(failure):
                log("WARNING", "preparation stopped by the node's shutdown: the trainer is not started",
                    failed_command=failure.command, exit_code=failure.exit_code)
                return None
            try:
                write_json(failed_path, {"key": failed_key, "failed_command": failure.command,
                                         "exit_code": failure.exit_code, "output_tail": failure.output_tail,
                                         "message": str(failure)})
            except OSError as exc2:
                log("WARNING", "cannot record the failed preparation; a restarted agent would prepare again",
                    path=failed_path, error=str(exc2))
            self.failure = failure
            return None
        try:
            os.unlink(failed_path)
        except FileNotFoundError:
            pass
        log("INFO", "preparation finished", seconds=round(time.monotonic() - started, 3), workdir=prep.workdir,
            interpreter=prep.python)
        self.prepared = prep
        return prep

    def _killed_by_shutdown(self, failure: PrepareFailed) -> bool:
        """A step killed by a signal while the node goes down is not a failed setup: the power-off signals every
        process at once, so the step's death can be seen before the agent's own SIGTERM or the notice is."""
        code = failure.exit_code
        if code is None or not (code < 0 or 128 < code <= 128 + 64):  # killed by a signal (-N or the shell's 128+N)
            return False
        deadline = time.monotonic() + SHUTDOWN_SIGNAL_GRACE_S
        while not self.notice.interrupted() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.notice.interrupted()
