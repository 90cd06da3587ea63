"""Every job-spec validation rule, with valid and invalid examples; node names; record models."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from respawn import contract, deployment, schema
from respawn.control import composition, nodespec
from respawn.control.settings import NodeOptions
from respawn.schema import SpecError, parse_spec

ROOT = Path(__file__).resolve().parents[1]

GPU = {
    "id": "train-1",
    "accelerator": {"kind": "gpu", "machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-t4",
                    "accelerator_count": 2},
    "zones": ["us-central1-a", "europe-west4-b"],
    "trainer": {"command": ["python", "train.py"], "env": {"LR": "0.1"}},
    "checkpoint_uri": "gs://my-bucket/runs/train-1",
}
TPU = {
    "id": "tpu-1",
    "accelerator": {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"},
    "provisioning": "preemptible",
    "zones": ["us-west4-a"],
    "trainer": {"command": ["python", "-m", "train"]},
    "checkpoint_uri": "file:///tmp/ckpt",
}


def with_(base: dict, path: str, value) -> dict:
    """A copy of `base` with the dotted `path` set to `value` (value `...` deletes it)."""
    doc = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return doc


def errors_of(doc) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(doc)
    return info.value.errors


def admission_errors(doc) -> list[str]:
    """What the control plane's admission check (a valid spec whose nodes fit the platform's limits) says of doc,
    which schema.parse_spec accepts."""
    parse_spec(doc)
    with pytest.raises(SpecError) as info:
        composition.admit(doc)
    return info.value.errors


def test_minimal_gpu_spec_gets_documented_defaults():
    spec = parse_spec(GPU)
    assert spec.provisioning == "spot"
    assert spec.termination_action == "STOP"
    assert (spec.max_failures, spec.max_preemptions, spec.preemption_rate) == (3, None, None)
    assert spec.placement.cooldown_seconds == 600
    assert spec.placement.avoid_preempting_zone is True
    assert spec.placement.on_demand_fallback is False
    assert spec.accelerator.boot_disk_gb == 200
    assert spec.labels == {}


def test_max_restarts_is_read_as_max_failures_and_stored_so_with_a_warning():
    spec = parse_spec({**GPU, "max_restarts": 7})
    assert spec.max_failures == 7
    doc = spec.to_doc()
    assert doc["max_failures"] == 7 and "max_restarts" not in doc
    assert parse_spec(doc) == spec  # the stored form reads back the same, with nothing deprecated left in it
    assert schema.deprecations({**GPU, "max_restarts": 7}) == [schema.DEPRECATED_MAX_RESTARTS]
    assert schema.deprecations(doc) == []
    assert "max_failures" in schema.DEPRECATED_MAX_RESTARTS
    errors = errors_of({**GPU, "max_restarts": 7, "max_failures": 3})
    assert errors == ["(job): max_restarts and max_failures both given: max_restarts is the old name of max_failures; "
                      "keep max_failures alone"]


def test_preemption_limits_default_to_none_and_the_rate_to_alert():
    spec = parse_spec({**GPU, "max_preemptions": 100, "preemption_rate": {"max": 6, "window_hours": 24}})
    assert spec.max_preemptions == 100
    assert (spec.preemption_rate.max, spec.preemption_rate.window_hours, spec.preemption_rate.action) == (6, 24, "alert")


def test_tpu_spec_has_no_termination_action():
    spec = parse_spec(TPU)
    assert spec.accelerator.kind == "tpu" and spec.termination_action is None


def test_spec_round_trips_through_its_document():
    spec = parse_spec(GPU)
    assert parse_spec(spec.to_doc()) == spec
    with_setup = parse_spec({**GPU, "trainer": {**GPU["trainer"], "setup": [["make"], ["python", "x.py"]]}})
    assert parse_spec(with_setup.to_doc()) == with_setup


def test_one_node_is_the_default_and_min_nodes_resolves_to_nodes():
    # A document written before multi-node jobs existed (no nodes fields) is still valid: one Spot node.
    spec = parse_spec(GPU)
    assert (spec.nodes, spec.min_nodes, spec.on_demand_nodes) == (1, 1, 0)
    assert parse_spec({**GPU, "nodes": 3}).min_nodes == 3  # default: every node is needed
    hybrid = parse_spec({**GPU, "nodes": 3, "min_nodes": 2, "on_demand_nodes": 1})
    assert (hybrid.nodes, hybrid.min_nodes, hybrid.on_demand_nodes) == (3, 2, 1)
    assert parse_spec({**GPU, "nodes": schema.MAX_NODES, "on_demand_nodes": schema.MAX_NODES}).nodes == schema.MAX_NODES
    assert parse_spec({**GPU, "provisioning": "preemptible", "nodes": 2, "on_demand_nodes": 1}).on_demand_nodes == 1


def test_the_stored_spec_holds_min_nodes_resolved_and_round_trips():
    spec = parse_spec({**GPU, "nodes": 4, "on_demand_nodes": 1})
    doc = spec.to_doc()
    assert (doc["nodes"], doc["min_nodes"], doc["on_demand_nodes"]) == (4, 4, 1)
    assert type(doc["min_nodes"]) is int
    assert parse_spec(doc) == spec
    elastic = parse_spec({**GPU, "nodes": 4, "min_nodes": 2})
    assert parse_spec(elastic.to_doc()) == elastic and elastic.to_doc()["min_nodes"] == 2


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"nodes": 0}, "nodes: Input should be greater than or equal to 1"),
        ({"nodes": schema.MAX_NODES + 1}, f"nodes: Input should be less than or equal to {schema.MAX_NODES}"),
        ({"nodes": "three"}, "nodes: Input should be a valid integer"),
        ({"min_nodes": 0}, "min_nodes: Input should be greater than or equal to 1"),
        ({"nodes": 3, "min_nodes": 4}, "min_nodes: 4 is more than nodes (3); min_nodes is the fewest nodes the job "
                                       "may run with while replacements are pending, at most nodes"),
        ({"min_nodes": 2}, "min_nodes: 2 is more than nodes (1)"),
        ({"on_demand_nodes": -1}, "on_demand_nodes: Input should be greater than or equal to 0"),
        ({"nodes": 3, "on_demand_nodes": 4}, "on_demand_nodes: 4 is more than nodes (3); on_demand_nodes counts "
                                             "toward nodes, the rest are Spot"),
        ({"provisioning": "standard", "nodes": 2, "on_demand_nodes": 1},
         "on_demand_nodes: 1: with provisioning standard every node is on-demand already; set provisioning spot "
         "(or preemptible)"),
    ],
)
def test_node_count_errors_name_the_field(fields, expected):
    errors = errors_of({**GPU, **fields})
    assert len(errors) == 1 and errors[0].startswith(expected), errors


def test_an_invalid_nodes_is_named_once_not_again_through_min_nodes():
    assert errors_of({**GPU, "nodes": 0, "min_nodes": 2, "on_demand_nodes": 1}) == [
        "nodes: Input should be greater than or equal to 1"]


def test_a_tpu_job_is_one_node():
    assert parse_spec({**TPU, "nodes": 1}).nodes == 1
    assert errors_of({**TPU, "nodes": 2}) == [
        "nodes: 2: a TPU job is one node, which may be a multi-host slice such as v5litepod-16; for more chips pick "
        "a larger accelerator.accelerator_type and leave nodes at 1"]


def test_the_hybrid_example_is_three_nodes_one_of_them_on_demand():
    # examples/jobs/hybrid-ddp.yaml is the one example of these fields (tests/test_cli_workdir.py validates every
    # example through the CLI); its workdir is a directory the CLI packs, so it is left out here.
    doc = yaml.safe_load((ROOT / "examples" / "jobs" / "hybrid-ddp.yaml").read_text())
    del doc["trainer"]["workdir"]
    spec = parse_spec(doc)
    assert (spec.nodes, spec.on_demand_nodes, spec.min_nodes, spec.provisioning) == (3, 1, 2, "spot")


@pytest.mark.parametrize("job_id", ["a", "job-1", "a" * schema.MAX_JOB_ID_LEN, "x9-y8"])
def test_valid_job_ids(job_id):
    assert parse_spec(with_(GPU, "id", job_id)).id == job_id


@pytest.mark.parametrize(
    "job_id, fragment",
    [
        ("Job", "not a valid job id"),
        ("1job", "not a valid job id"),
        ("job-", "not a valid job id"),
        ("job_1", "not a valid job id"),
        ("", "at least 1 character"),
        ("a" * (schema.MAX_JOB_ID_LEN + 1), f"at most {schema.MAX_JOB_ID_LEN} characters"),
    ],
)
def test_invalid_job_ids(job_id, fragment):
    (error,) = errors_of(with_(GPU, "id", job_id))
    assert error.startswith("id: ") and fragment in error


def test_longest_job_id_still_gives_valid_node_names():
    name = schema.node_name("a" * schema.MAX_JOB_ID_LEN, schema.MAX_ATTEMPT)
    assert len(name) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)


@pytest.mark.parametrize(
    "path, value, expected",
    [
        ("accelerator.kind", "fpga", "accelerator: kind must be 'gpu' or 'tpu'"),
        ("accelerator.kind", ..., "accelerator: kind is required: 'gpu' or 'tpu'"),
        ("accelerator.machine_type", ..., "accelerator.machine_type: required field is missing"),
        ("accelerator.machine_type", "N1_Standard", "accelerator.machine_type: 'N1_Standard' is not a Compute Engine type"),
        ("accelerator.accelerator_count", 0, "accelerator.accelerator_count: Input should be greater than or equal to 1"),
        ("accelerator.accelerator_count", 17, "accelerator.accelerator_count: Input should be less than or equal to 16"),
        ("accelerator.boot_disk_gb", 5, "accelerator.boot_disk_gb: Input should be greater than or equal to 10"),
        ("accelerator.boot_image", "ubuntu:22.04", "accelerator.boot_image: 'ubuntu:22.04' is not an image"),
        ("accelerator.gpus", 1, "accelerator.gpus: unknown field"),
        ("provisioning", "cheap", "provisioning: Input should be 'spot', 'preemptible', 'flex-start', 'standard' or 'reservation'"),
        ("termination_action", "HIBERNATE", "termination_action: Input should be 'STOP' or 'DELETE'"),
        ("zones", [], "zones: must not be empty"),
        ("zones", "us-central1-a", "zones: Input should be a valid list"),
        ("zones", ["us-central1-a", "US-CENTRAL1-B"], "zones[1]: 'US-CENTRAL1-B' is not a zone name"),
        ("zones", ["us-central1"], "zones[0]: 'us-central1' is not a zone name"),
        ("zones", ["us-central1-a", "us-central1-b", "us-central1-a"],
         "zones: zone 'us-central1-a' at position 2 repeats position 0"),
        ("trainer.command", "python train.py", "trainer.command: must be an argv list"),
        ("trainer.command", [], "trainer.command: must not be empty"),
        ("trainer.command", ["python", ""], "trainer.command[1]: String should have at least 1 character"),
        ("trainer.env", {"BAD-NAME": "x"}, "trainer.env: 'BAD-NAME' is not a valid environment variable name"),
        ("trainer.env", {"RESPAWN_JOB_ID": "x"}, "trainer.env: 'RESPAWN_JOB_ID': RESPAWN_* variables are set by the node agent"),
        ("trainer.env", {"N": 3}, "trainer.env.N: Input should be a valid string"),
        ("trainer.setup", "pip install -r requirements.txt", "trainer.setup: must be a list of argv commands such as [[pip"),
        ("trainer.setup", ["pip install x"], "trainer.setup: [0] must be an argv list such as [pip, install"),
        ("trainer.setup", [["make"], []], "trainer.setup[1]: must not be empty"),
        ("trainer.setup", [{"cmd": ["make"]}], "trainer.setup: [0] must be an argv list, or {argv: [...]}"),
        ("trainer.workdir", "gs://b/code.tar.gz", "trainer.workdir:"),
        ("trainer.workdir", "https://example.com/x.tar.gz", "trainer.workdir: must be a gs:// (or file:/// for local"),
        ("trainer.interpreter", "bin/python", "trainer.interpreter: 'bin/python': use a program name found on PATH"),
        ("trainer.interpreter", "python3 -u", "trainer.interpreter: 'python3 -u': one program, no arguments"),
        ("trainer.interpreter", "", "trainer.interpreter: String should have at least 1 character"),
        ("trainer", ..., "trainer: required field is missing"),
        ("checkpoint_uri", "s3://bucket/x", "checkpoint_uri: must be gs://BUCKET/PREFIX, or file:///ABSOLUTE/PATH"),
        ("checkpoint_uri", "file://relative", "checkpoint_uri: must be gs://BUCKET/PREFIX"),
        ("checkpoint_uri", "gs://Bad_Bucket/x", "checkpoint_uri: 'Bad_Bucket' is not a valid Cloud Storage bucket name"),
        # Nodes may only read gs://B/respawn/ (the release, the workdir archives): checkpoints there could not be written.
        ("checkpoint_uri", "gs://my-bucket/respawn/ckpt", "checkpoint_uri: gs://my-bucket/respawn/ is Respawn's own folder"),
        ("checkpoint_uri", "gs://my-bucket/respawn", "checkpoint_uri: gs://my-bucket/respawn/ is Respawn's own folder"),
        ("max_failures", -1, "max_failures: Input should be greater than or equal to 0"),
        ("max_failures", "many", "max_failures: Input should be a valid integer"),
        ("max_restarts", -1, "(job): max_restarts (the old name of max_failures): -1 is not a whole number"),
        ("max_restarts", "many", "(job): max_restarts (the old name of max_failures): 'many' is not"),
        ("max_preemptions", -1, "max_preemptions: Input should be greater than or equal to 0"),
        ("preemption_rate", {"max": 3}, "preemption_rate.window_hours: required field is missing"),
        ("preemption_rate", {"max": 0, "window_hours": 1}, "preemption_rate.max: Input should be greater than or"),
        ("preemption_rate", {"max": 3, "window_hours": 1, "action": "move"},
         "preemption_rate.action: Input should be 'alert', 'backoff' or 'fail'"),
        ("placement.cooldown", 5, "placement.cooldown: unknown field"),
        ("placement.fallback_after_failures", 0, "placement.fallback_after_failures: Input should be greater than or equal to 1"),
        ("labels", {"Team": "x"}, "labels: label key 'Team'"),
        ("labels", {"team": "Research"}, "labels: label 'team' value 'Research'"),
        ("labels", {"respawn-job": "x"}, "labels: label 'respawn-job' is set by Respawn itself"),
        ("zone", ["us-central1-a"], "zone: unknown field"),
    ],
)
def test_invalid_fields_are_named(path, value, expected):
    errors = errors_of(with_(GPU, path, value))
    assert any(e.startswith(expected) for e in errors), errors


@pytest.mark.parametrize("key", contract.RESPAWN_LABELS)
def test_every_label_respawn_writes_is_reserved(key):
    assert errors_of(with_(GPU, "labels", {key: "0"})) == [
        f"labels: label {key!r} is set by Respawn itself (it writes respawn-job, respawn-attempt, respawn-slot)"]


def _labels(n: int) -> dict[str, str]:
    return {f"k{i}": "v" for i in range(n)}


def test_labels_leave_room_for_those_respawn_writes_on_each_node():
    """A node carries at most 64 labels: one node gets respawn-job and respawn-attempt besides the job's own, each
    node of a multi-node job respawn-slot too. Whatever is accepted fits on every node the controller would make."""
    one, several = composition.admit({**GPU, "labels": _labels(62)}), composition.admit({**GPU, "nodes": 8, "labels": _labels(61)})
    assert len(nodespec.labels(one, contract.MAX_ATTEMPT)) == contract.MAX_NODE_LABELS
    assert len(nodespec.labels(several, contract.MAX_ATTEMPT, slot=7)) == contract.MAX_NODE_LABELS
    assert admission_errors({**GPU, "labels": _labels(63)}) == [
        "labels: 63 labels: a node carries at most 64, and Respawn writes 2 of its own on this job's nodes "
        "(respawn-attempt, respawn-job); keep at most 62"]
    assert admission_errors({**GPU, "nodes": 2, "labels": _labels(62)}) == [
        "labels: 62 labels: a node carries at most 64, and Respawn writes 3 of its own on this job's nodes "
        "(respawn-attempt, respawn-job, respawn-slot); keep at most 61"]


# The startup script and a deployment's values as long as they get: the controller's real metadata for a spec the
# registration check accepts must be within the limits too.
RELEASE = ("gs://" + "b" * 63 + "/respawn/releases/" + "0" * 36 + "/respawn_ml-10.20.30-py3-none-any.whl#sha256="
           + "f" * 64)
LONG_OPTIONS = NodeOptions(agent=RELEASE, library=RELEASE, sweep_topic="projects/" + "p" * 30 + "/topics/" + "t" * 255,
                           heartbeat_seconds=0.1 + 0.2, notice_budget_seconds=0.1 + 0.2)


def _node_metadata_bytes(spec) -> tuple[int, int]:
    """(the largest value, all keys and values) of the metadata the controller creates spec's node with."""
    items = nodespec.metadata(spec, contract.MAX_ATTEMPT, "p" * 30, deployment.startup_script(), LONG_OPTIONS)
    return (max(len(v.encode()) for v in items.values()),
            sum(len(k.encode()) + len(v.encode()) for k, v in items.items()))


