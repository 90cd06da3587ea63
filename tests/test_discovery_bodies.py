"""Every request Respawn sends and every answer sim/ serves, checked against Google's discovery documents (vendored
in tests/discovery/, with their revisions; tests/discovery_schema.py is the checker): unknown fields, wrong JSON
types, int64 not as a string, values outside an enum, URLs not of the method's shape, query parameters the method
does not take.

The product's own code makes the calls: the Compute and TPU providers through the client libraries, the CLI's
Compute reads, the controller's JSON-API adapters (managed folders, Cloud Monitoring, the Billing Catalog, log
retention) and the node agent's hand-written REST (Cloud Logging, Firestore, Pub/Sub, Cloud Storage), the
trainer's ranged reads and the startup script's download; the build's role and dashboard files are checked as the
bodies gcloud sends. What goes to sim/ passes a recording proxy; what goes to an emulator in local runs goes here to
a stand-in that records it and answers as the API does. The coverage rules: every sim route maps to a discovery
method (or is the sim's own control API), every mapped route is served here, every request lands on a method, and
every product file that talks to a Google API by hand is driven here (HAND_CALLERS).
"""

from __future__ import annotations

import json
import re
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials

import discovery_schema as discovery
from respawn.agent.cloudlog import CloudLog
from respawn.agent.firestore_rest import FirestoreWriter
from respawn.agent.heartbeat import compose_heartbeat
from respawn.agent.metadata import MetadataClient
from respawn.agent.nudge import Nudger
from respawn.agent.storage import Fetcher, Uploader
from respawn import advice, audit, contract, deployment, prices, selftest
from respawn.app import catalogcheck, firewallcheck, imagecheck, project_checks, quotacheck, selftest_run, zonereport
from respawn.app.compute_read import Reader
from respawn.control import clients as factory
from respawn.control import goodput_metrics
from respawn.control.adapters.advice import AdviceReader
from respawn.control.adapters.compute import ComputeProvider
from respawn.control.adapters.logstore import LogObjectsApi
from respawn.control.adapters.managed_folders import FolderGrants
from respawn.control.adapters.monitoring import MonitoringApi
from respawn.control.adapters.prices import CatalogApi
from respawn.control.adapters.tpu import QueuedTpuProvider, TpuProvider
from respawn.control.settings import NodeOptions
from respawn.logs import LABELS_FIELD, labels, set_labels
from respawn.schema import parse_spec
from sim import cloud_scheduler
from sim.http_api import ROUTES
from sim.metadata import MetadataServer
from sim.server import SimServer
from functions_fixtures import T4, gpu_spec, tpu_spec
from sim_fixtures import FAST, PROJECT
from test_sim_fidelity import Exchange, RecordingProxy

ROOT = Path(__file__).resolve().parents[1]
ZONE = "us-central1-a"
REGION = "us-central1"
PROBE = "0123456789abcdef"  # a self-test probe (respawn.selftest)
SCRIPT = "#!/bin/bash\ntrue\n"

# Each Google API route of sim/http_api.py → the discovery method it serves.
ROUTE_METHODS = {
    "c_insert": "compute.instances.insert", "c_list": "compute.instances.list", "c_get": "compute.instances.get",
    "c_delete": "compute.instances.delete", "c_start": "compute.instances.start", "c_stop": "compute.instances.stop",
    "c_set_metadata": "compute.instances.setMetadata",
    "c_simulate_maintenance": "compute.instances.simulateMaintenanceEvent",
    "c_serial": "compute.instances.getSerialPortOutput", "c_ops": "compute.zoneOperations.list",
    "c_op": "compute.zoneOperations.get", "c_wait": "compute.zoneOperations.wait", "c_image": "compute.images.get",
    "c_image_family": "compute.images.getFromFamily", "c_advice_capacity": "compute.advice.capacity",
    "c_advice_history": "compute.advice.capacityHistory", "c_region": "compute.regions.get",
    "c_firewall": "compute.firewalls.get", "c_zone": "compute.zones.get", "c_machine_type": "compute.machineTypes.get",
    "c_accelerator_type": "compute.acceleratorTypes.get",
    "t_accelerator_type": "tpu.projects.locations.acceleratorTypes.get",
    "m_time_series": "monitoring.projects.timeSeries.create", "l_entries_write": "logging.entries.write",
    "t_create": "tpu.projects.locations.nodes.create", "t_list": "tpu.projects.locations.nodes.list",
    "t_get": "tpu.projects.locations.nodes.get", "t_delete": "tpu.projects.locations.nodes.delete",
    "t_update": "tpu.projects.locations.nodes.patch", "t_op": "tpu.projects.locations.operations.get",
    "t_qr_create": "tpu.projects.locations.queuedResources.create",
    "t_qr_list": "tpu.projects.locations.queuedResources.list",
    "t_qr_get": "tpu.projects.locations.queuedResources.get",
    "t_qr_delete": "tpu.projects.locations.queuedResources.delete",
    "g_folder_insert": "storage.managedFolders.insert", "g_folder_policy": "storage.managedFolders.getIamPolicy",
    "g_folder_set_policy": "storage.managedFolders.setIamPolicy", "b_skus": "cloudbilling.services.skus.list",
    "l_sink_create": "logging.projects.sinks.create", "l_sink_get": "logging.projects.sinks.get",
    "l_sink_update": "logging.projects.sinks.update", "l_sink_delete": "logging.projects.sinks.delete",
    "j_get": "cloudscheduler.projects.locations.jobs.get", "j_pause": "cloudscheduler.projects.locations.jobs.pause",
    "j_resume": "cloudscheduler.projects.locations.jobs.resume",
    "u_list": "serviceusage.services.list", "u_enable": "serviceusage.services.enable",
    "u_disable": "serviceusage.services.disable", "i_account_get": "iam.projects.serviceAccounts.get",
    "i_account_create": "iam.projects.serviceAccounts.create",
    "i_account_delete": "iam.projects.serviceAccounts.delete", "r_project": "cloudresourcemanager.projects.get",
    "r_get_policy": "cloudresourcemanager.projects.getIamPolicy",
    "r_set_policy": "cloudresourcemanager.projects.setIamPolicy",
    "k_version_get": "secretmanager.projects.secrets.versions.get",
    "k_version_enable": "secretmanager.projects.secrets.versions.enable",
    "k_version_disable": "secretmanager.projects.secrets.versions.disable",
    "f_index_list": "firestore.projects.databases.collectionGroups.indexes.list",
    "f_index_create": "firestore.projects.databases.collectionGroups.indexes.create",
    "f_index_get": "firestore.projects.databases.collectionGroups.indexes.get",
    "f_index_delete": "firestore.projects.databases.collectionGroups.indexes.delete",
}
# Routes with no Google counterpart: the sim's own control surface (sim/README.md), which tests and the demo call.
CONTROL_PREFIX = "/sim/"

