"""The demo's Cloud Functions: every entry point of one source file served by one process, each at a path of its own
(`/on_sweep`, ...), each through the Functions Framework app for its target (what the `functions-framework` command
serves for one). Cloud Functions gives each function instances of its own; here they share an interpreter, so the
control plane's client libraries are imported once per demo, not once per function (about 12 s of CPU a demo).

    python -m sim.functions_host --source functions/main.py --port 8080 on_job_created on_sweep ...

`start` runs that process for every entry point of respawn.deployment.FUNCTIONS; `subscribe` gives each
Pub/Sub-triggered one a push subscription on its topic, as its Eventarc trigger does in a deployment.
"""

from __future__ import annotations

import argparse
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Callable, Iterable

from respawn import deployment

SOURCE = Path(__file__).resolve().parents[1] / "functions" / "main.py"


class HostError(RuntimeError):
    pass


def start(env: dict[str, str], port: int, out: IO[bytes], log: Path,
          timeout: float = 60) -> tuple[subprocess.Popen, dict[str, str]]:
    """The functions' process (its own session: stop it by its group) listening on 127.0.0.1:port, and each entry
    point's URL. HostError naming `log` when it exits or does not listen within `timeout`."""
    targets = [fn.entry_point for fn in deployment.FUNCTIONS]
    proc = subprocess.Popen([sys.executable, "-m", "sim.functions_host", "--source", str(SOURCE), "--port", str(port),
                             *targets], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            cwd=SOURCE.parents[1], start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise HostError(f"the functions exited with code {proc.returncode} while starting; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise HostError(f"the functions did not listen on 127.0.0.1:{port} within {timeout:.0f} s; see {log}")
            time.sleep(0.1)
    return proc, {target: f"http://127.0.0.1:{port}/{target}" for target in targets}


def subscribe(project: str, urls: dict[str, str]) -> None:
    """A push subscription `{function}-push` on each Pub/Sub-triggered function's topic (the topic made if missing)."""
    from google.api_core import exceptions
    from google.cloud import pubsub_v1

    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    for fn in deployment.FUNCTIONS:
        if fn.trigger == "firestore":
            continue
        topic = publisher.topic_path(project, fn.trigger)
        try:
            publisher.create_topic(name=topic)
        except exceptions.AlreadyExists:
            pass
        subscriber.create_subscription(name=subscriber.subscription_path(project, f"{fn.name}-push"), topic=topic,
                                       push_config={"push_endpoint": urls[fn.entry_point]}, ack_deadline_seconds=120)


def dispatcher(source: str, targets: Iterable[str]) -> Callable:
    """A WSGI app that hands a request for /TARGET/... to TARGET's own app, unchanged (its CloudEvent route takes
    any path)."""
    import functions_framework

    apps = {t: functions_framework.create_app(target=t, source=source, signature_type="cloudevent") for t in targets}

    def app(environ, start_response):
        name = environ.get("PATH_INFO", "/").strip("/").split("/", 1)[0]
        if name not in apps:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [f"no function {name!r} here; served: {', '.join(apps)}\n".encode()]
        return apps[name](environ, start_response)

    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.functions_host", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True, help="the file that defines the functions")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("targets", nargs="+", help="the entry points to serve, each at /NAME")
    args = p.parse_args(argv)
    from werkzeug.serving import run_simple

    app = dispatcher(args.source, args.targets)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request: the functions log their own
    run_simple(args.host, args.port, app, threaded=True)  # a thread per request, as the Framework's gthread workers
    return 0


if __name__ == "__main__":
    sys.exit(main())