def test_the_stand_ins_of_the_check_are_at_least_the_real_values():
    assert len(deployment.startup_script().encode()) <= composition.STARTUP_SCRIPT_ALLOWANCE
    for name in ("agent", "library", "sweep_topic"):
        assert len(getattr(LONG_OPTIONS, name)) <= len(composition._DEPLOYMENT_STAND_INS[name]), name
    assert len(repr(LONG_OPTIONS.heartbeat_seconds)) <= len(repr(composition._DEPLOYMENT_STAND_INS["heartbeat_seconds"]))


@pytest.mark.parametrize("path, big", [
    ("trainer.env", lambda n: {"BLOB": "x" * n}),
    ("trainer.command", lambda n: ["python", "train.py", "x" * n]),
    ("trainer.setup", lambda n: [["pip", "install", "x" * n]]),
])
def test_a_spec_whose_node_metadata_would_exceed_256_kib_per_value_is_refused_naming_the_field(path, big):
    # The largest the field may be: accepted, and the controller's own metadata for it (the real startup script,
    # the longest deployment values) is within Compute Engine's limits.
    lo, hi = 0, composition.METADATA_VALUE_LIMIT
    while lo < hi:  # the largest n accepted
        mid = (lo + hi + 1) // 2
        try:
            composition.admit(with_(GPU, path, big(mid)))
            lo = mid
        except SpecError:
            hi = mid - 1
    largest, total = _node_metadata_bytes(composition.admit(with_(GPU, path, big(lo))))
    assert largest <= composition.METADATA_VALUE_LIMIT and total < composition.METADATA_TOTAL_LIMIT
    assert largest > composition.METADATA_VALUE_LIMIT - 4096  # the check is not far stricter than it must be
    (error,) = admission_errors(with_(GPU, path, big(lo + 1)))
    assert re.match(rf"{path}: 25\d\.\d KiB here: the node's metadata value respawn-settings would be 262,145 bytes, "
                    r"over the 262,144 \(256 KiB\) Compute Engine allows per value\. Keep large data out of the job "
                    r"spec: in the workdir", error), error
    (error,) = admission_errors(with_(GPU, path, big(300 * 1024)))
    assert error.startswith(f"{path}: 300.0 KiB here: the node's metadata value respawn-settings would be "), error