# Every product file that talks to a Google API by hand (FOUND: it names an endpoint, or sends through the CLI's
# Compute reader, the controller's JSON-API session or the agent's HTTP helper) → the drive here that sends its calls.
HAND_CALLERS = {
    "respawn/app/compute_read.py": "drive_cli", "respawn/app/catalogcheck.py": "drive_cli",
    "respawn/app/firewallcheck.py": "drive_cli", "respawn/app/imagecheck.py": "drive_cli",
    "respawn/app/quotacheck.py": "drive_cli",
    "respawn/app/zonereport.py": "drive_cli",
    "respawn/app/selftest_run.py": "test_the_self_tests_probes_to_logging_and_the_scheduler",
    "respawn/app/project_checks.py": "drive_doctor",
    "functions/adapters/managed_folders.py": "drive_controller_rest",
    "functions/adapters/monitoring.py": "drive_controller_rest",
    "functions/adapters/prices.py": "drive_controller_rest",
    "functions/adapters/logstore.py": "test_agent_and_trainer_requests",
    "node_agent/cloudlog.py": "drive_agent_logs", "node_agent/firestore_rest.py": "test_agent_and_trainer_requests",
    "node_agent/nudge.py": "test_agent_and_trainer_requests",
    "node_agent/storage.py": "test_agent_and_trainer_requests",
    "trainer/storage.py": "test_agent_and_trainer_requests", "deploy/vm/startup.sh": "test_agent_and_trainer_requests",
}
NOT_CALLERS = {
    "functions/settings.py": "names the adapters' default endpoints in comments only",
    "respawn/app/cli.py": "hands the Compute reader to respawn.app.zonereport, which makes the calls",
    "node_agent/metadata.py": "the metadata server, which has no discovery document",
}
FOUND = re.compile(r"https://[a-z0-9-]+\.googleapis\.com(?!/auth)|/storage/v1/|compute_read import|StorageJsonApi"
                   r"|adapters\.jsonapi import|import _http")


# --- the calls through sim/ -------------------------------------------------------------------------------------

