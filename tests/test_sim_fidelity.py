"""Every body sim/ serves on a Compute Engine or Cloud TPU path parses *strictly* as the real API's type: no field
the type lacks, no value out of its range (a TPU node id above int64 once made one node in twelve unreadable to the
real client, and with it every reconcile and the orphan scan). The real clients drive the flows through a recording
proxy; each body it saw is parsed with the client's own proto types, unknown fields refused. Beside this parse,
tests/test_discovery_bodies.py checks every route's answers, and every request Respawn sends, against Google's
discovery documents (which mark no field required: the proto parse is the stricter on types, they on URLs)."""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from google.cloud import compute_v1, tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import json_format

from sim.http_api import _COMPILED
from google.auth.credentials import AnonymousCredentials

from sim_fixtures import PROJECT, compute_clients, compute_result, sim_factory, sim_server, tpu_client  # noqa: F401
from test_sim_compute import spot_instance
from test_sim_tpu import spot_node
from test_sim_tpu_queued import request as queued_request

ZONE = "us-central1-a"
TPU_ZONE = "europe-west4-a"
_OP = compute_v1.Operation
# Each API route of sim/http_api.py → the type its successful answer has in the real API.
ANSWER_TYPES = {
    "c_insert": _OP, "c_delete": _OP, "c_start": _OP, "c_stop": _OP, "c_set_metadata": _OP, "c_op": _OP,
    "c_wait": _OP, "c_ops": compute_v1.OperationList, "c_list": compute_v1.InstanceList, "c_get": compute_v1.Instance,
    "c_image": compute_v1.Image, "c_image_family": compute_v1.Image, "c_serial": compute_v1.SerialPortOutput,
    "c_advice_capacity": compute_v1.CapacityAdviceResponse, "c_advice_history": compute_v1.CapacityHistoryResponse,
    "c_region": compute_v1.Region,
    "t_create": operations_pb2.Operation, "t_delete": operations_pb2.Operation, "t_op": operations_pb2.Operation,
    "t_get": tpu_v2.Node, "t_list": tpu_v2.ListNodesResponse,
    "t_qr_create": operations_pb2.Operation, "t_qr_delete": operations_pb2.Operation,
    "t_qr_get": tpu_v2.QueuedResource, "t_qr_list": tpu_v2.ListQueuedResourcesResponse,
}


def route_of(method: str, path: str) -> str | None:
    return next((h for m, rx, h in _COMPILED if m == method and rx.match(path)), None)


@dataclass(frozen=True)
class Exchange:
    """One request through the proxy and the sim's answer (tests/test_discovery_bodies.py checks both)."""
    method: str
    url: str  # path and query, as sent
    route: str | None  # the sim route that served it (sim/http_api.py), None if none did
    request: bytes
    status: int
    answer: bytes


