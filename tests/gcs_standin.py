"""A stand-in for the Cloud Storage JSON API that answers object reads and uploads with fixed statuses, for the
refusals the emulator cannot produce (403, 412). The real google-cloud-storage client reaches it through
STORAGE_EMULATOR_HOST.

    python tests/gcs_standin.py --get 403 --upload 403 [--size N] [--log FILE] [--piece-seconds S]

Binds 127.0.0.1 on a free port and prints the port on its first line; logs "METHOD PATH?QUERY" per request (with
the Content-Range of a resumable upload's piece). With --upload 200, a resumable upload (uploadType=resumable) gets
a session, and each piece sent to it is answered after --piece-seconds: 308 while the total is unknown (bytes
A-B/*), 200 for the last piece — a slow Cloud Storage for uploads a notice must stop half-way. --media-seconds S
delays the answer to each one-request upload (uploadType=media: the agent's log chunks) the same way; such an upload
is logged as it arrives, the others as they are answered.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

# What Cloud Storage says, in its JSON error shape, for each status the tests use.
MESSAGES = {
    401: ("required", "Anonymous caller does not have storage.objects.create access."),
    403: ("forbidden", "alice@example.com does not have storage.objects.create access to the Google Cloud Storage "
                       "object. Permission 'storage.objects.create' denied on resource (or it may not exist)."),
    404: ("notFound", "No such object."),
    412: ("conditionNotMet", "At least one of the pre-conditions you specified did not hold."),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--get", type=int, required=True, help="status of object reads (200: an object of --size)")
    parser.add_argument("--upload", type=int, required=True, help="status of uploads (200: accepted)")
    parser.add_argument("--size", type=int, default=0)
    parser.add_argument("--log")
    parser.add_argument("--piece-seconds", type=float, default=0.0)
    parser.add_argument("--media-seconds", type=float, default=0.0)
    args = parser.parse_args()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:  # the request log goes to --log, not stderr
            pass

        def _answer(self, status: int, name: str, logged: bool = False) -> None:
            if not logged:
                self._log_line()
            if status == 200:
                body = {"kind": "storage#object", "name": name, "bucket": "b", "size": str(args.size),
                        "generation": "1", "metageneration": "1"}
            else:
                reason, message = MESSAGES[status]
                body = {"error": {"code": status, "message": message,
                                  "errors": [{"message": message, "domain": "global", "reason": reason}]}}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _drain(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)

        def do_GET(self) -> None:
            self._answer(args.get, unquote(urlsplit(self.path).path.rsplit("/o/", 1)[-1]))

        def do_POST(self) -> None:
            self._drain()  # answering before the body is read would reset the client's connection
            if args.upload == 200 and "uploadType=resumable" in self.path:
                self._log_line()
                self.send_response(200)
                self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}{self.path}"
                                             "&upload_id=1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            media = "uploadType=media" in self.path
            if media:  # logged as it arrives: a test can act while the send is in flight
                self._log_line()
                time.sleep(args.media_seconds)
            self._answer(args.upload, "", logged=media)

        def do_PUT(self) -> None:
            self._drain()
            piece = self.headers.get("Content-Range", "")
            if args.upload == 200 and "upload_id=" in self.path:
                time.sleep(args.piece_seconds)
                if piece.endswith("/*"):
                    self._log_line()
                    self.send_response(308)
                    self.send_header("Range", "bytes=0-" + piece.split("-")[1].split("/")[0])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            self._answer(args.upload, "")

        def do_DELETE(self) -> None:  # a write too: answered as uploads are
            self._answer(args.upload, "")

        def _log_line(self) -> None:
            if args.log:
                piece = self.headers.get("Content-Range")
                with open(args.log, "a") as log:
                    log.write(f"{self.command} {self.path}" + (f" {piece}" if piece else "") + "\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