def test_a_metadata_error_names_the_field_that_holds_the_most():
    doc = with_(with_(GPU, "trainer.env", {"A": "x" * 200_000}), "trainer.command", ["python", "y" * 70_000])
    (error,) = admission_errors(doc)
    assert error.startswith("trainer.env: 195.3 KiB here: the node's metadata value respawn-settings would be"), error


def test_the_total_metadata_limit_is_checked_with_every_value_within_its_own(monkeypatch):
    # Every value Respawn writes from a spec is inside respawn-settings today, so the 256 KiB per value is met first;
    # the total (keys and values, under 512 KB) is still checked, for what the composition may add later.
    monkeypatch.setattr(composition, "STARTUP_SCRIPT_ALLOWANCE", 255 * 1024)
    assert composition.admit(with_(GPU, "trainer.env", {"A": "x" * 200_000}))
    (error,) = admission_errors(with_(GPU, "trainer.env", {"A": "x" * 250_000}))
    assert re.match(r"trainer\.env: 244\.1 KiB here: the node's metadata would be 5\d\d,\d\d\d bytes in all, over the "
                    r"512 KB Compute Engine allows\. Keep large data", error), error


@pytest.mark.parametrize(
    "path, value, expected",
    [
        ("accelerator.accelerator_type", "v4", "accelerator.accelerator_type: 'v4' is not a TPU accelerator type"),
        ("accelerator.runtime_version", ..., "accelerator.runtime_version: required field is missing"),
        ("accelerator.runtime_version", "Bad Version", "accelerator.runtime_version: 'Bad Version' is not a TPU runtime"),
        ("accelerator.machine_type", "n1-standard-8", "accelerator.machine_type: unknown field"),
        ("termination_action", "STOP", "termination_action: applies only to GPU Spot VMs"),
    ],
)
def test_invalid_tpu_fields_are_named(path, value, expected):
    errors = errors_of(with_(TPU, path, value))
    assert any(e.startswith(expected) for e in errors), errors