class RecordingProxy:
    """Forwards every request to the sim; keeps every exchange, and (route, path, body) of each 2xx answer."""

    def __init__(self, target: str):
        self.target = urlsplit(target).netloc
        self.seen: list[tuple[str, str, bytes]] = []
        self.exchanges: list[Exchange] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(proxy.target, timeout=60)
                conn.request(self.command, self.path, body=body or None,
                             headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                answer = conn.getresponse()
                data = answer.read()
                path = urlsplit(self.path).path
                route = route_of(self.command, path)
                proxy.exchanges.append(Exchange(self.command, self.path, route, body, answer.status, data))
                if 200 <= answer.status < 300:
                    proxy.seen.append((route or f"{self.command} {path}", path, data))
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(sim_server):
    p = RecordingProxy(sim_server.endpoint)
    yield p
    p.close()


def strict(route: str, path: str, data: bytes) -> None:
    kind = ANSWER_TYPES.get(route)
    assert kind is not None, f"{route} ({path}): the sim serves it, but this test does not know its real type; add it"
    message = kind() if kind is operations_pb2.Operation else kind.pb()()
    try:
        json_format.Parse(data, message, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        pytest.fail(f"{route} ({path}) is not a valid {type(message).__name__}: {exc}\n{data[:2000]!r}")


def test_every_compute_answer_parses_strictly(sim_server, proxy):
    instances, ops = compute_clients(proxy.endpoint)
    for i in range(3):
        compute_result(ops, PROJECT, ZONE, instances.insert_unary(project=PROJECT, zone=ZONE,
                                                                  instance_resource=spot_instance(f"job-a-{i}")))
    instances.get(project=PROJECT, zone=ZONE, instance="job-a-0")
    list(instances.list(project=PROJECT, zone=ZONE))
    got = instances.get(project=PROJECT, zone=ZONE, instance="job-a-1")
    meta = compute_v1.Metadata(fingerprint=got.metadata.fingerprint, items=[compute_v1.Items(key="k", value="v")])
    compute_result(ops, PROJECT, ZONE, instances.set_metadata_unary(project=PROJECT, zone=ZONE, instance="job-a-1",
                                                                    metadata_resource=meta))
    instances.get_serial_port_output(request=compute_v1.GetSerialPortOutputInstanceRequest(
        project=PROJECT, zone=ZONE, instance="job-a-0", start=-4000))
    compute_result(ops, PROJECT, ZONE, instances.stop_unary(project=PROJECT, zone=ZONE, instance="job-a-1"))
    compute_result(ops, PROJECT, ZONE, instances.start_unary(project=PROJECT, zone=ZONE, instance="job-a-1"))
    compute_result(ops, PROJECT, ZONE, instances.delete_unary(project=PROJECT, zone=ZONE, instance="job-a-2"))
    images = compute_v1.ImagesClient(credentials=AnonymousCredentials(), transport="rest",
                                     client_options={"api_endpoint": proxy.endpoint})
    images.get_from_family(project="deeplearning-platform-release",
                           family="common-cu129-ubuntu-2404-nvidia-580")
    seen = {route for route, _, _ in proxy.seen}
    assert {"c_insert", "c_get", "c_list", "c_set_metadata", "c_stop", "c_start", "c_delete", "c_image_family",
            "c_serial"} <= seen
    for route, path, data in proxy.seen:
        strict(route, path, data)


def test_every_advice_and_region_answer_parses_strictly(sim_server, proxy):
    # Capacity advice (set, from the timeline, several zones at once), its history, and a region's quotas, each
    # asked with the request bodies respawn.advice builds, parsed strictly as the request types on the way out.
    import json

    from respawn import advice

    kw = dict(credentials=AnonymousCredentials(), transport="rest", client_options={"api_endpoint": proxy.endpoint})
    client, regions = compute_v1.AdviceClient(**kw), compute_v1.RegionsClient(**kw)
    sim_server.set_advice("us-central1-b", "g2-standard-8", obtainability=0.25, estimated_uptime=600,
                          preemption_rates=[0.5], prices=[0.3])
    sim_server.set_capacity("us-central1-c", "nvidia-tesla-t4", 0, provisioning_model="SPOT")
    sim_server.set_quota("us-central1", "nvidia-tesla-t4", 2)
    for shape in (advice.Shape("g2-standard-8"), advice.Shape("n1-standard-8", "nvidia-tesla-t4", 2)):
        for zone in ("us-central1-a", "us-central1-b", "us-central1-c"):
            body = compute_v1.CapacityAdviceRequest.from_json(json.dumps(advice.capacity_request(shape, zone, 2)),
                                                              ignore_unknown_fields=False)
            client.capacity(project=PROJECT, region="us-central1", capacity_advice_request_resource=body)
        body = compute_v1.CapacityHistoryRequest.from_json(json.dumps(advice.history_request(shape, "us-central1-b")),
                                                           ignore_unknown_fields=False)
        client.capacity_history(project=PROJECT, region="us-central1", capacity_history_request_resource=body)
    whole_region = advice.capacity_request(advice.Shape("g2-standard-8"), "us-central1-a")
    del whole_region["distributionPolicy"]
    client.capacity(project=PROJECT, region="us-central1", capacity_advice_request_resource=(
        compute_v1.CapacityAdviceRequest.from_json(json.dumps(whole_region))))
    regions.get(project=PROJECT, region="us-central1")
    seen = {route for route, _, _ in proxy.seen}
    assert {"c_advice_capacity", "c_advice_history", "c_region"} <= seen
    for route, path, data in proxy.seen:
        strict(route, path, data)


def test_every_tpu_answer_parses_strictly(sim_server, proxy):
    client = tpu_client(proxy.endpoint)
    parent = f"projects/{PROJECT}/locations/{TPU_ZONE}"
    # Enough nodes that a numeric id drawn out of int64's range would show (one in twelve did).
    ops = [client.create_node(parent=parent, node_id=f"job-t-{i}", node=spot_node()) for i in range(24)]
    for op in ops:
        op.result(timeout=60)
    nodes = list(client.list_nodes(parent=parent))
    assert len(nodes) == 24 and all(0 < n.id < 2**63 for n in nodes)
    client.get_node(name=f"{parent}/nodes/job-t-0")
    client.delete_node(name=f"{parent}/nodes/job-t-1").result(timeout=60)
    seen = {route for route, _, _ in proxy.seen}
    assert {"t_create", "t_op", "t_list", "t_get", "t_delete"} <= seen
    for route, path, data in proxy.seen:
        strict(route, path, data)


def test_every_queued_resource_answer_parses_strictly(sim_server, proxy):
    # Every state a request shows on its way: waiting, failed (its wait over), active, suspended (preempted).
    client = tpu_client(proxy.endpoint)
    parent = f"projects/{PROJECT}/locations/{TPU_ZONE}"
    sim_server.set_capacity(TPU_ZONE, "v5litepod-8", 0)
    client.create_queued_resource(parent=parent, queued_resource_id="job-q-1",
                                  queued_resource=queued_request("job-q-1", wait_s=1)).result(timeout=30)
    name = f"{parent}/queuedResources/job-q-1"
    sim_server.wait_for(lambda: client.get_queued_resource(name=name).state.state.name == "FAILED", 20, "FAILED")
    client.delete_queued_resource(name=name).result(timeout=30)
    sim_server.set_capacity(TPU_ZONE, "v5litepod-8", None)
    client.create_queued_resource(parent=parent, queued_resource_id="job-q-2",
                                  queued_resource=queued_request("job-q-2")).result(timeout=30)
    name = f"{parent}/queuedResources/job-q-2"
    sim_server.wait_for(lambda: client.get_queued_resource(name=name).state.state.name == "ACTIVE", 20, "ACTIVE")
    list(client.list_queued_resources(parent=parent))
    sim_server.preempt(TPU_ZONE, "job-q-2")
    sim_server.wait_for(lambda: client.get_queued_resource(name=name).state.state.name == "SUSPENDED", 20, "SUSPENDED")
    client.get_queued_resource(name=name)
    seen = {route for route, _, _ in proxy.seen}
    assert {"t_qr_create", "t_qr_get", "t_qr_list", "t_qr_delete", "t_op"} <= seen
    for route, path, data in proxy.seen:
        strict(route, path, data)