def drive_compute(sim: SimServer, made: factory.Clients) -> None:
    """The GPU provider's every call, for each provisioning model, plus what only tests and the demo call."""
    sim.set_capacity(ZONE, T4, 1, provisioning_model="RESERVATION")
    gce = ComputeProvider(made, nodes=NodeOptions(subnetwork="regions/us-central1/subnetworks/default"))
    reservation = [{"model": "reservation", "reservation": "my-res", "zone": ZONE}, "spot"]
    specs = {
        "spot": parse_spec(gpu_spec("vm", labels={"team": "research"})),
        "standard": parse_spec(gpu_spec("vm", provisioning="standard", termination_action=None)),
        "preemptible": parse_spec(gpu_spec("vm", provisioning="preemptible", termination_action=None)),
        "reservation": parse_spec(gpu_spec("vm", provisioning=reservation, termination_action=None)),
        "flex-start": parse_spec(gpu_spec("vm", accelerator={"kind": "gpu", "machine_type": "g2-standard-8"},
                                          provisioning=[{"model": "flex-start", "max_run_hours": 2,
                                                         "wait_minutes": 30}], termination_action=None)),
    }
    for i, (model, spec) in enumerate(specs.items()):
        assert gce.create(spec, ZONE, f"vm-{model}", i + 1, model, SCRIPT, service_account="node-1@p.iam"), model
    gce.set_attributes(ZONE, "vm-spot", {"respawn-generation": "2"})
    assert gce.get(ZONE, "vm-spot") == "RUNNING" and gce.address(ZONE, "vm-spot")
    assert len(gce.list_labelled(ZONE)) == len(specs)
    gce.console_tail(ZONE, "vm-spot", 2000)
    sim.compute.global_resources.add_image(PROJECT, "my-image", family="my-family")
    for image in (specs["spot"].accelerator.boot_image, f"projects/{PROJECT}/global/images/my-image"):
        spec = parse_spec(gpu_spec("vm", accelerator={"kind": "gpu", "machine_type": "n1-standard-8",
                                                      "accelerator_type": T4, "boot_image": image}))
        assert gce.check_image(spec).verdict.name == "FOUND", image
    instances, ops = made.instances(), made.zone_operations()
    op = instances.stop_unary(project=PROJECT, zone=ZONE, instance="vm-standard")
    ops.wait(project=PROJECT, zone=ZONE, operation=op.name)
    gce.start(ZONE, "vm-standard")
    instances.simulate_maintenance_event_unary(project=PROJECT, zone=ZONE, instance="vm-standard")
    list(ops.list(project=PROJECT, zone=ZONE))
    # The answers of what goes wrong: a preempted VM, a flex-start VM waiting for capacity, and the operations of a
    # refused insert (the pool exhausted; the quota, with its quotaInfo details).
    sim.preempt(ZONE, "vm-spot")
    sim.wait_for(lambda: gce.get(ZONE, "vm-spot") == "TERMINATED", 20, "the preempted VM TERMINATED")
    sim.set_capacity(ZONE, "g2-standard-8", 0, provisioning_model="FLEX_START")
    assert gce.create(specs["flex-start"], ZONE, "vm-waiting", 9, "flex-start", SCRIPT)
    assert gce.get(ZONE, "vm-waiting") == "PENDING"
    sim.set_capacity(ZONE, T4, 0, provisioning_model="SPOT")
    with pytest.raises(gexc.ServiceUnavailable):
        gce.create(specs["spot"], ZONE, "vm-refused", 10, "spot", SCRIPT)
    sim.set_capacity(ZONE, T4, None, provisioning_model="SPOT")
    sim.set_quota(REGION, T4, 0, provisioning_model="SPOT")
    with pytest.raises(gexc.GoogleAPICallError) as quota:
        gce.create(specs["spot"], ZONE, "vm-refused", 11, "spot", SCRIPT)
    assert quota.value.errors[0].code == "QUOTA_EXCEEDED"
    sim.set_quota(REGION, T4, None, provisioning_model="SPOT")
    for name in [*(f"vm-{model}" for model in specs), "vm-waiting", "vm-refused"]:
        gce.delete(ZONE, name)


def drive_tpu(sim: SimServer, made: factory.Clients) -> None:
    tpu = TpuProvider(made)
    spec = parse_spec(tpu_spec("tpu"))
    assert tpu.create(spec, ZONE, "tpu-1", 1, "spot", SCRIPT)
    tpu.set_attributes(ZONE, "tpu-1", {"respawn-generation": "2"})
    assert tpu.get(ZONE, "tpu-1") == "READY" and tpu.address(ZONE, "tpu-1")
    assert tpu.list_labelled(ZONE)
    sim.preempt(ZONE, "tpu-1")
    sim.wait_for(lambda: tpu.get(ZONE, "tpu-1") == "PREEMPTED", 20, "the TPU node PREEMPTED")
    tpu.delete(ZONE, "tpu-1")
    sim.set_capacity(ZONE, "v5litepod-8", 0)
    with pytest.raises(gexc.GoogleAPICallError):  # the create's operation ends with the refusal
        tpu.create(spec, ZONE, "tpu-2", 2, "spot", SCRIPT)
    queued = QueuedTpuProvider(made)
    for i, provisioning in enumerate(("spot", "standard")):
        spec = parse_spec(tpu_spec("slice", provisioning=provisioning, accelerator={
            "kind": "tpu", "accelerator_type": "v4-16", "runtime_version": "tpu-ubuntu2204-base",
            "queue_wait_minutes": 7}))
        assert queued.create(spec, ZONE, f"slice-{i}", 1, provisioning, SCRIPT)
        sim.wait_for(lambda: queued.get(ZONE, f"slice-{i}") == "READY", 20, "the request's node READY")
    assert queued.list_labelled(ZONE)
    sim.preempt(ZONE, "slice-0")  # the request SUSPENDED
    sim.wait_for(lambda: queued.get(ZONE, "slice-0") == "queued:SUSPENDED", 20, "the request SUSPENDED")
    sim.set_capacity(ZONE, "v4-16", 0)  # a request whose wait ends FAILED (its minute lasts 0.6 s)
    sim.run_duration_scale = 0.01
    assert queued.create(parse_spec(tpu_spec("slice", accelerator={
        "kind": "tpu", "accelerator_type": "v4-16", "runtime_version": "tpu-ubuntu2204-base",
        "queue_wait_minutes": 1})), ZONE, "slice-2", 1, "spot", SCRIPT)
    sim.wait_for(lambda: queued.get(ZONE, "slice-2") == "queued:FAILED", 20, "the request FAILED")
    queued.list_labelled(ZONE)
    for i in range(3):
        queued.delete(ZONE, f"slice-{i}")