def test_termination_action_only_for_gpu_spot():
    assert parse_spec(with_(GPU, "termination_action", "DELETE")).termination_action == "DELETE"
    standard = with_(with_(GPU, "provisioning", "standard"), "termination_action", "STOP")
    assert errors_of(standard) == ["termination_action: applies only to GPU Spot VMs (accelerator.kind gpu, provisioning spot)"]
    assert parse_spec(with_(GPU, "provisioning", "standard")).termination_action is None


def test_every_problem_is_reported_at_once():
    doc = with_(with_(with_(GPU, "id", "Bad"), "zones", []), "extra", 1)
    errors = errors_of(doc)
    assert [e.split(":")[0] for e in errors] == ["id", "zones", "extra"]


@pytest.mark.parametrize("doc", [None, [], "id: x", 3])
def test_non_mapping_documents(doc):
    assert errors_of(doc) == [f"(job): expected a mapping of fields, got {type(doc).__name__}"]


ZONE = st.from_regex(r"[a-z]{2,8}-[a-z]{3,9}[1-9]-[a-f]", fullmatch=True)


@given(st.lists(ZONE, min_size=1, max_size=8, unique=True))
def test_any_unique_zone_list_is_kept_in_order(zones):
    assert parse_spec(with_(GPU, "zones", zones)).zones == zones


