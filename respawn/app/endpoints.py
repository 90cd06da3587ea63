"""Whether the endpoint of a Google Cloud service the CLI is about to call answers, asked once per process before its
client is made, and a progress line while a call that does answer is slow.

A client library retries an endpoint that does not answer for minutes (Firestore's default retry deadline is 300 s)
and prints nothing meanwhile. One cheap probe first — an HTTP request to an emulator (FIRESTORE_EMULATOR_HOST and
the like), a TCP connection to the Google API host otherwise — turns that into one line within seconds, naming the
endpoint and the likely cause. The client libraries themselves are left as they are: each call the CLI makes passes
its own deadline, CALL_DEADLINE_S (respawn.app.jobstore.RPC, codestore, compute_read), so an endpoint that answers
the probe and then stops answering still ends the command within 10 s, in the same line (`unanswered`).
"""

from __future__ import annotations

import http.client
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit

# Connect and first answer: well inside the 10 s a command may take to say its endpoint is gone (issue 46).
PROBE_TIMEOUT_S = 4.0
# Each call's deadline, its retries included: the probe's answer, then a call that never answers, still ends the
# command within the 10 s (the interpreter's start, the probe, the call).
CALL_DEADLINE_S = 5.0
# A call slower than this shows a line on stderr, and again every PROGRESS_EVERY_S, until it returns.
PROGRESS_AFTER_S = 2.0
PROGRESS_EVERY_S = 5.0
# What `respawn demo --keep` exports for the CLI (sim/demo/runner.py's cli_env).
DEMO_EXPORTS = ("FIRESTORE_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST", "STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "grpc_proxy", "ALL_PROXY", "all_proxy")


@dataclass(frozen=True)
class Service:
    name: str  # as a user knows it
    emulator_var: str  # the variable that points the client library at an emulator
    host: str  # the Google API's host


FIRESTORE = Service("Firestore", "FIRESTORE_EMULATOR_HOST", "firestore.googleapis.com")
PUBSUB = Service("Pub/Sub", "PUBSUB_EMULATOR_HOST", "pubsub.googleapis.com")
STORAGE = Service("Cloud Storage", "STORAGE_EMULATOR_HOST", "storage.googleapis.com")
# Local runs: the sim's Compute Engine and Cloud TPU (respawn.deployment.ENV_COMPUTE_ENDPOINT), a URL.
COMPUTE = Service("Compute Engine", "RESPAWN_COMPUTE_ENDPOINT", "compute.googleapis.com")
TPU = Service("Cloud TPU", "RESPAWN_TPU_ENDPOINT", "tpu.googleapis.com")


class Unreachable(Exception):
    """The endpoint did not answer; the message is one line saying which, why, and what to do."""


_answered: set[tuple[str, str]] = set()  # (service, endpoint) that answered in this process: not asked again


def emulator(service: Service) -> tuple[str, int] | None:
    """(host, port) of the emulator the environment points `service` at, or None (the Google API)."""
    value = os.environ.get(service.emulator_var, "").strip()
    if not value:
        return None
    parts = urlsplit(value if "://" in value else f"http://{value}")
    return parts.hostname or "localhost", parts.port or 80


def where(service: Service, project: str | None = None) -> str:
    """The endpoint as a user would name it: the emulator at host:port, or the service of a project."""
    found = emulator(service)
    if found is not None:
        return f"the {service.name} emulator at {found[0]}:{found[1]}"
    return f"{service.name} ({service.host}" + (f", project {project})" if project else ")")


def check(service: Service, project: str | None = None) -> None:
    """Raise Unreachable unless the endpoint answers within PROBE_TIMEOUT_S."""
    found = emulator(service)
    key = (service.name, f"{found[0]}:{found[1]}" if found else service.host)
    if key in _answered:
        return
    if found is not None:
        why = _http_answers(*found)
    elif not any(os.environ.get(v) for v in PROXY_VARS):  # behind a proxy only the client's own call can tell
        why = _tcp_answers(service.host, 443)
    else:
        why = ""
    if why:
        raise Unreachable(unanswered(service, why, project))
    _answered.add(key)


def unanswered(service: Service, why: str, project: str | None = None) -> str:
    """The one line for an endpoint that does not answer (at the probe, or a call past its deadline): which, why, and
    the likely cause — a demo's `--keep` that ended, for an emulator; this machine's network, for the Google API."""
    if emulator(service) is not None:
        kept = [v for v in dict.fromkeys((*DEMO_EXPORTS, service.emulator_var)) if os.environ.get(v)]
        return (f"{where(service)} ({service.emulator_var}) does not answer ({why}): if a demo's `--keep` started it "
                f"and has ended, unset its `export` lines (unset {' '.join(kept)}); else start the emulator or point "
                f"{service.emulator_var} at one that runs")
    return (f"{where(service, project)} does not answer ({why}): check this machine's network (DNS, firewall, a proxy "
            "to set in HTTPS_PROXY) and retry")


def late(seconds: float = CALL_DEADLINE_S) -> str:
    """Why, for a call past its deadline."""
    return f"no answer within {seconds:g} s"


def _http_answers(host: str, port: int) -> str:
    """'' when an HTTP request to host:port gets an answer (any status), else why not."""
    conn = http.client.HTTPConnection(host, port, timeout=PROBE_TIMEOUT_S)
    try:
        conn.request("GET", "/")
        conn.getresponse().read(1)
        return ""
    except socket.timeout:
        return f"no answer within {PROBE_TIMEOUT_S:g} s"
    except (OSError, http.client.HTTPException) as exc:
        return _said(exc)
    finally:
        conn.close()


def _tcp_answers(host: str, port: int) -> str:
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        return ""
    except socket.timeout:
        return f"no connection within {PROBE_TIMEOUT_S:g} s"
    except OSError as exc:
        return _said(exc)


def _said(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused: nothing listens there"
    if isinstance(exc, socket.gaierror):
        return f"name not resolved: {exc.strerror}"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


@contextmanager
def waiting(what: str) -> Iterator[None]:
    """Around a call that may be slow: after PROGRESS_AFTER_S, a line on stderr every PROGRESS_EVERY_S until it
    returns, so that a slow answer is told apart from a hang."""
    done = threading.Event()
    started = time.monotonic()

    def tell() -> None:
        wait = PROGRESS_AFTER_S
        while not done.wait(wait):
            print(f"still waiting for {what}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
            wait = PROGRESS_EVERY_S

    teller = threading.Thread(target=tell, name="progress", daemon=True)
    teller.start()
    try:
        yield
    finally:
        done.set()
        teller.join()