def drive_cli(sim: SimServer, endpoint: str) -> None:
    """The CLI's reads (respawn.app.compute_read), anonymous against the endpoint as in local runs."""
    look = Reader(requests.Session(), endpoint, PROJECT)
    quotas, problem = quotacheck.region_quotas(look, [REGION])
    assert quotas[REGION] is not None, problem
    zones = zonereport.region_zones(look, REGION)
    assert isinstance(zones, list) and zones, zones
    sim.set_advice("us-central1-b", "g2-standard-8", obtainability=0.25, estimated_uptime=600,
                   preemption_rates=[0.5], prices=[0.3])
    for shape in (advice.Shape("g2-standard-8"), advice.Shape("n1-standard-8", T4, 2)):
        zonereport.report(look, shape, zones, 2)
    sim.compute.global_resources.add_firewall(PROJECT, deployment.node_firewall_rule(1),
                             service_account=deployment.service_account_email(deployment.node_identity(1), PROJECT))
    with pytest.MonkeyPatch.context() as env:
        env.setenv(deployment.ENV_COMPUTE_ENDPOINT, endpoint)
        env.setenv(catalogcheck.ENV_TPU_ENDPOINT, endpoint)
        assert firewallcheck.missing_rule(PROJECT) is None
        ask, why = catalogcheck.live(PROJECT)  # register's look at what exists
        assert ask is not None, why
        assert ask("zone", ZONE, "") and ask("machine", "g2-standard-8", ZONE) and ask("gpu", T4, ZONE)
        assert ask("tpu", "v5litepod-8", ZONE) and ask("machine", "g2-standard-8", "us-central2-b") is False
        for image in ("projects/deeplearning-platform-release/global/images/family/common-cu129-ubuntu-2404-nvidia-580",
                      f"projects/{PROJECT}/global/images/my-image"):
            assert imagecheck.check(image, PROJECT).verdict.name == "FOUND", image


def drive_controller_rest(sim: SimServer, endpoint: str, made: factory.Clients) -> None:
    """The controller's JSON-API adapters and its capacity advice (the client library)."""
    reader = AdviceReader(made)
    for shape in (advice.Shape("g2-standard-8"), advice.Shape("n1-standard-8", T4, 1)):
        reader.capacity("us-central1-b", shape, 2)
    series = goodput_metrics.time_series("job-a", ZONE, T4, {"productive_training": 90.0, "checkpoint_save": 3.5},
                                         120.0, 2, datetime.now(timezone.utc))
    MonitoringApi(requests.Session(), endpoint).create_time_series(PROJECT, series)
    grants = FolderGrants(factory.Clients(factory.Endpoints(PROJECT, storage=endpoint)))
    grants.grant("gs://ckpt/job-a", "node-1@respawn-test.iam.gserviceaccount.com")
    grants.grant("gs://ckpt/job-a", "node-2@respawn-test.iam.gserviceaccount.com")
    grants.revoke("gs://ckpt/job-a", "node-1@respawn-test.iam.gserviceaccount.com")
    rates = {"cpu:g2:spot": 0.01, "ram:g2:spot": 0.001, "gpu:nvidia-l4:spot": 0.2, "disk:pd-balanced": 0.073,
             "tpu:v5litepod:spot": 0.6}
    sim.set_catalog(prices.COMPUTE_SERVICE, prices.catalog_skus(rates, REGION))
    assert CatalogApi(requests.Session(), endpoint).skus(prices.COMPUTE_SERVICE)
    assert CatalogApi(requests.Session(), endpoint, api_key="k").skus(prices.TPU_SERVICE) == []


def drive_agent_logs(endpoint: str) -> None:
    """The agent's Cloud Logging writes: its own JSON lines (jsonPayload, severity, labels) and a trainer's text."""
    md = MetadataServer(project=PROJECT).start()
    try:
        set_labels(**contract.log_labels("job-a", 3, "job-a-3", None))
        cloud = CloudLog(PROJECT, ZONE, MetadataClient(md.host), labels, host=endpoint)
        agent = json.dumps({"severity": "WARNING", "message": "heartbeat failed", "time": "2026-11-28T04:00:00Z",
                            "attempt": 3, "error": {"why": "timeout"}, LABELS_FIELD: {"respawn_rank": "0"}})
        assert cloud.write("agent", (agent + "\nnot json\n").encode())
        assert cloud.write("trainer", b"step 10 loss 0.5\n\n")
    finally:
        set_labels(**{k: None for k in contract.log_labels("", 0, "", None)})
        md.stop()