@given(st.lists(ZONE, min_size=1, max_size=6), st.data())
def test_a_repeated_zone_is_always_refused(zones, data):
    dup = data.draw(st.sampled_from(zones))
    errors = errors_of(with_(GPU, "zones", zones + [dup]))
    assert any("listed" in e or "repeats position" in e for e in errors)


@given(st.from_regex(r"[a-z]([a-z0-9-]{0,40}[a-z0-9])?", fullmatch=True), st.integers(1, schema.MAX_ATTEMPT))
def test_node_names_parse_back(job_id, attempt):
    assert schema.parse_node_name(schema.node_name(job_id, attempt)) == (job_id, attempt)


@pytest.mark.parametrize("name", ["t1v-n-abc123-w-0x", "job", "job-", "-3", "Job-3", "job-abc"])
def test_foreign_node_names_do_not_parse(name):
    assert schema.parse_node_name(name) is None


def test_node_name_rejects_attempts_out_of_range():
    with pytest.raises(ValueError):
        schema.node_name("job", 0)
    with pytest.raises(ValueError):
        schema.node_name("job", schema.MAX_ATTEMPT + 1)


def test_terminal_states():
    assert {s for s in schema.State if s.terminal} == {
        schema.State.SUCCEEDED, schema.State.FAILED, schema.State.CANCELLED, schema.State.INVALID,
        schema.State.BUDGET_EXHAUSTED,
    }


