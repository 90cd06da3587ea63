"""functions/placement.py: error classification from the real exception shapes, the backoff, the capacity key."""

import json
from datetime import datetime, timedelta, timezone

import pytest
from google.api_core import exceptions as gexc
from google.cloud import compute_v1
from google.rpc import error_details_pb2

from respawn.control import placement
from respawn.control.actions import Act, Action
from respawn.control.outcomes import Outcome, followup
from respawn.schema import SlotStatus, parse_spec

NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)


def spec(**over):
    base = {
        "id": "job", "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"}, "zones": ["z1-a", "z1-b", "z1-c"],
        "trainer": {"command": ["python", "t.py"]}, "checkpoint_uri": "gs://bucket/job",
    }
    base.update(over)
    return parse_spec({**base, "zones": [z.replace("z1", "us-central1") for z in base["zones"]]})


def op_error(code, message, http=503):
    """What ExtendedOperation.result() raises for a finished operation with an error (python-api-core)."""
    errors = [compute_v1.Errors(code=code, message=message)]
    return gexc.from_http_status(http, message, errors=errors)


STOCKOUT = ("The zone 'projects/p/zones/us-central1-a' does not have enough resources available to fulfill the "
            "request.  Try a different zone, or try again later.")


@pytest.mark.parametrize(
    "exc,kind,code",
    [
        (op_error("ZONE_RESOURCE_POOL_EXHAUSTED", STOCKOUT), "capacity", "ZONE_RESOURCE_POOL_EXHAUSTED"),
        (op_error("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", STOCKOUT + " (resource type:compute)"), "capacity",
         "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"),
        (op_error("QUOTA_EXCEEDED", "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 1.0 in region us-central1.", 403),
         "quota", "QUOTA_EXCEEDED"),
        (op_error("UNSUPPORTED_OPERATION", "Instance was preempted during creation", 400), "capacity", "UNSUPPORTED_OPERATION"),
        (gexc.Forbidden("quota", errors=[{"reason": "quotaExceeded", "message": "Quota exceeded"}]), "quota", "quotaExceeded"),
        (gexc.ServiceUnavailable("x", errors=[{"code": "insufficientCapacity"}]), "capacity", "insufficientCapacity"),
        (gexc.ResourceExhausted('There is no more capacity in the zone "europe-west4-a"; you can try in another zone '
                                "where Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions) [EID: 0x1]"),
         "capacity", "ResourceExhausted"),
        (gexc.FailedPrecondition("Insufficient reserved capacity. Contact customer support to increase your reservation."),
         "capacity", "FailedPrecondition"),
        (gexc.InvalidArgument("Cloud TPU received a bad request. update is not supported while in state PREEMPTED"),
         "capacity", "InvalidArgument"),
        (gexc.ResourceExhausted("Quota 'TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI' exhausted. Limit 32 in region "
                                "europe-west4"), "quota", "ResourceExhausted"),
        (gexc.Conflict("The resource 'projects/p/zones/z/instances/job-1' already exists"), "exists", "Conflict"),
        (gexc.AlreadyExists("node already exists"), "exists", "AlreadyExists"),
        (gexc.NotFound("gone"), "not_found", "NotFound"),
        (gexc.BadRequest("Invalid value for field 'resource.machineType': 'zzz'."), "fatal", "BadRequest"),
        (gexc.InternalServerError("backend error"), "transient", "InternalServerError"),
        (gexc.ServiceUnavailable("try again"), "transient", "ServiceUnavailable"),
        (gexc.ServiceUnavailable("The service is currently unavailable."), "transient", "ServiceUnavailable"),
        (ConnectionError("reset by peer"), "transient", "ConnectionError"),
    ],
)
def test_classify_real_error_shapes(exc, kind, code):
    c = placement.classify(exc)
    assert (c.kind, c.code) == (kind, code)


RATE_MESSAGE = ("Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service "
                "'compute.googleapis.com' for consumer 'project_number:123456789012'.")


def rest_error(status, error):
    """What a REST client (compute_v1) raises: python-api-core's from_http_response on the JSON error body."""
    import requests

    response = requests.Response()
    response.status_code = status
    response._content = json.dumps({"error": error}).encode()
    response.request = requests.Request("POST", "https://compute.googleapis.com/compute/v1/projects/p/zones/"
                                        "us-central1-a/instances").prepare()
    return gexc.from_http_response(response)


