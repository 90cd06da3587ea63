"""The CLI against endpoints that do not answer (issue 46 item 4), as real processes: a stopped emulator (nothing
listens on its port any more: a demo's `--keep` that ended, its `export` lines still set), a hung one (it accepts
connections and never answers) and one that answers the CLI's probe and then hangs on every call. Every command that
talks to Firestore, Cloud Storage, Pub/Sub or Compute Engine ends with one line naming the endpoint and what to do,
never a traceback (within 10 s: the probe's and each call's deadlines, respawn.app.endpoints; the processes run under
a generous timeout, the seconds are not asserted); the other stores still work. The commands run as processes forked
from one that has imported the CLI (tests/respawn_forks.py), several at once; `zones` as `python -m respawn` itself."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

import test_cli_errors
from respawn.app import endpoints
from tests.respawn_forks import respawn_forks  # noqa: F401 - a fixture

# A command that hangs is ended here and fails its test (the seconds it takes are not asserted).
HUNG_S = 120
SPEC = {**test_cli_errors.SPEC, "id": "far-job", "checkpoint_uri": "gs://far-bucket/far-job"}
FIRESTORE_COMMANDS = [["jobs", "list"], ["jobs", "describe", "far-job"], ["jobs", "events", "far-job"],
                      ["jobs", "report", "far-job", "-o", "r.html"], ["jobs", "logs", "far-job"],
                      ["jobs", "cancel", "far-job"], ["jobs", "resume", "far-job", "--budget", "5"],
                      ["jobs", "register", "job.yaml"], ["chaos", "far-job", "--yes"],
                      ["plan", "--from-stats", "nvidia-l4"]]


def dead_port() -> int:
    """A port nothing listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def hung_port():
    """A listener that takes connections into its backlog and never answers (a stopped, not exited, server)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def answers_then_hangs():
    """A server that answers the CLI's probe (an HTTP GET /) and then never answers a call: a gRPC call's HTTP/2
    preface or a REST request is read and left hanging, its connection held open."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return  # closed: the test is over
            held.append(conn)
            conn.settimeout(5)
            try:
                if conn.recv(65536).startswith(b"GET / HTTP/1."):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    conn.close()
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()
    for conn in held:
        conn.close()


def timed(argv: list[str], cwd: Path, env: dict[str, str], forks=None) -> tuple[subprocess.CompletedProcess, float]:
    """`python -m respawn ARGV`, forked from the fork server when given, and the seconds it took (said on failure)."""
    started = time.monotonic()
    if forks is not None:
        r = forks.run(argv, cwd, env, timeout=HUNG_S)
    else:
        r = subprocess.run([sys.executable, "-m", "respawn", *argv], capture_output=True, text=True, cwd=cwd,
                           env=env, timeout=HUNG_S)
    return r, time.monotonic() - started