def drive_doctor(endpoint: str) -> None:
    """`respawn doctor`'s reads of what the build made (the enabled APIs, the service accounts, the project and its
    IAM policy, the Slack secret's latest version, the Firestore composite indexes, the Logging sink, the scheduler
    job), and the calls tests/test_selftest.py breaks and mends them with (as `gcloud services disable|enable`,
    `gcloud iam service-accounts delete|create`, `gcloud projects set-iam-policy`, `gcloud secrets versions
    disable|enable`, `gcloud firestore indexes composite create|describe|delete`, `gcloud logging sinks
    create|update|delete` and `gcloud scheduler jobs pause|resume` would)."""
    job = cloud_scheduler.SchedulerJob(cloud_scheduler.job_name(PROJECT, REGION),
                                       f"projects/{PROJECT}/topics/{deployment.SWEEP_TOPIC}",
                                       deployment.SWEEP_MESSAGE.encode())
    cloud_scheduler.register(job)
    try:
        http, sinks = requests.Session(), f"{endpoint}/v2/projects/{PROJECT}/sinks"
        # an index the build's `firestore` step would make (deploy/firestore/indexes.yaml wants none today), so the
        # doctor's list answers one
        indexes = f"{endpoint}/v1/projects/{PROJECT}/databases/(default)/collectionGroups/jobs/indexes"
        operation = http.post(indexes, json={"queryScope": "COLLECTION", "fields": [
            {"fieldPath": "status.state", "order": "ASCENDING"},
            {"fieldPath": "status.next_attempt_at", "order": "ASCENDING"}]}, timeout=10)
        operation.raise_for_status()
        checks = project_checks.deployment_checks(PROJECT, REGION, endpoint)
        assert all(c.ok for c in checks), [c.line for c in checks]
        index = f"{endpoint}/v1/{operation.json()['metadata']['index']}"
        assert http.get(index, timeout=10).json()["state"] == "READY"
        http.delete(index, timeout=10).raise_for_status()
        for verb in ("pause", "resume"):
            http.post(f"{endpoint}/v1/{job.name}:{verb}", json={}, timeout=10).raise_for_status()
        sink = http.put(f"{sinks}/{deployment.SINK}", params={"updateMask": "filter"},
                        json={"filter": "severity>=ERROR"}, timeout=10)
        sink.raise_for_status()
        http.delete(f"{sinks}/{deployment.SINK}", timeout=10).raise_for_status()
        made = {k: sink.json()[k] for k in ("name", "destination")} | {"filter": audit.sink_filter(PROJECT)}
        http.post(sinks, params={"uniqueWriterIdentity": "true"}, json=made, timeout=10).raise_for_status()
        v1 = f"{endpoint}/v1/projects/{PROJECT}"
        for verb in ("disable", "enable"):
            http.post(f"{v1}/services/pubsub.googleapis.com:{verb}",
                      json={"disableDependentServices": False} if verb == "disable" else {},
                      timeout=10).raise_for_status()
            http.post(f"{v1}/secrets/{deployment.DEFAULT_SLACK_SECRET}/versions/1:{verb}", json={},
                      timeout=10).raise_for_status()
        policy = http.post(f"{v1}:getIamPolicy", json={"options": {"requestedPolicyVersion": 3}}, timeout=10)
        policy.raise_for_status()
        http.post(f"{v1}:setIamPolicy", json={"policy": policy.json(), "updateMask": "bindings,etag"},
                  timeout=10).raise_for_status()
        node = deployment.service_account_email(deployment.node_identity(1), PROJECT)
        http.delete(f"{v1}/serviceAccounts/{node}", timeout=10).raise_for_status()
        http.post(f"{v1}/serviceAccounts", json={"accountId": deployment.node_identity(1),
                                                 "serviceAccount": {"displayName": "Respawn respawn-node-1"}},
                  timeout=10).raise_for_status()
    finally:
        cloud_scheduler.unregister(job)


@pytest.fixture(scope="module")
def through_sim(tmp_path_factory) -> list[Exchange]:
    """Every exchange of the drives above, through the recording proxy in front of one sim."""
    routed: list[dict] = []  # what the Logging sink routes (sim/cloud_logging.py's LogSink serves it)
    sim = SimServer(PROJECT, **FAST, nodes_root=tmp_path_factory.mktemp("nodes"), audit_sink=routed.append)
    sim.start()
    proxy = RecordingProxy(sim.endpoint)
    try:
        made = factory.Clients(factory.Endpoints(PROJECT, proxy.endpoint, proxy.endpoint))
        drive_compute(sim, made)
        drive_tpu(sim, made)
        drive_cli(sim, proxy.endpoint)
        drive_controller_rest(sim, proxy.endpoint, made)
        drive_agent_logs(proxy.endpoint)
        selftest_run.senders(PROJECT, None, proxy.endpoint).write_log(selftest.probe_entry(PROJECT, PROBE))
        drive_doctor(proxy.endpoint)
        return list(proxy.exchanges)
    finally:
        proxy.close()
        sim.stop()