RATE_LIMITED = [
    # Compute Engine: 403 with the reason rateLimitExceeded in error.errors[] (gcp-facts §4).
    rest_error(403, {"code": 403, "message": RATE_MESSAGE, "errors": [
        {"message": RATE_MESSAGE, "domain": "usageLimits", "reason": "rateLimitExceeded"}]}),
    # The same, as the Forbidden the existing quota row builds by hand.
    gexc.Forbidden(RATE_MESSAGE, errors=[{"reason": "rateLimitExceeded", "message": "Rate Limit Exceeded"}]),
    # APIs that answer 429 RESOURCE_EXHAUSTED with a google.rpc.ErrorInfo detail (REST and gRPC).
    rest_error(429, {"code": 429, "message": RATE_MESSAGE, "status": "RESOURCE_EXHAUSTED", "details": [
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED",
         "domain": "googleapis.com", "metadata": {"quota_limit": "QueriesPerMinutePerProject"}}]}),
    gexc.ResourceExhausted(RATE_MESSAGE.replace("compute", "tpu"), error_info=error_details_pb2.ErrorInfo(
        reason="RATE_LIMIT_EXCEEDED", domain="googleapis.com")),
    # An operation error that carries the code.
    op_error("RATE_LIMIT_EXCEEDED", RATE_MESSAGE, 403),
]


@pytest.mark.parametrize("exc", RATE_LIMITED, ids=["compute-403", "forbidden", "rest-429-errorinfo", "grpc-errorinfo", "op-error"])
def test_api_rate_limit_is_transient_never_a_zone_refusal(exc):
    # A project-wide rate quota refills within a minute: retried by redelivery, and no zone is cooled down for it.
    c = placement.classify(exc)
    assert c.kind == "transient" and c.code.upper().replace("_", "") == "RATELIMITEXCEEDED"
    create = Action(Act.CREATE, zone="us-central1-a", node="job-1", attempt=1, provisioning="spot")
    f = followup(spec(), create, Outcome.of(c), NOW)
    assert f.propagate and f.capacity is None and not f.record


def test_backoff_grows_exponentially_is_capped_and_waits_for_the_first_cooldown_end():
    s = spec(placement={"max_backoff_seconds": 100})
    waits = [(placement.backoff(s, SlotStatus(consecutive_failures=n), {}, NOW, 10) - NOW).total_seconds() for n in range(1, 7)]
    assert waits == [10, 20, 40, 80, 100, 100]
    blocked = {"us-central1-b": NOW + timedelta(seconds=60)}
    assert (placement.backoff(s, SlotStatus(consecutive_failures=1), blocked, NOW, 10) - NOW).total_seconds() == 60


def test_accelerator_key_names_what_a_capacity_record_is_about():
    assert placement.accelerator_key(spec()) == "g2-standard-8"
    gpu = spec(accelerator={"kind": "gpu", "machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-t4"})
    assert placement.accelerator_key(gpu) == "nvidia-tesla-t4"
    tpu = spec(accelerator={"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"})
    assert placement.accelerator_key(tpu) == "v5litepod-8"


@pytest.mark.parametrize("reason, model, pools", [
    ("capacity", "spot", ["spot"]),
    ("capacity", "preemptible", ["spot"]),  # Spot and preemptible VMs share the zone's spare capacity
    ("capacity", "flex-start", ["flex-start"]),
    ("capacity", "standard", ["standard"]),
    ("quota", "spot", ["flex-start", "spot"]),  # the PREEMPTIBLE_* quota is flex-start's too
    ("quota", "flex-start", ["flex-start", "spot"]),
    ("quota", "standard", ["standard"]),
])
def test_a_refusal_cools_the_pools_that_share_what_was_refused(reason, model, pools):
    assert placement.pools_refused(reason, model) == pools


def test_cooldowns_per_model_a_bare_zone_holds_for_every_model_the_later_end_wins():
    t1, t2 = datetime(2025, 1, 1, tzinfo=timezone.utc), datetime(2025, 1, 2, tzinfo=timezone.utc)
    blocked = {placement.pool_key("a", "spot"): t1, "b": t1, placement.pool_key("b", "spot"): t2,
               placement.pool_key("c", "standard"): t2}
    assert placement.cooldowns(blocked, "spot") == {"a": t1, "b": t2}
    assert placement.cooldowns(blocked, "preemptible") == {"a": t1, "b": t2}
    assert placement.cooldowns(blocked, "flex-start") == {"b": t1}
    assert placement.cooldowns(blocked, "standard") == {"b": t1, "c": t2}
