"""sim/metadata.py through plain HTTP, as the node agent and google-auth talk to the real metadata server."""

from __future__ import annotations

import threading

import pytest
import requests

from sim.metadata import MetadataServer

H = {"Metadata-Flavor": "Google"}


@pytest.fixture
def md():
    server = MetadataServer(name="job-1", zone="us-central1-a", project="respawn-test",
                            attributes={"respawn-job": "job", "respawn-attempt": "1"})
    server.start()
    yield server
    server.stop()


def get(md, path, **params):
    return requests.get(md.url + path, headers=H, params=params, timeout=10)


def test_values_and_flavor_header(md):
    r = get(md, "instance/preempted")
    assert (r.status_code, r.text, r.headers["Metadata-Flavor"]) == (200, "FALSE", "Google")
    assert get(md, "instance/maintenance-event").text == "NONE"
    assert get(md, "instance/name").text == "job-1"
    assert get(md, "instance/zone").text.endswith("/zones/us-central1-a")
    assert get(md, "instance/attributes/respawn-job").text == "job"
    assert get(md, "instance/attributes/").text.split() == ["respawn-attempt", "respawn-job"]
    assert get(md, "instance/attributes/", recursive="true").json() == {"respawn-attempt": "1", "respawn-job": "job"}
    assert get(md, "instance/attributes/missing").status_code == 404
    no_header = requests.get(md.url + "instance/preempted", timeout=10)
    assert no_header.status_code == 403


def test_wait_for_change_wakes_on_set(md):
    first = get(md, "instance/preempted")
    result = {}

    def waiter():
        result["r"] = get(md, "instance/preempted", wait_for_change="true", last_etag=first.headers["ETag"])

    t = threading.Thread(target=waiter)
    t.start()
    t.join(0.3)
    assert t.is_alive(), "a hanging GET returned before the value changed"
    md.set("instance/preempted", "TRUE")
    t.join(10)
    assert result["r"].text == "TRUE"
    assert result["r"].headers["ETag"] != first.headers["ETag"]


def test_stale_etag_returns_at_once_and_timeout_sec_returns_current(md):
    md.set("instance/preempted", "TRUE")
    r = get(md, "instance/preempted", wait_for_change="true", last_etag="stale")
    assert r.text == "TRUE"
    r2 = get(md, "instance/preempted", wait_for_change="true", last_etag=r.headers["ETag"], timeout_sec="0.2")
    assert (r2.status_code, r2.text, r2.headers["ETag"]) == (200, "TRUE", r.headers["ETag"])


def test_faults_503_and_dropped_connections(md):
    md.fail_next(2)
    assert get(md, "instance/preempted").status_code == 503
    assert get(md, "instance/preempted").status_code == 503
    md.drop_next(1)
    with pytest.raises(requests.ConnectionError):
        get(md, "instance/preempted")
    assert get(md, "instance/preempted").text == "FALSE"


def test_stop_releases_hanging_requests(md):
    errors = []

    def waiter():
        try:
            get(md, "instance/maintenance-event", wait_for_change="true")
        except requests.RequestException as exc:  # either answer or closed connection is fine; hanging is not
            errors.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    t.join(0.2)
    md.stop()
    t.join(10)
    assert not t.is_alive()


def test_google_auth_finds_it_through_gce_metadata_host(md):
    """google-auth reads GCE_METADATA_HOST at import, so check it in a fresh interpreter, as a node process is."""
    import os
    import subprocess
    import sys

    code = (
        "import google.auth.compute_engine as ce, google.auth.transport.requests as r\n"
        "c = ce.Credentials(); c.refresh(r.Request()); print(c.token, c.service_account_email)"
    )
    env = dict(os.environ, GCE_METADATA_HOST=md.host)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "sim-token"