def test_records_tolerate_fields_from_newer_versions():
    status = schema.JobStatus.model_validate({"state": "RUNNING", "future_field": 1})
    assert status.state is schema.State.RUNNING


def test_events_expire_for_the_ttl_policy():
    ev = schema.JobEvent.new(schema.State.RUNNING, schema.State.PREEMPTED, "audit:compute.instances.preempted")
    assert ev.expire_at - ev.at == schema.EVENT_RETENTION


def test_the_heartbeat_model_reads_exactly_the_fields_the_agent_writes():
    # The agent composes nodes/{node} from respawn.contract.Heartbeat (standard library: it runs without pydantic);
    # the control plane reads it with this model.
    assert tuple(schema.Heartbeat.model_fields) == contract.HEARTBEAT_FIELDS
    assert set(contract.HEARTBEAT_SERVER_TIME_FIELDS) <= set(contract.HEARTBEAT_FIELDS)


def test_the_node_side_of_the_layout_is_the_contracts():
    assert schema.NODES == contract.NODES_COLLECTION == "nodes"
    assert schema.NodeState is contract.NodeState and schema.node_name is contract.node_name
    assert schema.MAX_ATTEMPT == contract.MAX_ATTEMPT


def test_tpu_queued_resource_fields_and_what_they_refuse():
    # issue #26 item 2: accelerator.queued_resource (default: none, read as "a multi-host slice"), its wait.
    base = {"id": "q", "zones": ["us-central2-b"], "trainer": {"command": ["python", "t.py"]},
            "checkpoint_uri": "gs://respawn-ckpt/q"}
    acc = {"kind": "tpu", "accelerator_type": "v4-16", "runtime_version": "tpu-ubuntu2204-base"}
    spec = parse_spec({**base, "accelerator": {**acc, "queued_resource": True, "queue_wait_minutes": 5}})
    assert (spec.accelerator.queued_resource, spec.accelerator.queue_wait_seconds) == (True, 300)
    assert parse_spec({**base, "accelerator": acc}).accelerator.queue_wait_seconds == 30 * 60
    with pytest.raises(SpecError, match="queue_wait_minutes is the wait of a queued resource"):
        parse_spec({**base, "accelerator": {**acc, "queued_resource": False, "queue_wait_minutes": 5}})
    with pytest.raises(SpecError, match="a queued resource's tiers are spot and guaranteed"):
        parse_spec({**base, "accelerator": {**acc, "queued_resource": True}, "provisioning": "preemptible"})
    with pytest.raises(SpecError, match="queue_wait_minutes"):
        parse_spec({**base, "accelerator": {**acc, "queue_wait_minutes": 0.5}})


