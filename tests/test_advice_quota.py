"""respawn.advice, pure: the quota metric of each accelerator and provisioning model, the verdict `respawn jobs
register` gives on a job's regional quotas, and what the advice answers mean."""

from __future__ import annotations

import pytest

from respawn.advice import (Quota, Shape, ZoneAdvice, capacity_request, gpu_of, parse_capacity, parse_duration,
                            quota_metric, quota_verdict)

L4 = Shape("g2-standard-8")
T4x2 = Shape("n1-standard-8", "nvidia-tesla-t4", 2)
A, B, E = "us-central1-a", "us-central1-b", "europe-west4-a"


@pytest.mark.parametrize("gpu, model, metric", [
    ("nvidia-l4", "spot", "PREEMPTIBLE_NVIDIA_L4_GPUS"),
    ("nvidia-l4", "flex-start", "PREEMPTIBLE_NVIDIA_L4_GPUS"),  # flex-start uses the preemptible quota (§18)
    ("nvidia-tesla-t4", "standard", "NVIDIA_T4_GPUS"),
    ("nvidia-h100-80gb", "preemptible", "PREEMPTIBLE_NVIDIA_H100_GPUS"),  # not NVIDIA_H100_80GB_GPUS (§21)
    ("nvidia-unknown", "spot", None),
])
def test_quota_metrics(gpu, model, metric):
    assert quota_metric(gpu, model) == metric


def test_built_in_gpus_and_their_counts():
    assert (L4.gpu, L4.gpus) == ("nvidia-l4", 1)
    assert (Shape("a3-highgpu-8g").gpu, Shape("a3-highgpu-8g").gpus) == ("nvidia-h100-80gb", 8)
    assert (T4x2.gpu, T4x2.gpus) == ("nvidia-tesla-t4", 2)
    assert Shape("n2-standard-8").gpu is None and gpu_of("g2-standard-24") == "nvidia-l4"


def q(limit, usage=0):
    return Quota(limit, usage)


@pytest.mark.parametrize("zones, models, quotas, refuse, says", [
    # A PREEMPTIBLE_ limit of 0 alone may fall back to the on-demand quota (unverified, §21): a warning.
    ([A], ["spot"], {"us-central1": {"PREEMPTIBLE_NVIDIA_L4_GPUS": q(0), "NVIDIA_L4_GPUS": q(8)}}, False,
     ["PREEMPTIBLE_NVIDIA_L4_GPUS limit is 0; spot VMs may still be charged to NVIDIA_L4_GPUS", "gcloud beta quotas"]),
    ([A], ["spot"], {"us-central1": {"PREEMPTIBLE_NVIDIA_L4_GPUS": q(0)}}, False, ["may still be charged"]),
    # …and with the on-demand limit 0 too, that tier cannot run there.
    ([A, B], ["spot"], {"us-central1": {"PREEMPTIBLE_NVIDIA_L4_GPUS": q(0), "NVIDIA_L4_GPUS": q(0)}}, True,
     ["no spot VM can start there", "--dimensions=region=us-central1",
      "--filter=metric=compute.googleapis.com/preemptible_nvidia_l4_gpus"]),
    ([A, E], ["standard"], {"us-central1": {"NVIDIA_L4_GPUS": q(0)}, "europe-west4": {"NVIDIA_L4_GPUS": q(0)}}, True,
     ["us-central1: NVIDIA_L4_GPUS limit is 0", "europe-west4: NVIDIA_L4_GPUS limit is 0", "region=europe-west4"]),
    # One region can serve: a warning for the other, no refusal.
    ([A, E], ["standard"], {"us-central1": {"NVIDIA_L4_GPUS": q(0)}, "europe-west4": {"NVIDIA_L4_GPUS": q(4)}},
     False, ["us-central1: NVIDIA_L4_GPUS limit is 0"]),
    # One tier can serve: no refusal.
    ([A], ["spot", "standard"], {"us-central1": {"PREEMPTIBLE_NVIDIA_L4_GPUS": q(0), "NVIDIA_L4_GPUS": q(2)}},
     False, ["may still be charged"]),
    ([A], ["spot", "standard"], {"us-central1": {"PREEMPTIBLE_NVIDIA_L4_GPUS": q(0), "NVIDIA_L4_GPUS": q(0)}},
     True, ["no standard VM can start there"]),
    # Too little left: a warning naming what the job needs.
    ([A], ["standard"], {"us-central1": {"NVIDIA_L4_GPUS": q(4, 3)}}, False, ["has 1 of 4 free; the job needs 2"]),
    # Unknown (a region not read, a metric not listed): nothing to say, never a refusal.
    ([A, E], ["standard"], {"us-central1": {"NVIDIA_L4_GPUS": q(0)}, "europe-west4": None}, False,
     ["us-central1: NVIDIA_L4_GPUS limit is 0"]),
    ([A], ["standard"], {"us-central1": {}}, False, []),
    ([A], ["standard"], {}, False, []),
])
def test_quota_verdict(zones, models, quotas, refuse, says):
    verdict = quota_verdict(zones, models, L4, 2, quotas, "proj")
    text = "\n".join(verdict.lines)
    assert verdict.refuse is refuse, text
    assert all(s in text for s in says), text
    assert bool(verdict.lines) is bool(says), text


def test_a_gpu_the_table_does_not_know_says_nothing():
    zero = {"us-central1": {"NVIDIA_L4_GPUS": q(0)}}
    assert quota_verdict([A], ["standard"], Shape("n1-standard-8", "nvidia-new-gpu"), 1, zero, "p").lines == []


def test_capacity_answers():
    body = {"recommendations": [
        {"scores": {"obtainability": 0.4, "estimatedUptime": "600s"}, "shards": [{"zone": f"https://x/zones/{B}"}]},
        {"scores": {"obtainability": 0.8}, "shards": [{"zone": f"https://x/zones/{A}"}]}]}
    assert parse_capacity(body, A) == ZoneAdvice(0.8, None)
    assert parse_capacity(body, B) == ZoneAdvice(0.4, 600.0)
    assert parse_capacity(body, E) is None
    assert parse_duration("3600s") == 3600.0 and parse_duration("1h") is None
    req = capacity_request(T4x2, A, 3)
    assert req["distributionPolicy"]["zones"] == [{"zone": f"zones/{A}"}] and req["size"] == 3
    assert req["instanceFlexibilityPolicy"]["instanceSelections"]["respawn"]["guestAccelerators"] == [
        {"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 2}]


def test_the_cli_asks_for_a_scope_the_advice_methods_accept(monkeypatch):
    """advice.capacity/capacityHistory list only these two scopes in compute.v1's discovery document (rev 20261106,
    issue #36 D1): with compute.readonly, service-account credentials get 403 from `respawn zones`."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials

    from respawn.app import compute_read
    monkeypatch.delenv(compute_read.ENV_COMPUTE_ENDPOINT, raising=False)
    monkeypatch.delenv("FIRESTORE_EMULATOR_HOST", raising=False)
    asked = []
    monkeypatch.setattr(google.auth, "default", lambda scopes=None: (asked.extend(scopes) or AnonymousCredentials(), "p"))
    found = compute_read.reader(None)  # a Reader; where this machine cannot reach Google, the probe's one line
    assert isinstance(found, compute_read.Reader) or "compute.googleapis.com" in found and "does not answer" in found
    assert set(asked) & {"https://www.googleapis.com/auth/cloud-platform", "https://www.googleapis.com/auth/compute"}
