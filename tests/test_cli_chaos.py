"""`respawn chaos`: the real gcloud simulates host maintenance on a job's node (gcloud pointed at sim/ with its own
config, an access-token file and an endpoint override; sim/ serves instances.simulateMaintenanceEvent), and the
command follows the controller's recovery until the job trains again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from functions_fixtures import controller, gpu_spec  # noqa: F401
from respawn.app.cli import chaos_command
from sim_fixtures import sim_factory, sim_server  # noqa: F401


@pytest.fixture
def gcloud_env(tmp_path, sim_server, project):
    """gcloud talking to sim/: no credentials of anyone's, no prompt, nothing outside this machine."""
    token = tmp_path / "token"
    token.write_text("sim-token")
    return {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token),
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE":
            sim_server.endpoint + "/compute/v1/", "COLUMNS": "200"}


def test_chaos_interrupts_the_node_and_follows_the_recovery(controller, gcloud_env, project):
    job = controller.register(gpu_spec("chaos", termination_action="DELETE"))
    assert controller.job_created(job) == 200
    st = controller.wait_state(job, "RUNNING")
    controller.heartbeat(st.node)
    proc = subprocess.Popen([sys.executable, "-m", "respawn", "chaos", job, "--yes", "--timeout", "90", "--project",
                             project], env=gcloud_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The Spot VM is preempted (simulated maintenance); the controller hears it as it hears any preemption.
        entry = controller.wait_system_event(st.node, timeout=60)
        assert entry["protoPayload"]["methodName"] == "compute.instances.preempted"
        assert controller.log_event(entry) == 200
        new = controller.wait_state(job, "RUNNING")
        assert new.node != st.node
        controller.heartbeat(new.node, step=12)
        assert controller.sweep(job) == 200
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"interrupting {st.node}: gcloud compute instances simulate-maintenance-event {st.node}" in err
    assert f"job {job} recovered in " in out and "(notice → every rank stepping)" in out  # recovery_time.line


def test_chaos_refuses_what_it_cannot_interrupt(controller, gcloud_env, project):
    job = controller.register(gpu_spec("idle", zones=["us-central1-a"]))
    r = subprocess.run([sys.executable, "-m", "respawn", "chaos", job, "--yes", "--project", project],
                       env=gcloud_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "only a RUNNING job's node can be interrupted" in r.stderr
    assert controller.job_created(job) == 200
    controller.wait_state(job, "RUNNING")
    r = subprocess.run([sys.executable, "-m", "respawn", "chaos", job, "--node", "other-9", "--yes", "--project",
                        project], env=gcloud_env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "other-9 is not one of job idle's current nodes" in r.stderr


def test_the_tpu_command_parses_in_gcloud_offline(tmp_path):
    """gcloud parses a command's arguments before any call: a usage error would exit 2 before reaching the (absent)
    network; this one gets as far as wanting credentials."""
    env = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}
    command = chaos_command("gcloud", "tpu", "jax-3", "us-central2-b", "p-1")
    r = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 2 and "unrecognized arguments" not in r.stderr and "argument" not in r.stderr.lower(), r.stderr
    assert command[1:7] == ["alpha", "compute", "tpus", "tpu-vm", "simulate-maintenance-event", "jax-3"]