def each(forks, argvs: list[list[str]], cwd: Path,
         env: dict[str, str]) -> list[tuple[subprocess.CompletedProcess, float]]:
    """Several at once: each waits on its endpoint's deadlines, which are not asserted."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda argv: timed(argv, cwd, env, forks), argvs))


def assert_one_line(r: subprocess.CompletedProcess, took: float, *said: str) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    assert r.returncode == 1, (r.args, r.stdout, r.stderr, took)
    # Progress while a call is slow (endpoints.waiting) may come before it; the error is one line.
    lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("still waiting for ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for words in said:
        assert words in lines[0], (r.args, lines[0])


def kept_env(firestore: str, **more: str) -> dict[str, str]:
    """The environment a demo's `--keep` leaves in a shell: its export lines (no other emulator of this session's)."""
    env = {k: v for k, v in os.environ.items() if k not in endpoints.DEMO_EXPORTS and k != "PUBSUB_EMULATOR_HOST"}
    return {**env, "FIRESTORE_EMULATOR_HOST": firestore, "GOOGLE_CLOUD_PROJECT": "respawn-local", "COLUMNS": "200",
            **more}


def test_every_firestore_command_fails_fast_on_a_stopped_emulator(tmp_path, respawn_forks):  # noqa: F811
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(SPEC))
    port = dead_port()
    env = kept_env(f"127.0.0.1:{port}", STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{port}")
    for r, took in each(respawn_forks, FIRESTORE_COMMANDS, tmp_path, env):
        assert_one_line(r, took, f"the Firestore emulator at 127.0.0.1:{port} (FIRESTORE_EMULATOR_HOST) does not "
                                 "answer (connection refused", "a demo's `--keep`",
                        "unset FIRESTORE_EMULATOR_HOST STORAGE_EMULATOR_HOST GOOGLE_CLOUD_PROJECT")


@pytest.mark.parametrize("server", ["hung_port", "answers_then_hangs"])
def test_describe_list_and_cancel_end_on_a_hung_emulator(tmp_path, request, server, respawn_forks):  # noqa: F811
    """Hung at the probe, or hung after it: the probe's deadline, or the call's (jobstore.RPC), ends the command."""
    port = request.getfixturevalue(server)
    env = kept_env(f"127.0.0.1:{port}")
    why = endpoints.late(endpoints.PROBE_TIMEOUT_S if server == "hung_port" else endpoints.CALL_DEADLINE_S)
    for r, took in each(respawn_forks, [["jobs", "list"], ["jobs", "describe", "far-job"], ["jobs", "cancel", "far-job"]],
                        tmp_path, env):
        assert_one_line(r, took, f"the Firestore emulator at 127.0.0.1:{port} (FIRESTORE_EMULATOR_HOST) does not "
                                 f"answer ({why}", "unset FIRESTORE_EMULATOR_HOST GOOGLE_CLOUD_PROJECT")


@pytest.mark.parametrize("server", ["dead_port", "hung_port", "answers_then_hangs"])
def test_zones_names_a_compute_stand_in_that_does_not_answer(tmp_path, request, server):
    """`respawn zones --region` lists the region's zones from Compute Engine (the sim's, in a local run): stopped,
    hung, or hung after the probe, it is named in one line, the offline price still given."""
    port = dead_port() if server == "dead_port" else request.getfixturevalue(server)
    env = kept_env(f"127.0.0.1:{port}", RESPAWN_COMPUTE_ENDPOINT=f"http://127.0.0.1:{port}")
    r, took = timed(["zones", "--accelerator", "nvidia-l4", "--machine-type", "g2-standard-8", "--region",
                     "us-central1"], tmp_path, env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.stderr, took)
    why = {"dead_port": "connection refused", "hung_port": endpoints.late(endpoints.PROBE_TIMEOUT_S),
           "answers_then_hangs": endpoints.late(endpoints.CALL_DEADLINE_S)}[server]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: could not list the zones of us-central1: the Compute Engine emulator at "
                           f"127.0.0.1:{port} (RESPAWN_COMPUTE_ENDPOINT) does not answer ({why}"), last
    assert "unset FIRESTORE_EMULATOR_HOST GOOGLE_CLOUD_PROJECT RESPAWN_COMPUTE_ENDPOINT" in last, last
    assert "g2-standard-8 in us-central1: Spot $" in r.stderr


def test_logs_name_a_stopped_storage_emulator_and_cancel_a_stopped_pubsub(firestore_db, project, tmp_path,
                                                                          respawn_forks):  # noqa: F811
    """Firestore answers; the job's logs are on a Cloud Storage emulator that stopped, and the cancel's nudge goes to
    a Pub/Sub emulator that stopped: the logs fail in a line naming the storage emulator, the cancel is recorded and
    says in a note that the controller could not be woken, and why."""
    from sim import emulators

    gcs = emulators.start_storage("far-bucket", log_dir=tmp_path)
    url = gcs.url
    gcs.stop()  # as a demo's --keep does once it ends
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(SPEC))
    env = {**os.environ, "STORAGE_EMULATOR_HOST": url, "PUBSUB_EMULATOR_HOST": f"127.0.0.1:{dead_port()}",
           "COLUMNS": "200"}
    r, _ = timed(["jobs", "register", "job.yaml", "--project", project], tmp_path, env, respawn_forks)
    assert r.returncode == 0, r.stderr
    (logs, took), (cancel, cancel_took) = each(respawn_forks, [["jobs", "logs", "far-job", "--project", project],
                                                               ["jobs", "cancel", "far-job", "--project", project]],
                                               tmp_path, env)
    host = url.removeprefix("http://")
    assert_one_line(logs, took, f"the Cloud Storage emulator at {host} (STORAGE_EMULATOR_HOST) does not answer")
    assert cancel.returncode == 0, (cancel.stderr, cancel_took)
    assert "cancel requested for far-job" in cancel.stdout
    assert "could not publish to topic" in cancel.stderr and "the Pub/Sub emulator at 127.0.0.1:" in cancel.stderr


def test_a_slow_call_shows_progress_until_it_returns(capsys, monkeypatch):
    monkeypatch.setattr(endpoints, "PROGRESS_AFTER_S", 0.05)
    monkeypatch.setattr(endpoints, "PROGRESS_EVERY_S", 0.05)
    with endpoints.waiting("the Firestore emulator at 127.0.0.1:1"):
        deadline = time.monotonic() + HUNG_S
        said = ""
        while "still waiting" not in said and time.monotonic() < deadline:
            time.sleep(0.05)
            said += capsys.readouterr().err
    assert "still waiting for the Firestore emulator at 127.0.0.1:1: " in said
    capsys.readouterr()  # a line told after the last read but before the call returned is fine
    time.sleep(0.2)  # four periods: a teller still going would say something
    assert capsys.readouterr().err == "", "the progress line went on after the call returned"
