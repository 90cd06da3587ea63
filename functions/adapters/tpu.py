"""Cloud TPU VMs through google-cloud-tpu (tpu_v2, REST), built by respawn.control.clients.

Create meets 409 (AlreadyExists) and adopts; delete of a missing node is success. A preempted TPU is never started
again (Cloud TPU: delete and recreate), and it keeps holding quota until deleted, so decide.py always deletes it.
Configuration (the operation timeout, settings.NodeOptions) comes in through the constructor.
"""

from __future__ import annotations

import concurrent.futures

from google.api_core import exceptions as gexc
from google.cloud import tpu_v2
from google.protobuf import duration_pb2, field_mask_pb2

from respawn.contract import LABEL_JOB, Handover
from respawn.schema import JobSpec

from .. import models, nodespec
from ..models import queued
from ..settings import ControlSettings, NodeOptions

OP_TIMEOUT = ControlSettings.tpu_op_timeout_seconds  # the default; Deps.default() passes RESPAWN_OP_TIMEOUT_SECONDS
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


class TpuProvider:
    kind = "tpu"

    def __init__(self, clients, *, op_timeout: float = OP_TIMEOUT, nodes: NodeOptions = NodeOptions()):
        self.clients = clients
        self.project = clients.project
        self.op_timeout = op_timeout
        self.nodes = nodes

    def _name(self, zone: str, name: str) -> str:
        return f"projects/{self.project}/locations/{zone}/nodes/{name}"

    def get(self, zone: str, name: str) -> str | None:
        """The node state name (CREATING, READY, PREEMPTED, …), or None when it does not exist."""
        try:
            node = self.clients.tpu().get_node(name=self._name(zone, name))
        except gexc.NotFound:
            return None
        return tpu_v2.Node.State(node.state).name

    def list_labelled(self, zone: str) -> list[tuple[str, dict[str, str]]]:
        """(name, labels) of every TPU node in `zone` that carries the respawn-job label, but a queued resource's:
        the orphan scan deletes its request (QueuedTpuProvider), which takes the node with it. Deleting such a node
        alone would leave the request SUSPENDED, holding quota."""
        nodes = self.clients.tpu().list_nodes(parent=f"projects/{self.project}/locations/{zone}")
        return [(n.name.rsplit("/", 1)[-1], dict(n.labels)) for n in nodes
                if LABEL_JOB in n.labels and not n.queued_resource]

    def check_image(self, spec: JobSpec) -> None:
        """A TPU VM boots its runtime version (spec.accelerator.runtime_version): there is no image to check."""
        return None

    def console_tail(self, zone: str, name: str, chars: int) -> None:
        """Cloud TPU has no serial port output API (tpu_v2 lists, gets, creates, deletes, stops, starts and updates
        nodes; gcp-facts §14): there is no console to read."""
        return None

    def node(self, spec: JobSpec, attempt: int, provisioning: str, startup_script: str,
             service_account: str | None = None, handover: Handover | None = None):
        acc = spec.accelerator
        opts = self.nodes
        network = tpu_v2.NetworkConfig(enable_external_ips=opts.external_ip)
        if opts.network:
            network.network = opts.network
        if opts.subnetwork:
            network.subnetwork = opts.subnetwork
        node = tpu_v2.Node(
            accelerator_type=acc.accelerator_type,
            runtime_version=acc.runtime_version,
            scheduling_config=tpu_v2.SchedulingConfig(**models.of(provisioning).tpu_scheduling()),
            network_config=network,
            labels=nodespec.labels(spec, attempt),
            metadata=nodespec.metadata(spec, attempt, self.project, startup_script, opts, service_account, handover),
        )
        if service_account:  # unset: the project's default compute service account
            node.service_account = tpu_v2.ServiceAccount(email=service_account, scope=SCOPES)
        return node

    def create(self, spec: JobSpec, zone: str, name: str, attempt: int, provisioning: str, startup_script: str,
               slot: int = 0, service_account: str | None = None, handover: Handover | None = None) -> bool:
        body = self.node(spec, attempt, provisioning, startup_script, service_account, handover)
        try:
            op = self.clients.tpu().create_node(parent=f"projects/{self.project}/locations/{zone}", node_id=name, node=body)
            op.result(timeout=self.op_timeout)
        except (gexc.AlreadyExists, gexc.Conflict):
            return False
        return True

    def address(self, zone: str, name: str) -> str | None:
        """Worker 0's internal IP (the node's first network endpoint), or None while it has none or is gone."""
        try:
            endpoints = self.clients.tpu().get_node(name=self._name(zone, name)).network_endpoints
        except gexc.NotFound:
            return None
        return (endpoints[0].ip_address or None) if endpoints else None

    def set_attributes(self, zone: str, name: str, values: dict[str, str]) -> None:
        """Set metadata attributes of the node (the others kept; every worker VM serves them) and wait: nodes.patch
        with updateMask=metadata replaces the whole map, so it is read first."""
        tpu = self.clients.tpu()
        current = dict(tpu.get_node(name=self._name(zone, name)).metadata)
        if all(current.get(k) == v for k, v in values.items()):
            return  # already so: a repeated delivery writes nothing
        node = tpu_v2.Node(name=self._name(zone, name), metadata={**current, **values})
        tpu.update_node(node=node, update_mask=field_mask_pb2.FieldMask(paths=["metadata"])).result(
            timeout=self.op_timeout)

    def start(self, zone: str, name: str) -> None:
        raise gexc.FailedPrecondition(f"TPU node {name} in {zone}: a preempted TPU is recreated, never started in place")

    def delete(self, zone: str, name: str) -> None:
        try:
            self.clients.tpu().delete_node(name=self._name(zone, name)).result(timeout=self.op_timeout)
        except gexc.NotFound:
            return


