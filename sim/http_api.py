"""HTTP routing for the SimServer: the Compute Engine v1 and Cloud TPU v2 REST paths the real client libraries
call, plus the control API under /sim/ (documented in sim/README.md)."""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

from sim import cloud_scheduler, machine_catalog
from sim import project as sim_project
from sim.core import ApiError, SimError, compute_error, rpc_error

if TYPE_CHECKING:
    from sim.server import SimServer

_C = r"/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)"
# Images are global and live in any project (public images: deeplearning-platform-release, debian-cloud, …).
_I = r"/compute/v1/projects/(?P<image_project>[^/]+)/global/images"
_R = r"/compute/v1/projects/(?P<project>[^/]+)/regions/(?P<region>[^/]+)"
_T = r"/v2/projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)"
_L = r"/v2/projects/(?P<project>[^/]+)/sinks"  # Cloud Logging's sinks
_S = r"/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)/jobs"  # Cloud Scheduler
_P = r"/v1/projects/(?P<project>[^/:]+)"  # Service Usage, IAM, Resource Manager, Secret Manager (sim/project.py)
# The Firestore Admin API's composite indexes (sim/project.py): the emulator does not serve them
_F = _P + r"/databases/(?P<database>[^/]+)/collectionGroups/(?P<group>[^/]+)/indexes"

