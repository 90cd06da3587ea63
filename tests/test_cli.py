"""The `respawn jobs` CLI, run as a real process against the Firestore emulator: `python -m respawn` itself in the
round trip, elsewhere a process forked from one that has imported the CLI (tests/respawn_forks.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from respawn import schema
from tests import respawn_forks
from sim_fixtures import sim_factory, sim_server  # noqa: F401 - fixtures

SPEC = {
    "id": "cli-job",
    "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"},
    "zones": ["us-central1-a", "us-central1-b"],
    "trainer": {"command": ["python", "train.py"]},
    "checkpoint_uri": "gs://ckpt-bucket/cli-job",
}


respawn = respawn_forks.respawn


def real_respawn(*args: str) -> subprocess.CompletedProcess:
    """`python -m respawn ARGS` itself."""
    return subprocess.run([sys.executable, "-m", "respawn", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=60)


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


def test_register_list_describe_cancel_round_trip(firestore_db, project, spec_file):
    r = real_respawn("jobs", "register", str(spec_file), "--project", project)
    assert r.returncode == 0, r.stderr
    assert "registered cli-job" in r.stdout

    doc = firestore_db.collection(schema.JOBS).document("cli-job").get().to_dict()
    assert doc["spec"]["zones"] == ["us-central1-a", "us-central1-b"]
    assert doc["spec"]["termination_action"] == "STOP"  # the documented default for GPU Spot
    assert doc["status"]["state"] == "PENDING"
    assert doc["cancel_requested"] is False

    r = real_respawn("jobs", "list", "--project", project)
    assert r.returncode == 0, r.stderr
    assert "cli-job" in r.stdout and "PENDING" in r.stdout
    r = real_respawn("jobs", "list", "--json", "--project", project)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(row["id"], row["state"], row["restarts"], row["failures"], row["preemptions"]) for row in rows] == [
        ("cli-job", "PENDING", 0, 0, 0)]

    r = real_respawn("jobs", "describe", "cli-job", "--project", project, "--json")
    assert r.returncode == 0, r.stderr
    described = json.loads(r.stdout)
    assert described["status"]["state"] == "PENDING"
    assert (described["status"]["failures"], described["status"]["preemptions"]) == (0, 0)
    assert described["spec"]["max_failures"] == 3 and "max_restarts" not in described["spec"]
    assert described["spec"]["checkpoint_uri"] == "gs://ckpt-bucket/cli-job"
    assert described["recovery"] == "restart_in_place → next_zone"  # a GPU Spot VM stopped by its preemption

    # The sweep topic does not exist on a bare project: cancel still records the request.
    r = real_respawn("jobs", "cancel", "cli-job", "--project", project)
    assert r.returncode == 0, r.stderr
    assert firestore_db.collection(schema.JOBS).document("cli-job").get().get("cancel_requested") is True

    r = real_respawn("jobs", "events", "cli-job", "--project", project)
    assert r.returncode == 0, r.stderr
    assert "registered" in r.stdout and "cancel requested" in r.stdout


def test_setup_commands_are_stored_in_a_form_firestore_accepts_and_read_back_as_written(firestore_db, project,
                                                                                          tmp_path):
    setup = [["pip", "install", "-r", "requirements.txt"], ["python", "prepare.py"]]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "trainer": {**SPEC["trainer"], "setup": setup}}))
    r = respawn("jobs", "register", str(path), "--project", project)
    assert r.returncode == 0, r.stderr  # Firestore refuses an array directly inside an array
    stored = firestore_db.collection(schema.JOBS).document("cli-job").get().get("spec")
    assert stored["trainer"]["setup"] == [{"argv": argv} for argv in setup]
    assert [list(c) for c in schema.parse_spec(stored).trainer.setup] == setup


def test_register_twice_is_refused_and_keeps_the_first(firestore_db, project, spec_file, tmp_path):
    assert respawn("jobs", "register", str(spec_file), "--project", project).returncode == 0
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({**SPEC, "zones": ["europe-west4-a"]}))
    r = respawn("jobs", "register", str(changed), "--project", project)
    assert r.returncode == 1
    assert "already exists" in r.stderr
    assert "Traceback" not in r.stderr
    doc = firestore_db.collection(schema.JOBS).document("cli-job").get().to_dict()
    assert doc["spec"]["zones"] == ["us-central1-a", "us-central1-b"]


def test_invalid_spec_is_not_written_and_names_the_field(firestore_db, project, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**SPEC, "zones": ["us-central1-a", "us-central1-a"], "max_restart": 3}))
    r = respawn("jobs", "register", str(bad), "--project", project)
    assert r.returncode == 2
    assert "zones: zone 'us-central1-a' at position 1 repeats position 0" in r.stderr
    assert "max_restart: unknown field" in r.stderr
    assert "Traceback" not in r.stderr
    assert list(firestore_db.collection(schema.JOBS).stream()) == []


def test_unknown_job_and_terminal_cancel(firestore_db, project, spec_file):
    r = respawn("jobs", "describe", "nope", "--project", project)
    assert r.returncode == 1 and "no job 'nope'" in r.stderr
    r = respawn("jobs", "cancel", "nope", "--project", project)
    assert r.returncode == 1 and "no job 'nope'" in r.stderr

    assert respawn("jobs", "register", str(spec_file), "--project", project).returncode == 0
    firestore_db.collection(schema.JOBS).document("cli-job").update({"status.state": "SUCCEEDED"})
    r = respawn("jobs", "cancel", "cli-job", "--project", project)
    assert r.returncode == 1 and "already SUCCEEDED" in r.stderr


@pytest.mark.parametrize(
    "content, message",
    [
        ("id: [unclosed", "neither valid YAML nor JSON"),
        ("- just\n- a list\n", "expected a mapping of fields, got list"),
    ],
)
def test_unreadable_files_get_clear_errors(tmp_path, content, message):
    path = tmp_path / "job.yaml"
    path.write_text(content)
    r = respawn("jobs", "validate", str(path))
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    r = respawn("jobs", "validate", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "cannot read" in r.stderr



def test_register_refuses_a_boot_image_compute_engine_does_not_have(firestore_db, project, sim_server, tmp_path):
    # The sim answers images.getFromFamily as Compute Engine does (gcp-facts §12): a retired family is 404.
    endpoint = {"RESPAWN_COMPUTE_ENDPOINT": sim_server.endpoint}
    retired = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "accelerator": {**SPEC["accelerator"], "boot_image": retired}}))
    r = respawn("jobs", "register", str(path), "--project", project, env=endpoint)
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr
    assert f"cli-job: accelerator.boot_image: {retired} cannot boot a VM" in said
    assert "gcloud compute images list --project=deeplearning-platform-release" in said
    assert not firestore_db.collection(schema.JOBS).document("cli-job").get().exists

    default = tmp_path / "default.yaml"
    default.write_text(yaml.safe_dump(SPEC))
    r = respawn("jobs", "register", str(default), "--project", project, env=endpoint)
    assert r.returncode == 0, r.stderr
    assert "boot image: projects/deeplearning-platform-release/global/images/family/common-cu129-ubuntu-2404-nvidia-580 " \
           "→ common-cu129-ubuntu-2404-nvidia-580-v" in " ".join(r.stdout.split())

    # A look that cannot be made blocks nothing: the controller looks again when it first handles the job.
    sim_server.set_api_faults(count=1, status=503, methods=("image",))
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**SPEC, "id": "cli-job-2"}))
    r = respawn("jobs", "register", str(other), "--project", project, env=endpoint)
    assert r.returncode == 0, r.stderr
    assert "not checked (HTTP 503" in " ".join(r.stderr.split()) and "registered cli-job-2" in r.stdout


def test_register_warns_when_a_multi_host_jobs_members_cannot_reach_each_other(firestore_db, project, sim_server,
                                                                              tmp_path):
    from respawn import deployment

    endpoint = {"RESPAWN_COMPUTE_ENDPOINT": sim_server.endpoint}

    def register(job_id: str, **fields) -> str:
        path = tmp_path / f"{job_id}.yaml"
        path.write_text(yaml.safe_dump({**SPEC, "id": job_id, **fields}))
        r = respawn("jobs", "register", str(path), "--project", project, env=endpoint)
        assert r.returncode == 0 and f"registered {job_id}" in r.stdout, r.stderr  # a warning refuses nothing
        return " ".join(r.stderr.split())

    rule = deployment.node_firewall_rule(1)
    said = register("two-vms", nodes=2, zones=["us-central1-a"])
    assert f"warning: two-vms runs on 2 hosts; firewall rule {rule} not found" in said
    node = deployment.service_account_email(deployment.node_identity(1), project)
    assert f"--source-service-accounts={node} --target-service-accounts={node}" in said
    assert "warning" not in register("one-vm")  # one host: nothing to reach
    sim_server.compute.global_resources.add_firewall(project, rule, service_account=node, disabled=True)
    slice_spec = {"accelerator": {"kind": "tpu", "accelerator_type": "v4-16", "runtime_version": "tpu-ubuntu2204-base"},
                  "zones": ["us-central2-b"]}
    assert f"{rule} in project {project} is disabled" in register("slice", **slice_spec)
    sim_server.compute.global_resources.add_firewall(project, rule, service_account=node)
    assert "warning" not in register("two-vms-again", nodes=2, zones=["us-central1-a"])


def test_validate_warns_that_max_restarts_is_max_failures_old_name(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({**SPEC, "max_restarts": 20}))
    r = respawn("jobs", "validate", str(path))
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stderr and "max_restarts is the old name of max_failures" in r.stderr
    path.write_text(yaml.safe_dump({**SPEC, "max_failures": 5}))
    r = respawn("jobs", "validate", str(path))
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_register_refuses_a_job_no_listed_region_has_quota_for_and_warns_of_a_preemptible_zero(
        firestore_db, project, sim_server, tmp_path):
    # regions.get as the sim serves it from its quota settings (gcp-facts §21); SPEC: g2-standard-8 (L4), Spot.
    endpoint = {"RESPAWN_COMPUTE_ENDPOINT": sim_server.endpoint}

    def register(job_id: str, **fields) -> subprocess.CompletedProcess:
        path = tmp_path / f"{job_id}.yaml"
        path.write_text(yaml.safe_dump({**SPEC, "id": job_id, **fields}))
        return respawn("jobs", "register", str(path), "--project", project, env=endpoint)

    sim_server.set_quota("us-central1", "g2-standard-8", 0, provisioning_model="SPOT")
    r = register("spot-zero")  # the preemptible limit alone: a warning, registered
    said = " ".join(r.stderr.split())
    assert r.returncode == 0 and "registered spot-zero" in r.stdout, r.stderr
    assert "warning: spot-zero quota: us-central1: PREEMPTIBLE_NVIDIA_L4_GPUS limit is 0; spot VMs may still be " \
           "charged to NVIDIA_L4_GPUS" in said
    sim_server.set_quota("us-central1", "g2-standard-8", 0, provisioning_model="STANDARD")
    r = register("no-quota", provisioning=["spot", "standard"])
    said = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr
    assert "no-quota: no quota for its GPUs in any listed zone's region" in said
    assert f"gcloud beta quotas preferences create --service=compute.googleapis.com --project={project}" in said
    assert not firestore_db.collection(schema.JOBS).document("no-quota").get().exists
    # Another region with quota: registered, the zero warned of.
    r = register("elsewhere", provisioning="standard", zones=["us-central1-a", "europe-west4-a"])
    assert r.returncode == 0 and "us-central1: NVIDIA_L4_GPUS limit is 0" in " ".join(r.stderr.split()), r.stderr
    # No permission to look: one line, nothing refused.
    sim_server.set_api_faults(count=5, status=403, methods=("region",))
    r = register("unlooked", provisioning="standard")
    lines = [x for x in r.stderr.splitlines() if "quota" in x]
    assert r.returncode == 0 and len(lines) == 1 and "quotas not checked (HTTP 403" in lines[0], r.stderr


def test_zones_shows_quota_advice_history_and_what_respawn_saw(firestore_db, project, sim_server):
    sim = sim_server
    sim.set_quota("us-central1", "g2-standard-8", 4, provisioning_model="SPOT")
    sim.set_advice("us-central1-a", "g2-standard-8", obtainability=0.85, estimated_uptime=3600,
                   preemption_rates=[0.07] * 7, prices=[0.21])
    sim.set_capacity("us-central1-b", "g2-standard-8", 0, provisioning_model="SPOT")
    firestore_db.collection(schema.CAPACITY).document("us-central1-b~g2-standard-8").set(
        {"zone": "us-central1-b", "stats": {"spot": {"refusals": 2, "nodes": 3, "obtain_seconds": 270, "lives": 2,
                                                     "life_seconds": 7200, "preemptions": 1}}})
    env = {"RESPAWN_COMPUTE_ENDPOINT": sim.endpoint}
    r = respawn("zones", "--accelerator", "nvidia-l4", "--machine-type", "g2-standard-8", "--region", "us-central1",
                "--project", project, env=env)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[1]: " ".join(line.split()) for line in r.stdout.splitlines() if line.startswith("│ us-")}
    saw = {line.split()[3].rstrip(":"): line for line in r.stdout.splitlines() if line.startswith("Respawn saw in")}
    assert set(rows) == {"us-central1-a", "us-central1-b"}  # the zones the sim knows in the region
    assert "0/4" in rows["us-central1-a"] and "0.85" in rows["us-central1-a"] and "1.0 h" in rows["us-central1-a"]
    assert "7%" in rows["us-central1-a"] and "0.210 USD/h" in rows["us-central1-a"]
    assert saw["us-central1-a"].endswith("nothing yet")
    assert "0.00" in rows["us-central1-b"]  # Spot stocked out there
    assert saw["us-central1-b"].endswith("spot: 2 refused, 3 obtained (mean 2 min), 1 preempted, MTBI 2.0 h")
    # Advice refused: its columns stay empty, one note says why; the rest is shown.
    sim.set_api_faults(count=1, status=403, methods=("advice",))
    r = respawn("zones", "--accelerator", "nvidia-l4", "--machine-type", "g2-standard-8", "--zones", "us-central1-a",
                "--project", project, env=env)
    assert r.returncode == 0 and "0/4" in r.stdout, r.stderr
    assert [x for x in r.stderr.splitlines() if "not read" in x] == [
        next(x for x in r.stderr.splitlines() if "capacity advice: HTTP 403" in x)]
    r = respawn("zones", "--accelerator", "nvidia-tesla-t4", "--machine-type", "g2-standard-8", "--zones",
                "us-central1-a", "--project", project, env=env)
    assert r.returncode == 2 and "g2-standard-8 carries nvidia-l4, not nvidia-tesla-t4" in r.stderr


def test_plan_takes_the_mean_time_between_preemptions_from_what_respawn_saw(firestore_db, project):
    for zone, life, preempted in (("us-central1-a", 3 * 3600, 1), ("us-central1-b", 5 * 3600, 1)):
        firestore_db.collection(schema.CAPACITY).document(f"{zone}~g2-standard-8").set(
            {"zone": zone, "accelerator_type": "g2-standard-8",
             "stats": {"spot": {"lives": 2, "life_seconds": life, "preemptions": preempted},
                       "standard": {"lives": 1, "life_seconds": 99 * 3600}}})  # on-demand lives are no Spot figure
    r = respawn("plan", "--from-stats", "g2-standard-8", "--runs", "20", "--json", "--project", project)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["inputs"]["mtbp_hours"] == 4.0
    assert "mtbp_hours 4.00: 2 preemptions in 4 Spot node lives of g2-standard-8" in " ".join(r.stderr.split())
    r = respawn("plan", "--from-stats", "nvidia-tesla-t4", "--project", project)
    assert r.returncode == 2 and "no preemption of a Spot nvidia-tesla-t4 yet" in r.stderr
