"""Specs checked against what exists (issue #35 item 4): the offline catalog refuses every name that does not exist
where the spec puts it, one line naming the field, the value and the fix; `respawn jobs validate` says so offline
(exit 2, no traceback); the sim answers what exists from the same catalog, and `jobs register` asks it and prefers its
answer. Every example job validates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from respawn import catalog, schema
from sim_fixtures import PROJECT, sim_factory, sim_server  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
BASE = {"id": "cat-job", "trainer": {"command": ["python", "train.py"]}, "checkpoint_uri": "gs://ckpt-bucket/cat"}
GPU = {"kind": "gpu", "machine_type": "g2-standard-8"}
TPU = {"kind": "tpu", "accelerator_type": "v5litepod-8", "runtime_version": "v2-alpha-tpuv5-lite"}

# The faults of issue #35: (case, accelerator, zones, what the one line must say).
FAULTS = [
    ("zone that does not exist", GPU, ["us-central1-a", "us-central1-z"],
     "zones[1]: us-central1-z is not a Google Cloud zone; us-central1 has us-central1-a, us-central1-b, us-central1-c, "
     "us-central1-f"),
    ("machine-type typo", {**GPU, "machine_type": "g2-standrd-8"}, ["us-central1-a"],
     "accelerator.machine_type: g2-standrd-8 is not a Compute Engine machine type; did you mean g2-standard-8?"),
    ("GPU that does not exist", {**GPU, "machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-v200"},
     ["us-central1-a"],
     "accelerator.accelerator_type: nvidia-tesla-v200 is not a Compute Engine GPU; did you mean nvidia-tesla-v100?"),
    ("L4 on N1", {**GPU, "machine_type": "n1-standard-8", "accelerator_type": "nvidia-l4"}, ["us-central1-a"],
     "accelerator.accelerator_type: nvidia-l4 does not attach to n1-standard-8 (N1 takes T4, V100, P100 and P4 "
     "only); use a machine type with it built in, such as g2-standard-4, and leave accelerator_type out"),
    ("H100 machine where there are none", {**GPU, "machine_type": "a3-highgpu-8g"}, ["us-central1-a", "us-west2-b"],
     "zones[1]: a3-highgpu-8g is not offered in us-west2; it is in "),
    ("TPU type in a zone without it", TPU, ["us-west4-a", "europe-west2-a"],
     "zones[1]: europe-west2-a has no TPU v5litepod; v5litepod is in "),
]


def _spec(accelerator: dict, zones: list[str]) -> schema.JobSpec:
    return schema.parse_spec({**BASE, "accelerator": accelerator, "zones": zones})


@pytest.mark.parametrize("case,accelerator,zones,said", FAULTS, ids=[f[0] for f in FAULTS])
def test_the_catalog_refuses_a_name_that_does_not_exist_in_one_line(case, accelerator, zones, said):
    [line] = catalog.problems(_spec(accelerator, zones))
    assert line.startswith(said), line


def test_what_exists_passes():
    assert catalog.problems(_spec(GPU, ["us-central1-a", "europe-west4-b"])) == []
    assert catalog.problems(_spec({**GPU, "machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-t4"},
                                  ["us-central1-a", "asia-east1-a"])) == []
    assert catalog.problems(_spec({"kind": "tpu", "accelerator_type": "v4-16", "runtime_version":
                                   "tpu-ubuntu2204-base"}, ["us-central2-b"])) == []
    assert catalog.problems(_spec({**TPU, "runtime_version": "tpu-vm-tf-2.16.0-pjrt"}, ["us-west4-a"])) == []


def test_a4x_max_has_gb300_built_in_and_goes_where_its_machine_goes():
    # Audit 4: the catalog said GB200; us-east5 offers a4x-maxgpu-4g-metal but no GB200, and was refused.
    max_ = {"kind": "gpu", "machine_type": "a4x-maxgpu-4g-metal"}
    assert catalog.load().built_in(max_["machine_type"]) == "nvidia-gb300"
    assert catalog.problems(_spec(max_, ["us-east5-a", "us-central1-a"])) == []
    [line] = catalog.problems(_spec(max_, ["us-east5-a", "europe-west4-a"]))
    assert line.startswith("zones[1]: a4x-maxgpu-4g-metal is not offered in europe-west4"), line


def test_a_tpu_runtime_of_another_generation_or_misspelt_is_named():
    assert catalog.problems(_spec({**TPU, "runtime_version": "tpu-ubuntu2204-base"}, ["us-west4-a"])) == [
        "accelerator.runtime_version: tpu-ubuntu2204-base is the runtime of v2, v3, v4; v5litepod runs "
        "v2-alpha-tpuv5-lite"]
    assert catalog.problems(_spec({**TPU, "runtime_version": "v2-alpha-tpuv5-lit"}, ["us-west4-a"])) == [
        "accelerator.runtime_version: v2-alpha-tpuv5-lit is not a TPU runtime; did you mean v2-alpha-tpuv5-lite?"]


def test_a_gpu_on_a_machine_that_does_not_take_it():
    assert catalog.problems(_spec({**GPU, "accelerator_type": "nvidia-tesla-t4"}, ["us-central1-a"])) == [
        "accelerator.accelerator_type: g2-standard-8 has its nvidia-l4 built in; leave accelerator_type out"]
    assert catalog.problems(_spec({**GPU, "machine_type": "n2-standard-8", "accelerator_type": "nvidia-tesla-t4"},
                                  ["us-central1-a"]))[0].startswith(
        "accelerator.accelerator_type: GPUs attach to N1 machine types only, not n2-standard-8")


def test_a_live_answer_is_preferred_to_the_catalogs():
    spec = _spec({**GPU, "machine_type": "a3-highgpu-8g"}, ["us-west2-b", "us-central1-a"])
    # Compute Engine offers it where the catalog has none (the catalog is older), and not where the catalog says so.
    said = {("machine", "a3-highgpu-8g", "us-west2-b"): True, ("machine", "a3-highgpu-8g", "us-central1-a"): False}
    assert catalog.problems(spec, lambda kind, name, zone: said.get((kind, name, zone))) == [
        "zones[1]: us-central1-a does not offer a3-highgpu-8g (Compute Engine says so): drop it"]
    # An attached GPU is asked about too.
    t4 = _spec({**GPU, "machine_type": "n1-standard-8", "accelerator_type": "nvidia-tesla-t4"}, ["us-central1-a"])
    assert catalog.problems(t4, lambda kind, name, zone: kind != "gpu") == [
        "zones[0]: us-central1-a does not offer nvidia-tesla-t4 (Compute Engine says so): drop it"]
    # No answer (no permission, no network): the catalog decides.
    assert catalog.problems(spec, lambda kind, name, zone: None)[0].startswith(
        "zones[0]: a3-highgpu-8g is not offered in us-west2")


def test_the_catalog_is_dated_and_every_section_sourced():
    data = json.loads(catalog.PATH.read_text())
    assert data["as_of"] >= "2026-11-28"
    for section in ("regions", "machine_types", "accelerator_regions", "families", "tpus"):
        assert data["sources"][section] and all(s.get("date") for s in data["sources"][section]), section
    cat = catalog.load()
    # Every GPU and TPU generation Respawn prices is in it, and every machine type it prices.
    from respawn import prices

    assert set(prices.GPUS) <= set(cat.gpus())
    assert set(prices.TPUS) <= set(data["tpus"])
    assert set(prices.BUNDLED) <= set(data["machine_types"])


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    for case, accelerator, zones, _ in FAULTS:
        (tmp_path / f"{case.replace(' ', '-')}.yaml").write_text(
            yaml.safe_dump({**BASE, "accelerator": accelerator, "zones": zones}))
    return tmp_path


def _respawn(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RESPAWN_")}
    return subprocess.run([sys.executable, "-m", "respawn", *args], capture_output=True, text=True, cwd=cwd,
                          env={**clean, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}, timeout=120)


def test_jobs_validate_refuses_each_fault_offline_naming_the_value(workspace):
    for case, _, _, said in FAULTS:
        r = _respawn("jobs", "validate", f"{case.replace(' ', '-')}.yaml", cwd=workspace)
        err = " ".join(r.stderr.split())
        assert r.returncode == 2, (case, r.stdout, r.stderr)
        assert said in err, (case, err)
        assert "Traceback" not in r.stderr + r.stdout


def test_the_sim_answers_what_exists_from_the_catalog_and_register_prefers_it(sim_server, tmp_path,  # noqa: F811
                                                                                monkeypatch):
    from respawn.app.catalogcheck import live

    monkeypatch.setenv("RESPAWN_COMPUTE_ENDPOINT", sim_server.endpoint)
    monkeypatch.delenv("RESPAWN_TPU_ENDPOINT", raising=False)
    ask, why = live(PROJECT)
    assert why == "" and ask is not None
    assert ask("zone", "us-central1-a", "") is True and ask("zone", "us-central1-z", "") is False
    assert ask("machine", "g2-standard-8", "us-central1-a") is True
    assert ask("machine", "a3-highgpu-8g", "us-west2-b") is False
    assert ask("gpu", "nvidia-l4", "us-central1-a") is True and ask("gpu", "nvidia-l4", "us-west2-b") is False
    assert ask("tpu", "v5litepod-8", "us-west4-a") is True and ask("tpu", "v5litepod-8", "europe-west2-a") is False
    # A 404 about something else (another project) says nothing of the name.
    other, _ = live("another-project")
    assert other("machine", "g2-standard-8", "us-central1-a") is None

    # register --dry-run asks the sim and refuses as validate does, in one line.
    path = tmp_path / "h100.yaml"
    path.write_text(yaml.safe_dump({**BASE, "accelerator": {**GPU, "machine_type": "a3-highgpu-8g"},
                                    "zones": ["us-central1-a", "us-west2-b"]}))
    r = _respawn("jobs", "register", str(path), "--dry-run", "--project", PROJECT, cwd=tmp_path,
                 env={"RESPAWN_COMPUTE_ENDPOINT": sim_server.endpoint})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "zones[1]: us-west2-b does not offer a3-highgpu-8g (Compute Engine says so): drop it" in \
        " ".join(r.stderr.split())
    path.write_text(yaml.safe_dump({**BASE, "accelerator": GPU, "zones": ["us-central1-a"]}))
    r = _respawn("jobs", "register", str(path), "--dry-run", "--project", PROJECT, cwd=tmp_path,
                 env={"RESPAWN_COMPUTE_ENDPOINT": sim_server.endpoint})
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("example", sorted((ROOT / "examples" / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_job_names_only_what_exists(example):
    data = yaml.safe_load(example.read_text())
    data["trainer"].pop("workdir", None)  # a directory, packed by validate (tests/test_cli_workdir.py)
    assert catalog.problems(schema.parse_spec(data)) == []


# The demo's scenarios that build their own job (not a job file, validated above; not invalid on purpose).
OWN_JOB = [p for p in sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))
           if "job_file" not in yaml.safe_load(p.read_text()) and p.stem != "invalid-spec"]


@pytest.mark.parametrize("scenario", OWN_JOB, ids=lambda p: p.name)
def test_every_demo_scenarios_job_names_only_what_exists(scenario, tmp_path):
    from sim.demo.runner import job_spec
    from sim.demo.scenario import parse_scenario

    sc = parse_scenario(yaml.safe_load(scenario.read_text()))
    spec = job_spec(sc, tmp_path, "file:///tmp/workdir/sha256-" + "0" * 64 + ".tar.gz")
    assert catalog.problems(schema.parse_spec(spec)) == []