ROUTES = [
    ("POST", _C + r"/instances", "c_insert"),
    ("GET", _C + r"/instances", "c_list"),
    ("GET", _C + r"/instances/(?P<name>[^/]+)", "c_get"),
    ("DELETE", _C + r"/instances/(?P<name>[^/]+)", "c_delete"),
    ("POST", _C + r"/instances/(?P<name>[^/]+)/start", "c_start"),
    ("POST", _C + r"/instances/(?P<name>[^/]+)/stop", "c_stop"),
    ("POST", _C + r"/instances/(?P<name>[^/]+)/setMetadata", "c_set_metadata"),
    ("POST", _C + r"/instances/(?P<name>[^/]+)/simulateMaintenanceEvent", "c_simulate_maintenance"),
    ("GET", _C + r"/instances/(?P<name>[^/]+)/serialPort", "c_serial"),
    ("GET", _C, "c_zone"),
    ("GET", _C + r"/machineTypes/(?P<machine_type>[^/]+)", "c_machine_type"),
    ("GET", _C + r"/acceleratorTypes/(?P<accelerator_type>[^/]+)", "c_accelerator_type"),
    ("GET", _C + r"/operations", "c_ops"),
    ("GET", _C + r"/operations/(?P<op>[^/]+)", "c_op"),
    ("POST", _C + r"/operations/(?P<op>[^/]+)/wait", "c_wait"),
    ("GET", _I + r"/family/(?P<family>[^/]+)", "c_image_family"),
    ("GET", _I + r"/(?P<image>[^/]+)", "c_image"),
    ("POST", _R + r"/advice/capacity", "c_advice_capacity"),
    ("POST", _R + r"/advice/capacityHistory", "c_advice_history"),
    ("GET", _R, "c_region"),
    ("POST", r"/v3/projects/(?P<project>[^/]+)/timeSeries", "m_time_series"),
    ("POST", r"/v2/entries:write", "l_entries_write"),
    ("POST", _L, "l_sink_create"),
    ("GET", _L + r"/(?P<sink>[^/]+)", "l_sink_get"),
    ("PUT", _L + r"/(?P<sink>[^/]+)", "l_sink_update"),
    ("DELETE", _L + r"/(?P<sink>[^/]+)", "l_sink_delete"),
    ("GET", _S + r"/(?P<job>[^/:]+)", "j_get"),
    ("POST", _S + r"/(?P<job>[^/:]+):pause", "j_pause"),
    ("POST", _S + r"/(?P<job>[^/:]+):resume", "j_resume"),
    ("GET", _P + r"/services", "u_list"),
    ("POST", _P + r"/services/(?P<service>[^/:]+):enable", "u_enable"),
    ("POST", _P + r"/services/(?P<service>[^/:]+):disable", "u_disable"),
    ("GET", _P + r"/serviceAccounts/(?P<account>[^/:]+)", "i_account_get"),
    ("POST", _P + r"/serviceAccounts", "i_account_create"),
    ("DELETE", _P + r"/serviceAccounts/(?P<account>[^/:]+)", "i_account_delete"),
    ("GET", _P, "r_project"),
    ("POST", _P + r":getIamPolicy", "r_get_policy"),
    ("POST", _P + r":setIamPolicy", "r_set_policy"),
    ("GET", _P + r"/secrets/(?P<secret>[^/]+)/versions/(?P<version>[^/:]+)", "k_version_get"),
    ("POST", _P + r"/secrets/(?P<secret>[^/]+)/versions/(?P<version>[^/:]+):enable", "k_version_enable"),
    ("POST", _P + r"/secrets/(?P<secret>[^/]+)/versions/(?P<version>[^/:]+):disable", "k_version_disable"),
    ("GET", _F, "f_index_list"),
    ("POST", _F, "f_index_create"),
    ("GET", _F + r"/(?P<index>[^/]+)", "f_index_get"),
    ("DELETE", _F + r"/(?P<index>[^/]+)", "f_index_delete"),
    ("GET", r"/compute/v1/projects/(?P<fw_project>[^/]+)/global/firewalls/(?P<firewall>[^/]+)", "c_firewall"),
    ("POST", _T + r"/nodes", "t_create"),
    ("GET", _T + r"/nodes", "t_list"),
    ("GET", _T + r"/nodes/(?P<name>[^/:]+)", "t_get"),
    ("DELETE", _T + r"/nodes/(?P<name>[^/:]+)", "t_delete"),
    ("PATCH", _T + r"/nodes/(?P<name>[^/:]+)", "t_update"),
    ("GET", _T + r"/operations/(?P<op>[^/]+)", "t_op"),
    ("GET", _T + r"/acceleratorTypes/(?P<accelerator_type>[^/]+)", "t_accelerator_type"),
    ("POST", _T + r"/queuedResources", "t_qr_create"),
    ("GET", _T + r"/queuedResources", "t_qr_list"),
    ("GET", _T + r"/queuedResources/(?P<name>[^/:]+)", "t_qr_get"),
    ("DELETE", _T + r"/queuedResources/(?P<name>[^/:]+)", "t_qr_delete"),
    ("GET", r"/sim/instances", "s_instances"),
    ("GET", r"/sim/history", "s_history"),
    ("GET", r"/sim/audit", "s_audit"),
    ("GET", r"/sim/clock", "s_clock"),
    ("GET", r"/sim/capacity", "s_capacity_get"),
    ("POST", r"/sim/capacity", "s_capacity"),
    ("POST", r"/sim/quota", "s_quota"),
    ("POST", r"/sim/preempt", "s_preempt"),
    ("POST", r"/sim/host-error", "s_host_error"),
    ("POST", r"/sim/maintenance-event", "s_maintenance"),
    ("POST", r"/sim/partition", "s_partition"),
    ("POST", r"/sim/faults", "s_faults"),
    ("POST", r"/sim/hold-operations", "s_hold"),
    ("POST", r"/storage/v1/b/(?P<bucket>[^/]+)/managedFolders", "g_folder_insert"),
    ("GET", r"/storage/v1/b/(?P<bucket>[^/]+)/managedFolders/(?P<folder>[^/]+)/iam", "g_folder_policy"),
    ("PUT", r"/storage/v1/b/(?P<bucket>[^/]+)/managedFolders/(?P<folder>[^/]+)/iam", "g_folder_set_policy"),
    ("POST", r"/sim/images", "s_images"),
    ("POST", r"/sim/advice", "s_advice"),
    ("GET", r"/v1/services/(?P<service>[^/]+)/skus", "b_skus"),  # the Cloud Billing Catalog (gcp-facts §24)
    ("POST", r"/sim/catalog", "s_catalog"),
    ("POST", r"/sim/firewalls", "s_firewalls"),
]
_COMPILED = [(m, re.compile(p + "$"), h) for m, p, h in ROUTES]