@pytest.mark.parametrize("machine_type, gpu, takes", [
    ("n1-standard-8", "nvidia-tesla-t4", False), ("a4x-highgpu-4g", None, False), ("g4-standard-48", None, False),
    ("n2-standard-8", None, False), ("g2-standard-8", None, True), ("a2-highgpu-1g", None, True),
    ("a3-highgpu-8g", None, True), ("a4-highgpu-8g", None, True), ("h4d-highmem-192", None, True)])
def test_flex_start_only_on_the_machine_types_google_offers_it_on(machine_type, gpu, takes):
    # "Flex-start VMs support all accelerator-optimized machine types (except A4X and G4) and H4D machine types"
    # (Google's "About flex-start VMs", issue #36 D2): any other is refused at registration, in one line.
    accelerator = {"kind": "gpu", "machine_type": machine_type, **({"accelerator_type": gpu} if gpu else {})}
    spec = {**copy.deepcopy(GPU), "accelerator": accelerator, "termination_action": None,
            "provisioning": ["spot", {"model": "flex-start", "max_run_hours": 2}]}
    if takes:
        assert parse_spec(spec).provisioning_tiers[1].model == "flex-start"
        return
    with pytest.raises(SpecError) as refused:
        parse_spec(spec)
    assert len(refused.value.errors) == 1
    assert f"flex-start does not run {machine_type}" in str(refused.value)
    assert "accelerator-optimized machine types (A2, A3, A4, G2; not A4X or G4) and H4D only" in str(refused.value)
    parse_spec({**spec, "provisioning": ["spot", "standard"]})  # the machine type itself is fine