class QueuedTpuProvider(TpuProvider):
    """Cloud TPU VMs obtained through queued resources (tpu_v2, REST; gcp-facts §19; functions/models/queued.py): the
    node `{job}-{attempt}` is asked for by a request of the same id, with the node's spec inside. The request's tier
    is the slot's model (spot → spot; standard → no tier, an on-demand request) and its queueing_policy.valid_until_duration the job's
    accelerator.queue_wait_minutes. `get` reports the request's state (queued.raw) until it is ACTIVE, then the
    node's; `delete` deletes the request with force, which deletes its node first (a request that holds no node
    would be deleted without force as well, but a waiting one may be provisioning by then)."""

    kind = queued.PROVIDER
    # How long a create waits for its operation. Whether Cloud TPU ends it once the request is queued or only once it
    # is ACTIVE is unverified (gcp-facts §19); the request's state is observed anyway, so an operation still running
    # then is not waited on for the whole wait for capacity (it would hold a function instance for up to
    # queue_wait_minutes): the request exists, its create is done.
    create_wait_seconds = 60.0

    def _request(self, zone: str, name: str) -> str:
        return f"projects/{self.project}/locations/{zone}/queuedResources/{name}"

    def get(self, zone: str, name: str) -> str | None:
        try:
            request = self.clients.tpu().get_queued_resource(name=self._request(zone, name))
        except gexc.NotFound:
            return None
        state = tpu_v2.QueuedResourceState.State(request.state.state).name
        if state != "ACTIVE":
            return queued.raw(state)
        return super().get(zone, name) or queued.raw(state)  # ACTIVE, its node not shown yet

    def list_labelled(self, zone: str) -> list[tuple[str, dict[str, str]]]:
        """(id, its node's labels) of every queued resource in `zone` whose node carries the respawn-job label."""
        requests = self.clients.tpu().list_queued_resources(parent=f"projects/{self.project}/locations/{zone}")
        out = []
        for r in requests:
            labels = dict(r.tpu.node_spec[0].node.labels) if r.tpu.node_spec else {}
            if LABEL_JOB in labels:
                out.append((r.name.rsplit("/", 1)[-1], labels))
        return out

    def request(self, spec: JobSpec, zone: str, name: str, attempt: int, provisioning: str, startup_script: str,
                service_account: str | None = None, handover: Handover | None = None) -> tpu_v2.QueuedResource:
        tier = models.of(provisioning).queued_tier()  # raises for a model a queued resource has no tier for
        node = self.node(spec, attempt, provisioning, startup_script, service_account, handover)
        node.scheduling_config = None  # the tier is the request's
        parent = f"projects/{self.project}/locations/{zone}"
        wait = duration_pb2.Duration(seconds=int(spec.accelerator.queue_wait_seconds))  # type: ignore[union-attr]
        request = tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
                parent=parent, node_id=name, node=node)]),
            queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration=wait))
        if tier == "spot":
            request.spot = tpu_v2.QueuedResource.Spot()
        return request

    def create(self, spec: JobSpec, zone: str, name: str, attempt: int, provisioning: str, startup_script: str,
               slot: int = 0, service_account: str | None = None, handover: Handover | None = None) -> bool:
        """Create the request and wait for its operation (the sim ends it once the request is queued: unverified
        whether Cloud TPU ends it then or once ACTIVE; gcp-facts §19). A quota refusal raises as a node's does."""
        body = self.request(spec, zone, name, attempt, provisioning, startup_script, service_account, handover)
        try:
            op = self.clients.tpu().create_queued_resource(parent=f"projects/{self.project}/locations/{zone}",
                                                           queued_resource_id=name, queued_resource=body)
            op.result(timeout=min(self.op_timeout, self.create_wait_seconds))
        except (gexc.AlreadyExists, gexc.Conflict):
            return False
        except concurrent.futures.TimeoutError:
            if self.get(zone, name) is None:
                raise
        return True

    def delete(self, zone: str, name: str) -> None:
        try:
            self.clients.tpu().delete_queued_resource(request=tpu_v2.DeleteQueuedResourceRequest(
                name=self._request(zone, name), force=True)).result(timeout=self.op_timeout)
        except gexc.NotFound:
            return