# Which fault-injector method name each API call answers to.
FAULT_NAMES = {"c_insert": "insert", "c_delete": "delete", "c_start": "start", "c_stop": "stop", "c_get": "get",
               "c_set_metadata": "set_metadata", "c_serial": "serial",
               "c_list": "list", "c_image": "image", "c_image_family": "image",
               "c_advice_capacity": "advice", "c_advice_history": "advice", "c_region": "region",
               "t_create": "create", "t_delete": "delete", "t_get": "get", "t_list": "list",
               # a queued resource's calls answer to the node's names (`nodes`: the request's id)
               "t_qr_create": "create", "t_qr_delete": "delete", "t_qr_get": "get", "t_qr_list": "list"}


def make_handler(sim: "SimServer"):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            return json.loads(raw) if raw.strip() else {}

        def _dispatch(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            for m, pattern, handler in _COMPILED:
                match = pattern.match(url.path)
                if m == method and match:
                    break
            else:
                self._send(404, {"error": {"code": 404, "message": f"sim does not serve {method} {url.path}",
                                           "status": "NOT_FOUND"}})
                return
            args = match.groupdict()
            try:
                body = self._body() if method in ("POST", "PUT", "PATCH") else {}
                if "project" in args and args.pop("project") != sim.project:
                    msg = f"The sim serves project '{sim.project}' only"
                    raise compute_error(404, "notFound", msg) if handler.startswith("c_") else rpc_error(403, msg)
                fault = FAULT_NAMES.get(handler)
                node = args.get("name") or body.get("name") or query.get("nodeId") or query.get("queuedResourceId")
                injected = None
                if fault and sim.take_api_fault(fault, node):
                    status = sim.api_faults["status"]
                    injected = (compute_error(status, "backendError", "Internal error. Please try again or contact "
                                                                      "Google Support.")
                                if handler.startswith("c_") else rpc_error(status, "The service is currently unavailable."))
                    if not sim.api_faults["after"]:
                        raise injected
                status, result = 200, getattr(self, handler)(body=body, query=query, **args)
                if injected is not None:
                    raise injected
            except ApiError as exc:
                status, result = exc.status, exc.body
            except SimError as exc:
                status, result = 409, {"error": {"code": 409, "message": str(exc)}}
            except (KeyError, ValueError, TypeError, json.JSONDecodeError) as exc:
                status, result = 400, {"error": {"code": 400, "message": f"bad request: {exc!r}", "status": "INVALID_ARGUMENT"}}
            self._send(status, result)

        def do_GET(self):
            self._dispatch("GET")

        def do_POST(self):
            self._dispatch("POST")

        def do_PUT(self):
            self._dispatch("PUT")

        def do_DELETE(self):
            self._dispatch("DELETE")

        def do_PATCH(self):
            self._dispatch("PATCH")

        # --- Compute ---
        def c_insert(self, zone, body, query):
            return sim.compute.insert(zone, body)

        def c_list(self, zone, body, query):
            return sim.compute.list(zone, query.get("filter"))

        def c_get(self, zone, name, body, query):
            return sim.compute.get(zone, name)

        def c_delete(self, zone, name, body, query):
            return sim.compute.delete(zone, name)

        def c_start(self, zone, name, body, query):
            return sim.compute.start(zone, name)

        def c_stop(self, zone, name, body, query):
            return sim.compute.stop(zone, name)

        def c_set_metadata(self, zone, name, body, query):
            return sim.compute.set_metadata(zone, name, body)

        def c_simulate_maintenance(self, zone, name, body, query):
            return sim.compute.events.simulate_maintenance_event(zone, name)

        def c_serial(self, zone, name, body, query):
            return sim.compute.serial_port_output(zone, name, int(query.get("port", 1)), int(query.get("start", 0)))

        # What exists (sim/machine_catalog.py: Respawn's offline catalog, as `jobs register` asks it).
        def c_zone(self, zone, body, query):
            return machine_catalog.zone(sim.project, zone)

        def c_machine_type(self, zone, machine_type, body, query):
            return machine_catalog.machine_type(sim.project, zone, machine_type)

        def c_accelerator_type(self, zone, accelerator_type, body, query):
            return machine_catalog.accelerator_type(sim.project, zone, accelerator_type)

        def t_accelerator_type(self, zone, accelerator_type, body, query):
            return machine_catalog.tpu_type(sim.project, zone, accelerator_type)

        def c_ops(self, zone, body, query):
            return sim.compute.operations.list(zone, query.get("filter"))

        def c_op(self, zone, op, body, query):
            return sim.compute.operations.get(zone, op)

        def c_wait(self, zone, op, body, query):
            return sim.compute.operations.wait(zone, op)

        def c_image(self, image_project, image, body, query):
            return sim.compute.global_resources.get_image(image_project, image)

        def c_image_family(self, image_project, family, body, query):
            return sim.compute.global_resources.get_image_from_family(image_project, family)

        def c_firewall(self, fw_project, firewall, body, query):
            return sim.compute.global_resources.get_firewall(fw_project, firewall)

        def c_advice_capacity(self, region, body, query):
            return sim.advice.capacity(region, body)

        def c_advice_history(self, region, body, query):
            return sim.advice.history(region, body)

        def c_region(self, region, body, query):
            return sim.advice.region(region)

        def m_time_series(self, body, query):
            return sim.monitoring.create(sim.project, body)

        def l_entries_write(self, body, query):
            return sim.cloud_logging.write(body)

        # --- the deployment's Logging sink (sim/cloud_logging.py) and Cloud Scheduler job (sim/cloud_scheduler.py) ---
        def _log_sink(self):
            if sim.log_sink is None:
                raise rpc_error(404, "this sim routes no logs: it was made with no audit_sink")
            return sim.log_sink

        def l_sink_create(self, body, query):
            return self._log_sink().create(body)

        def l_sink_get(self, sink, body, query):
            return self._log_sink().get(sink)

        def l_sink_update(self, sink, body, query):
            return self._log_sink().update(sink, body, query.get("updateMask"))

        def l_sink_delete(self, sink, body, query):
            return self._log_sink().delete(sink)

        def j_get(self, location, job, body, query):
            return sim.cloud_scheduler.get(location, job)

        def j_pause(self, location, job, body, query):
            return sim.cloud_scheduler.set_state(location, job, cloud_scheduler.PAUSED)

        def j_resume(self, location, job, body, query):
            return sim.cloud_scheduler.set_state(location, job, cloud_scheduler.ENABLED)

        # --- what the build made in the project (sim/project.py): APIs, accounts, IAM policy, secret, indexes ---
        def u_list(self, body, query):
            return sim.project_record.list_services(query.get("filter"), int(query.get("pageSize", 50)),
                                                    query.get("pageToken"))

        def u_enable(self, service, body, query):
            return sim.project_record.set_service(service, sim_project.ENABLED)

        def u_disable(self, service, body, query):
            return sim.project_record.set_service(service, sim_project.DISABLED)

        def i_account_get(self, account, body, query):
            return sim.project_record.get_account(unquote(account))

        def i_account_create(self, body, query):
            return sim.project_record.create_account(body)

        def i_account_delete(self, account, body, query):
            return sim.project_record.delete_account(unquote(account))

        def r_project(self, body, query):
            return sim.project_record.get_project()

        def r_get_policy(self, body, query):
            return sim.project_record.get_policy()

        def r_set_policy(self, body, query):
            return sim.project_record.set_policy(body)

        def k_version_get(self, secret, version, body, query):
            return sim.project_record.get_version(secret, version)

        def k_version_enable(self, secret, version, body, query):
            return sim.project_record.set_version(secret, version, sim_project.ENABLED)

        def k_version_disable(self, secret, version, body, query):
            return sim.project_record.set_version(secret, version, sim_project.DISABLED)

        def f_index_list(self, database, group, body, query):
            return sim.project_record.list_indexes(unquote(database), unquote(group), int(query.get("pageSize", 100)),
                                                   query.get("pageToken"))

        def f_index_create(self, database, group, body, query):
            return sim.project_record.create_index(unquote(database), unquote(group), body)

        def f_index_get(self, database, group, index, body, query):
            return sim.project_record.get_index(unquote(database), unquote(group), index)

        def f_index_delete(self, database, group, index, body, query):
            return sim.project_record.delete_index(unquote(database), unquote(group), index)

        # --- Cloud Storage managed folders (the folder name comes URL-encoded: a/b/ is a%2Fb%2F) ---
        def g_folder_insert(self, bucket, body, query):
            return sim.storage_folders.insert(bucket, body["name"])

        def g_folder_policy(self, bucket, folder, body, query):
            return sim.storage_folders.get_policy(bucket, unquote(folder),
                                                  int(query.get("optionsRequestedPolicyVersion") or 1))

        def g_folder_set_policy(self, bucket, folder, body, query):
            return sim.storage_folders.set_policy(bucket, unquote(folder), body)

        # --- TPU ---
        def t_create(self, zone, body, query):
            return sim.tpu.create(zone, query.get("nodeId", ""), body)

        def t_list(self, zone, body, query):
            return sim.tpu.list(zone)

        def t_get(self, zone, name, body, query):
            return sim.tpu.get(zone, name)

        def t_delete(self, zone, name, body, query):
            return sim.tpu.delete(zone, name)

        def t_update(self, zone, name, body, query):
            return sim.tpu.update(zone, name, body, query.get("updateMask", ""))

        def t_qr_create(self, zone, body, query):
            return sim.tpu.queued.create(zone, query.get("queuedResourceId", ""), body)

        def t_qr_list(self, zone, body, query):
            return sim.tpu.queued.list(zone)

        def t_qr_get(self, zone, name, body, query):
            return sim.tpu.queued.get(zone, name)

        def t_qr_delete(self, zone, name, body, query):
            return sim.tpu.queued.delete(zone, name, force=query.get("force", "").lower() == "true")

        def t_op(self, zone, op, body, query):
            return sim.tpu.get_operation(f"projects/{sim.project}/locations/{zone}/operations/{op}")

        # --- control ---
        def s_instances(self, body, query):
            return {"instances": sim.instances(), "live": sim.live_nodes()}

        def s_history(self, body, query):
            return {"nodes": sim.history()}

        def s_audit(self, body, query):
            return {"entries": list(sim.audit_log)}

        def s_clock(self, body, query):
            return {"now": sim.now()}

        def s_capacity_get(self, body, query):
            return {"capacity": sim.capacity.snapshot(), "quota": sim.quota.snapshot()}

        def s_capacity(self, body, query):
            sim.set_capacity(body["zone"], body["acceleratorType"], body.get("count"), at=body.get("at"),
                             provisioning_model=body.get("provisioningModel"))
            return {}

        def s_quota(self, body, query):
            sim.set_quota(body["region"], body["acceleratorType"], body.get("limit"), at=body.get("at"),
                          provisioning_model=body.get("provisioningModel"))
            return {}

        def s_preempt(self, body, query):
            sim.preempt(body["zone"], body["name"])
            return {}

        def s_host_error(self, body, query):
            sim.host_error(body["zone"], body["name"])
            return {}

        def s_maintenance(self, body, query):
            sim.maintenance_event(body["zone"], body["name"], body.get("value", "TERMINATE_ON_HOST_MAINTENANCE"))
            return {}

        def s_partition(self, body, query):
            sim.partition(body["zone"], body["name"], heal=bool(body.get("heal", False)))
            return {}

        def s_images(self, body, query):
            sim.compute.global_resources.add_image(body["project"], body["name"], family=body.get("family"),
                                                   deprecated=body.get("deprecated", "ACTIVE"))
            return {}

        def s_firewalls(self, body, query):
            sim.compute.global_resources.add_firewall(body["project"], body["name"], service_account=body["service_account"],
                                                      network=body.get("network", "default"), disabled=bool(body.get("disabled")))
            return {}

        def s_advice(self, body, query):
            sim.set_advice(body["zone"], body["machineType"], obtainability=body.get("obtainability"),
                           estimated_uptime=body.get("estimatedUptime"), preemption_rates=body.get("preemptionRates"),
                           prices=body.get("prices"))
            return {}

        def b_skus(self, service, body, query):
            return sim.catalog.page(service, int(query.get("pageSize", 5000)), query.get("pageToken", ""))

        def s_catalog(self, body, query):
            sim.set_catalog(body["service"], body["skus"])
            return {}

        def s_hold(self, body, query):
            (sim.hold_operations if body.get("hold", True) else sim.release_operations)(body["zone"])
            return {}

        def s_faults(self, body, query):
            sim.set_api_faults(rate=float(body.get("rate", 0.0)), count=int(body.get("count", 0)),
                               status=int(body.get("status", 503)), methods=tuple(body.get("methods", ("insert", "create"))),
                               nodes=tuple(body.get("nodes", ())), after=bool(body.get("after", False)))
            return {}

    return Handler