def _problems(m: discovery.Method, e: Exchange, *, answer: bool = True) -> list[str]:
    where = f"{e.method} {e.url}"
    out = [f"{where}: {p}" for p in discovery.check_url(m, e.method, e.url)]
    out += [f"{where} request: {p}" for p in discovery.check_request(m, json.loads(e.request) if e.request else None)]
    if answer and 200 <= e.status < 300:
        out += [f"{where} answer: {p}" for p in discovery.check_response(m, json.loads(e.answer) if e.answer else None)]
    return out


def test_every_sim_route_is_a_discovery_method_or_the_sims_own():
    unmapped = [f"{m} {p} ({h})" for m, p, h in ROUTES if h not in ROUTE_METHODS and not p.startswith(CONTROL_PREFIX)]
    assert not unmapped, f"sim routes with no discovery method: {unmapped}; map each in ROUTE_METHODS"
    stale = set(ROUTE_METHODS) - {h for _, _, h in ROUTES}
    assert not stale, f"ROUTE_METHODS names routes the sim no longer has: {sorted(stale)}"
    for handler, method_id in ROUTE_METHODS.items():
        m = discovery.method(method_id)
        assert next(verb for verb, _, h in ROUTES if h == handler) == m.http_method, (handler, method_id)


def test_every_request_and_answer_through_the_sim_matches_its_method(through_sim):
    served = {e.route for e in through_sim if 200 <= e.status < 300}
    assert not set(ROUTE_METHODS) - served, (
        f"routes the drives here never had answered: {sorted(set(ROUTE_METHODS) - served)}; drive each")
    problems = []
    for e in through_sim:
        if (e.method, urlsplit(e.url).path) == ("GET", "/"):  # the CLI's reachability probe (respawn.app.endpoints)
            continue
        if e.route is None:
            problems.append(f"{e.method} {e.url}: no sim route serves it (answered {e.status})")
        elif e.route in ROUTE_METHODS:
            problems += _problems(discovery.method(ROUTE_METHODS[e.route]), e)
    assert not problems, "\n".join(problems)


# --- the calls that go to emulators and Cloud Storage in local runs -----------------------------------------------