@pytest.mark.parametrize("accelerator_type", ["tpu7x-8", "tpu7x-128", "v7x-8", "tpu8-16", "v10-8"])
def test_tpu7x_and_later_are_refused_because_only_gke_offers_them(accelerator_type):
    # "To use TPU7x, you must use Google Kubernetes Engine" (cloud.google.com/tpu/docs/tpu7x; issue #36 item 3).
    with pytest.raises(SpecError) as refused:
        parse_spec(with_(TPU, "accelerator.accelerator_type", accelerator_type))
    assert refused.value.errors == [f"accelerator.accelerator_type: {accelerator_type!r}: TPU7x (Ironwood) and later "
                                    "TPUs are offered only through Google Kubernetes Engine, not the Cloud TPU API "
                                    "Respawn uses; choose v6e, v5p, v5litepod or v4"]
    parse_spec(with_(TPU, "accelerator.accelerator_type", "v6e-8"))


@pytest.mark.parametrize("provisioning, field", [
    ("flex-start", "provisioning"), (["spot", {"model": "flex-start", "max_run_hours": 2}], "tiers")])
def test_a_tpu_job_is_refused_flex_start_because_only_cloud_tpus_v2alpha1_api_asks_for_it(provisioning, field):
    # tpu v2alpha1's QueuedResource has provisioningModel FLEX_START, tpu.v2 (what Respawn drives) has not (gcp-facts
    # §19, issue #36): a v5e job in us-west4-a, a zone Google offers flex-start v5e in, is still refused, in one line.
    with pytest.raises(SpecError) as refused:
        parse_spec({**TPU, "provisioning": provisioning})
    assert refused.value.errors == [f"{field}: flex-start TPUs are not offered: Cloud TPU asks for them only in its "
                                    "v2alpha1 API, not the v2 API Respawn drives; a TPU job takes spot, preemptible "
                                    "or standard"]
    assert [t.model for t in parse_spec({**TPU, "provisioning": ["spot", "standard"]}).provisioning_tiers] == [
        "spot", "standard"]
