"""The demo's Cloud Functions: every entry point of one source file served by one process, each at a path of its own
(`/on_sweep`, ...), each through the Functions Framework app for its target (what the `functions-framework` command
serves for one). Cloud Functions gives each function instances of its own; here they share an interpreter, so the
control plane's client libraries are imported once per demo, not once per function (about 12 s of CPU a demo).

    python -m sim.functions_host --source functions/main.py --port 8080 on_job_created on_sweep ...
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Iterable


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