class StandIn:
    """Records every request and answers as the Google API it was meant for would (the minimum the caller reads)."""

    def __init__(self):
        self.exchanges: list[Exchange] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, headers, data = standin.answer(self.command, self.path)
                standin.exchanges.append(Exchange(self.command, self.path, None, body, status, data))
                self.send_response(status)
                for k, v in {**headers, "Content-Length": str(len(data))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, verb: str, url: str) -> tuple[int, dict, bytes]:
        path = urlsplit(url).path
        at = "2026-11-28T04:00:00.123456Z"
        if path.startswith("/session/"):  # the resumable upload's session URI (Location), not an API method
            return 200, {}, json.dumps({"bucket": "ckpt", "name": "env.tar", "size": "5"}).encode()
        found = discovery.resolve(verb, url)
        if len(found) != 1:
            return 404, {}, b'{"error": {"code": 404, "message": "no such method"}}'
        answers = {
            "firestore.projects.databases.documents.commit": {"writeResults": [{"updateTime": at}], "commitTime": at},
            "firestore.projects.databases.documents.get": {
                "name": path.removeprefix("/v1/"), "fields": {"state": {"stringValue": "training"}},
                "createTime": at, "updateTime": at},
            "pubsub.projects.topics.publish": {"messageIds": ["17"]},
            "logging.entries.write": {},
            "cloudscheduler.projects.locations.jobs.run": {"name": path.removeprefix("/v1/"), "state": "ENABLED"},
            "storage.objects.list": {"kind": "storage#objects",
                                     "items": [{"name": "a/.respawn-logs/x", "updated": at}]},
            "storage.objects.delete": None,
        }
        m = found[0]
        if m.id == "storage.objects.get":
            return (206 if "bytes=" in url else 200), {}, b"data!"
        if m.id == "storage.objects.insert":
            if "uploadType=resumable" in url:
                return 200, {"Location": f"http://{self.host}/session/1"}, b""
            return 200, {}, json.dumps({"bucket": "ckpt", "name": "m.json", "size": "5"}).encode()
        body = answers[m.id]
        return (204, {}, b"") if body is None else (200, {}, json.dumps(body).encode())

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_agent_and_trainer_requests(tmp_path):
    standin = StandIn()
    md = MetadataServer(project=PROJECT).start()
    try:
        # The heartbeat, every field set, as the agent writes it; the handover's read of one field.
        writer = FirestoreWriter(PROJECT, emulator_host=standin.host)
        now = datetime.now(timezone.utc)
        doc = compose_heartbeat(
            job_id="job-a", attempt=3, zone=ZONE, state=contract.NodeState.TRAINING,
            status={"step": 10, "committed_step": 8, "total_steps": 100, "emergency": {"step": 9, "ok": True}},
            started_at=now, notice="PREEMPTED", exit_code=1, output_tail="boom", failed_command=["pip", "install"],
            now=now, worker=1, generation=2, step_idle_seconds=0.5, master_reachable=True,
            env_cache={"hit": False, "bytes": 12}, first_step=1, first_step_at=now)
        writer.set(contract.NODES_COLLECTION, "job-a-3", doc, server_timestamps=contract.HEARTBEAT_SERVER_TIME_FIELDS)
        assert writer.get_string(contract.NODES_COLLECTION, "job-a-2", "state") == "training"
        nudger = Nudger(PROJECT, "respawn-sweep", "job-a", emulator_host=standin.host)
        nudger.publish()
        nudger.publish(contract.notice_nudge("job-a", "job-a-3", "PREEMPTED", now.isoformat()))
        # Cloud Storage: the agent's download, small upload and resumable upload; log retention's list and delete.
        environ = {"STORAGE_EMULATOR_HOST": f"http://{standin.host}"}
        client = MetadataClient(md.host)
        Fetcher(client, environ=environ).fetch("gs://ckpt/job-a/agent.pyz", str(tmp_path / "agent"), missing_hint="x")
        uploader = Uploader(client, environ=environ)
        uploader.put("gs://ckpt/job-a/.respawn-env/m.json", b"{}")
        stream = uploader.open("gs://ckpt/job-a/.respawn-env/env.tar", lambda: False)
        stream.write(b"data!")
        stream.commit()
        logs = LogObjectsApi(requests.Session(), f"http://{standin.host}")
        assert logs.list("ckpt", "job-a/.respawn-logs/")
        logs.delete("ckpt", "job-a/.respawn-logs/x")
        # The trainer's ranged media reads (trainer/storage.py) and the startup script's download of the agent.
        from respawn.ckpt.storage import _RangeReader

        _RangeReader(f"http://{standin.host}", "ckpt", AnonymousCredentials())._get("job-a/step_1/d.bin", 0, 5).read()
        script = (ROOT / "deploy/vm/startup.sh").read_text()
        (url,) = re.findall(r'"(\$STORAGE/[^"]+)"', script)
        url = url.replace("$STORAGE", "").replace("$bucket", "ckpt").replace("$quoted", "releases%2Fagent.pyz")
        requests.get(f"http://{standin.host}{url}", timeout=10).raise_for_status()
    finally:
        md.stop()
        standin.close()
    problems, used = [], set()
    for e in standin.exchanges:
        if urlsplit(e.url).path.startswith("/session/"):
            continue
        found = discovery.resolve(e.method, e.url)
        if len(found) != 1:
            problems.append(f"{e.method} {e.url}: {len(found)} discovery methods have its shape, not one")
            continue
        used.add(found[0].id)
        # Media: an object's data goes in an upload's body and in a download's answer, not JSON.
        upload = "uploadType=media" in e.url
        problems += _problems(found[0], Exchange(e.method, e.url, None, b"" if upload else e.request, e.status,
                                                 e.answer), answer=found[0].id not in ("storage.objects.get",
                                                                                        "storage.objects.insert"))
    assert not problems, "\n".join(problems)
    assert used == {"firestore.projects.databases.documents.commit", "firestore.projects.databases.documents.get",
                    "pubsub.projects.topics.publish", "storage.objects.get", "storage.objects.insert",
                    "storage.objects.list", "storage.objects.delete"}, used


def test_the_self_tests_probes_to_logging_and_the_scheduler():
    """`respawn doctor`'s two calls to Google APIs by hand (the local run's log write goes through the sim: above)."""
    standin = StandIn()
    try:
        host = f"http://{standin.host}"
        send = selftest_run.google_senders(PROJECT, REGION, requests.Session(), logging_host=host, scheduler_host=host)
        send.write_log(selftest.probe_entry(PROJECT, PROBE))
        send.tick()
    finally:
        standin.close()
    problems, used = [], []
    for e in standin.exchanges:
        (m,) = discovery.resolve(e.method, e.url)
        used.append(m.id)
        problems += _problems(m, e)
    assert not problems, "\n".join(problems)
    assert used == ["logging.entries.write", "cloudscheduler.projects.locations.jobs.run"], used


def test_the_files_the_build_hands_gcloud_are_their_methods_bodies():
    # `gcloud iam roles create|update --file` sends the file as the Role (create wraps it with its roleId);
    # `gcloud monitoring dashboards create|update --config-from-file` sends the file as the Dashboard.
    from deploy import iam

    problems = []
    for role in iam.roles():
        create = {"roleId": role.id, "role": role.definition()}
        problems += discovery.check_request(discovery.method("iam.projects.roles.create"), create)
        problems += discovery.check_request(discovery.method("iam.projects.roles.patch"), role.definition())
    dashboard = json.loads((ROOT / "deploy/monitoring/goodput-dashboard.json").read_text())
    for method_id in ("monitoring.projects.dashboards.create", "monitoring.projects.dashboards.patch"):
        problems += discovery.check_request(discovery.method(method_id), dashboard)
    assert not problems, "\n".join(problems)


def test_every_product_file_that_calls_a_google_api_is_driven_here():
    found = sorted(str(p.relative_to(ROOT)) for top in ("respawn", "functions", "node_agent", "trainer", "deploy")
                   for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".sh") and FOUND.search(p.read_text()))
    unchecked = [f for f in found if f not in HAND_CALLERS and f not in NOT_CALLERS]
    assert not unchecked, (f"{unchecked} name a Google API endpoint but no drive here sends their calls: add one to "
                           "this test and the file to HAND_CALLERS")
    stale = (set(HAND_CALLERS) | set(NOT_CALLERS)) - set(found)
    assert not stale, f"HAND_CALLERS or NOT_CALLERS name files that call no Google API any more: {sorted(stale)}"
    assert set(HAND_CALLERS.values()) <= set(globals()), "a HAND_CALLERS drive that does not exist"


# --- the checker itself -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body,problem", [
    ({"name": "x", "colour": "red"}, "Instance.colour: no such field in Instance"),
    ({"name": 7}, "Instance.name: 7 is not a string"),
    ({"id": 5}, "Instance.id: 5 is not an int64 as a string"),
    ({"scheduling": {"provisioningModel": "CHEAP"}}, "Instance.scheduling.provisioningModel: 'CHEAP' is not one of"),
    ({"labels": {"a": 1}}, "Instance.labels['a']: 1 is not a string"),
    ({"disks": {"boot": True}}, "Instance.disks: {\"boot\": true} is not an array"),
    ({"scheduling": {"automaticRestart": "false"}}, "Instance.scheduling.automaticRestart: \"false\" is not a boolean"),
])
def test_the_checker_names_each_kind_of_wrong_body(body, problem):
    (found,) = discovery.check_request(discovery.method("compute.instances.insert"), body)
    assert problem in found


@pytest.mark.parametrize("method_id,body,problem", [
    ("monitoring.projects.timeSeries.create",
     {"timeSeries": [{"points": [{"interval": {"endTime": "2026-11-28 04:00"}}]}]}, "has no time zone"),
    ("monitoring.projects.timeSeries.create", {"timeSeries": [{"points": [{"interval": {"endTime": "yesterday"}}]}]},
     "is not an RFC 3339 timestamp"),
    ("tpu.projects.locations.queuedResources.create", {"queueingPolicy": {"validUntilDuration": "7m"}},
     "is not a duration"),
    ("pubsub.projects.topics.publish", {"messages": [{"data": "not base64!"}]}, "is not base64"),
    ("firestore.projects.databases.documents.commit",
     {"writes": [{"update": {"fields": {"a": {"stringValue": None}}}}]}, "update.fields['a'].stringValue: null"),
])
def test_the_checker_reads_formats_and_nulls(method_id, body, problem):
    (found,) = discovery.check_request(discovery.method(method_id), body)
    assert problem in found, found


@pytest.mark.parametrize("verb,url,problem", [
    ("POST", "/compute/v1/projects/p/zones/z/instance", "is not compute.instances.insert's path"),
    ("GET", "/compute/v1/projects/p/zones/z/instances", "is POST, not GET"),
    ("POST", "/compute/v1/projects/p/zones/z/instances?requestID=1", "has no query parameter 'requestID'"),
    ("POST", "/compute/v1/projects/Bad_Project/zones/z/instances", "path parameter project='Bad_Project'"),
])
def test_the_checker_names_each_kind_of_wrong_url(verb, url, problem):
    found = discovery.check_url(discovery.method("compute.instances.insert"), verb, url)
    assert any(problem in p for p in found), found


def test_a_reserved_expansion_must_match_its_pattern():
    m = discovery.method("tpu.projects.locations.nodes.get")
    assert discovery.check_url(m, "GET", "/v2/projects/p/locations/z/nodes/n") == []
    assert discovery.check_url(m, "GET", "/v2/projects/p/nodes/n")
    assert discovery.check_response(m, {"name": "n", "id": 2**63}) == ["Node.id: 9223372036854775808 is not an "
                                                                       "int64 as a string"]


def test_the_vendored_documents_are_the_revisions_the_audit_read():
    assert {name: api.revision for name, api in discovery.apis().items()} == {
        "compute.v1": "20261106", "tpu.v2": "20261001", "storage.v1": "20261009", "logging.v2": "20260911",
        "cloudbilling.v1": "20260901", "monitoring.v3": "20260129", "pubsub.v1": "20261027",
        "firestore.v1": "20260928", "iam.v1": "20261023", "monitoring.v1": "20260903",
        "cloudscheduler.v1": "20261106",  # the self-test's jobs.run (respawn/app/selftest_run.py), vendored 2026-12-07
        # `respawn doctor`'s reads of what the build made (respawn/app/project_checks.py), vendored 2026-12-07
        "serviceusage.v1": "20260921", "cloudresourcemanager.v1": "20261107", "secretmanager.v1": "20261021"}
