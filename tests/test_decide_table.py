"""functions/decide.py: the pure decision core, table-driven. No fakes: an Observation in, a Decision out.

Two layers: an explicit table of the rows that carry the policy (state × node phase × heartbeat → action, new state,
alert), and an exhaustive sweep over every state × phase × heartbeat × cancel × hint that checks the invariants
that make recovery safe (never create while a node exists, never act on a finished job except to delete, …).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import get_args

import pytest

from respawn.control import alerts, job, placement
from respawn.control import decide as core
from respawn.control.actions import Act, Action
from respawn.control.losses import loss_kind
from respawn.control.observation import (
    NOTICE, Hint, NodeObs, Observation, Phase, Settings, needs_capacity, needs_console, phase_of,
)
from respawn.control.outcomes import (
    Outcome, OutcomeKind, after_act, after_create_failed, after_create_refused, after_created, after_start_refused,
    followup,
)
from respawn.schema import Heartbeat, JobCounters, JobStatus, MemberStatus, NodeState, SlotStatus, State, node_name, parse_spec

NOW = datetime(2025, 1, 1, 12, 0, tzinfo=timezone.utc)
ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]
SETTINGS = Settings(stale_heartbeat_seconds=60, boot_grace_seconds=600, backoff_base_seconds=30, max_in_place_restarts=1)


def make_spec(**over):
    base = {"id": "job", "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"}, "zones": ZONES,
            "trainer": {"command": ["python", "t.py"]}, "checkpoint_uri": "gs://bucket/job", "max_restarts": 5}
    base.update(over)
    return parse_spec(base)


GPU_STOP = make_spec()  # spot, termination_action STOP (the default)
GPU_DELETE = make_spec(termination_action="DELETE")
TPU = make_spec(accelerator={"kind": "tpu", "accelerator_type": "v4-8", "runtime_version": "tpu-ubuntu2204-base"})
# A TPU slice through a queued resource (the default for a multi-host slice: v4-16 has 2 hosts), a 10 min wait.
TPU_QUEUED = make_spec(accelerator={"kind": "tpu", "accelerator_type": "v4-16", "runtime_version": "tpu-ubuntu2204-base",
                                    "queue_wait_minutes": 10})


def hb(state="training", age=5, attempt=3, **kw):
    return Heartbeat(job_id="job", attempt=attempt, state=NodeState(state), heartbeat_at=NOW - timedelta(seconds=age), **kw)


HEARTBEATS = {
    "none": None,
    # A trainer started a minute ago that resumed from step 100 and stepped (its first step, as its agent saw it, 30 s
    # ago); the same restored, before its first step.
    "fresh": hb(step=120, committed_step=100, started_at=NOW - timedelta(seconds=60), first_step=101,
                first_step_at=NOW - timedelta(seconds=30)),
    "restored": hb(step=100, committed_step=100, started_at=NOW - timedelta(seconds=60)),
    "stale": hb(age=600, step=120, committed_step=100),
    "exit0": hb("exited", exit_code=0, step=500, committed_step=500),
    "crash": hb("exited", exit_code=1, step=130, committed_step=100, output_tail="Traceback: boom"),
    "noticed": hb("preempting", notice="preempted", step=131, committed_step=131),
    "old_attempt": hb(attempt=2, step=9),
    "setup_failed": hb("setup-failed", exit_code=1, failed_command=["pip", "install", "-r", "requirements.txt"],
                       output_tail="ERROR: No matching distribution found for torch==9"),
    "preparing": hb("preparing"),
    "fetch_failed": hb("setup-failed", failed_command=["respawn-agent", "fetch-workdir", "gs://b/w.tar.gz"],
                       output_tail="403 Forbidden: the node's service account cannot read gs://b/w.tar.gz"),
}


def status(state, **kw):
    base = dict(state=State(state), attempt=3, node="job-3", zone="us-central1-a", provisioning="spot",
                create_state="created", node_started_at=NOW - timedelta(seconds=3600), restarts=1, revision=7,
                last_committed_step=90, last_step=95)
    if state == "PENDING":
        base = dict(state=State.PENDING)
    base.update(kw)
    return SlotStatus(**base)


def obs(state, raw="RUNNING", heartbeat="fresh", spec=GPU_STOP, cancel=False, hint=None, blocked=None, **st):
    kind = spec.accelerator.kind if spec is not None else "gpu"
    return Observation(
        job_id="job", spec=spec, spec_errors=() if spec is not None else ("zones: must not be empty",),
        status=status(state, **st), cancel_requested=cancel, node=NodeObs(phase_of(kind, raw), raw),
        heartbeat=HEARTBEATS[heartbeat], now=NOW, hint=hint, blocked=blocked or {}, settings=SETTINGS,
    )


def decide(o, whole=None):
    """The decision production makes of the row: a live job's slot by decide.decide; a job that ended, is cancelled
    or has an invalid spec by functions/job.py, for the whole job (here of one node: `whole`, built from the row's
    status when not given)."""
    if o.spec is None or o.status.state.terminal or o.cancel_requested:
        return job.decide(*_job_of(o, 1, whole))
    return core.decide(o)


def decide_job(o):
    """The row decided as production decides it, for the whole job (here of one node; the job's progress is
    functions/job.py's to write), read back as its one slot."""
    d = job.decide(*_job_of(o, 1))
    return replace(d, status=job.project(d.status, 0)) if d.status is not None else d


def new_state(d, o):
    return (d.status.state if d.status else o.status.state).value


def alert_type(d):
    return d.alert["type"] if d.alert else None


BLOCK_ALL = {z: NOW + timedelta(seconds=300) for z in ZONES}
# At most 2 preemptions an hour (the rows give two in the last hour; the loss observed is the third).
RATE_ALERT = {"max": 2, "window_hours": 1}
RATE_BACKOFF = {**RATE_ALERT, "action": "backoff"}
RATE_FAIL = {**RATE_ALERT, "action": "fail"}

# id, observation, expected action, expected state afterwards, expected alert
ROWS = [
    # A new job: first attempt in the first zone.
    ("pending creates attempt 1", obs("PENDING", raw=None, heartbeat="none"), Act.CREATE, "PROVISIONING", None),
    ("pending skips a zone in cooldown", obs("PENDING", raw=None, heartbeat="none", blocked={ZONES[0]: NOW + timedelta(60)}),
     Act.CREATE, "PROVISIONING", None),
    ("pending, every zone in cooldown: wait", obs("PENDING", raw=None, heartbeat="none", blocked=BLOCK_ALL),
     Act.WAIT, "WAITING_FOR_CAPACITY", "waiting_for_capacity"),
    ("invalid spec", obs("PENDING", raw=None, heartbeat="none", spec=None), Act.NONE, "INVALID", "invalid_spec"),
    # Provisioning.
    ("provisioning, create unconfirmed, node absent: re-issue the same create",
     obs("PROVISIONING", raw=None, heartbeat="none", create_state="pending"), Act.CREATE, "PROVISIONING", None),
    ("provisioning, zone refused: next attempt",
     obs("PROVISIONING", raw=None, heartbeat="none", create_state="failed", tried_zones=[ZONES[0]]), Act.CREATE, "PROVISIONING", None),
    ("provisioning, every zone refused: wait",
     obs("PROVISIONING", raw=None, heartbeat="none", create_state="failed", tried_zones=ZONES), Act.WAIT, "WAITING_FOR_CAPACITY",
     "waiting_for_capacity"),
    ("provisioning, node booting: poll", obs("PROVISIONING", raw="STAGING", heartbeat="none"), Act.POLL, "PROVISIONING", None),
    ("provisioning, node running: RUNNING", obs("PROVISIONING", raw="RUNNING", heartbeat="none"), Act.NONE, "RUNNING", None),
    ("provisioning after a loss, node running: RUNNING, not yet recovered (its agent has not reported)",
     obs("PROVISIONING", raw="RUNNING", heartbeat="none", recovering=True, preempted_zone=ZONES[0], zone=ZONES[1],
         preempted_at=NOW - timedelta(seconds=90), steps_lost=7), Act.NONE, "RUNNING", None),
    ("running after a loss, the replacement's agent preparing (setup may still fail): not yet recovered",
     obs("RUNNING", heartbeat="preparing", recovering=True, preempted_zone=ZONES[0], zone=ZONES[1],
         preempted_at=NOW - timedelta(seconds=90), steps_lost=7), Act.NONE, "RUNNING", None),
    ("running after a loss, the replacement trains: recovered alert",
     obs("RUNNING", recovering=True, preempted_zone=ZONES[0], zone=ZONES[1], preempted_at=NOW - timedelta(seconds=90),
         steps_lost=7), Act.NONE, "RUNNING", "recovered"),
    ("running after a loss, the replacement restored but has not stepped: not yet recovered",
     obs("RUNNING", heartbeat="restored", recovering=True, preempted_zone=ZONES[0], zone=ZONES[1],
         preempted_at=NOW - timedelta(seconds=90)), Act.NONE, "RUNNING", None),
    ("running after a loss, no heartbeat yet: no alert",
     obs("RUNNING", heartbeat="none", recovering=True, node_started_at=NOW - timedelta(seconds=60)), Act.NONE,
     "RUNNING", None),
    ("provisioning, created node vanished: replace", obs("PROVISIONING", raw=None, heartbeat="none"), Act.CREATE,
     "PROVISIONING", None),
    ("provisioning, node preempted while booting (DELETE action): delete first",
     obs("PROVISIONING", raw="TERMINATED", heartbeat="none", spec=GPU_DELETE), Act.DELETE, "PREEMPTED", None),
    # Running and healthy.
    ("running healthy records progress", obs("RUNNING"), Act.NONE, "RUNNING", None),
    ("running, heartbeat from an older attempt ignored: no heartbeat yet",
     obs("RUNNING", heartbeat="old_attempt", node_started_at=NOW - timedelta(seconds=60)), Act.NONE, "RUNNING", None),
    ("running, only an older attempt's heartbeat past boot grace: a boot failure, replace",
     obs("RUNNING", heartbeat="old_attempt"), Act.DELETE, "RESTARTING", "boot_failed"),
    ("running, no heartbeat within boot grace", obs("RUNNING", heartbeat="none", node_started_at=NOW - timedelta(seconds=60)),
     Act.NONE, "RUNNING", None),
    # Running, node lost.
    ("running, GCE spot STOP preempted: restart in place", obs("RUNNING", raw="TERMINATED", hint="preempted"),
     Act.START, "PROVISIONING", None),
    ("running, STOP preempted, zone in cooldown: delete", obs("RUNNING", raw="TERMINATED", blocked={ZONES[0]: NOW + timedelta(60)}),
     Act.DELETE, "PREEMPTED", None),
    ("running, STOP preempted, in-place restarts used up: delete", obs("RUNNING", raw="TERMINATED", in_place_restarts=1),
     Act.DELETE, "PREEMPTED", None),
    ("provisioning, restart in place recorded, node still TERMINATED: start again, no new loss",
     obs("PROVISIONING", raw="TERMINATED", create_state="starting", in_place_restarts=1), Act.START, "PROVISIONING", None),
    ("provisioning, restart in place confirmed, node TERMINATED again: a new loss",
     obs("PROVISIONING", raw="TERMINATED", create_state="created", in_place_restarts=1), Act.DELETE, "PREEMPTED", None),
    ("running, STOPPING, in-place candidate: wait for TERMINATED", obs("RUNNING", raw="STOPPING"), Act.POLL, "RUNNING", None),
    ("running, STOPPING, DELETE action: delete now", obs("RUNNING", raw="STOPPING", spec=GPU_DELETE), Act.DELETE, "PREEMPTED", None),
    # The statuses that compute_v1.Instance.Status adds to the documented nine.
    ("running, PENDING_STOP, in-place candidate: wait for TERMINATED", obs("RUNNING", raw="PENDING_STOP"), Act.POLL,
     "RUNNING", None),
    ("running, PENDING_STOP, DELETE action: delete now", obs("RUNNING", raw="PENDING_STOP", spec=GPU_DELETE), Act.DELETE,
     "PREEMPTED", None),
    ("running, DEPROVISIONING, in-place candidate: wait for TERMINATED", obs("RUNNING", raw="DEPROVISIONING"), Act.POLL,
     "RUNNING", None),
    ("running, DEPROVISIONING, DELETE action: delete now", obs("RUNNING", raw="DEPROVISIONING", spec=GPU_DELETE),
     Act.DELETE, "PREEMPTED", None),
    ("running, DEPROVISIONING, zone in cooldown: delete now",
     obs("RUNNING", raw="DEPROVISIONING", blocked={ZONES[0]: NOW + timedelta(60)}), Act.DELETE, "PREEMPTED", None),
    ("provisioning, DEPROVISIONING while booting (DELETE action): delete first",
     obs("PROVISIONING", raw="DEPROVISIONING", heartbeat="none", spec=GPU_DELETE), Act.DELETE, "PREEMPTED", None),
    ("provisioning, PENDING (Flex Start waits for capacity): poll", obs("PROVISIONING", raw="PENDING", heartbeat="none"),
     Act.POLL, "PROVISIONING", None),
    ("running, spot DELETE action, node gone: replace", obs("RUNNING", raw=None, spec=GPU_DELETE, hint="preempted"),
     Act.CREATE, "PROVISIONING", None),
    ("running, TPU PREEMPTED: delete (it holds quota)", obs("RUNNING", raw="PREEMPTED", spec=TPU), Act.DELETE, "PREEMPTED", None),
    ("running, TPU TERMINATED: delete", obs("RUNNING", raw="TERMINATED", spec=TPU), Act.DELETE, "PREEMPTED", None),
    ("running, TPU DELETING: poll", obs("RUNNING", raw="DELETING", spec=TPU), Act.POLL, "RUNNING", None),
    ("running, API RUNNING but audit hint: poll for the transition", obs("RUNNING", hint="preempted"), Act.POLL, "RUNNING", None),
    # A failure of the job's own is RESTARTING, never PREEMPTED: the platform took nothing (issue 46).
    ("running, stale heartbeat: replace the node", obs("RUNNING", heartbeat="stale"), Act.DELETE, "RESTARTING", None),
    ("running, no heartbeat past boot grace: a boot failure, replace", obs("RUNNING", heartbeat="none"), Act.DELETE,
     "RESTARTING", "boot_failed"),
    ("running, no heartbeat past boot grace, the boot before failed too: failed",
     obs("RUNNING", heartbeat="none", boot_failures=1), Act.DELETE, "FAILED", "failed"),
    ("running, no heartbeat past boot grace after a recovered boot: a first boot failure",
     obs("RUNNING", heartbeat="none", boot_failures=0, failures=1), Act.DELETE, "RESTARTING", "boot_failed"),
    ("running, trainer crashed: restart with an alert", obs("RUNNING", heartbeat="crash"), Act.DELETE, "RESTARTING", "crashed"),
    ("running, setup failed: failed, delete, no restart", obs("RUNNING", heartbeat="setup_failed"), Act.DELETE, "FAILED",
     "failed"),
    ("provisioning, setup failed on the node's first boot: failed, delete",
     obs("PROVISIONING", raw="RUNNING", heartbeat="setup_failed"), Act.DELETE, "FAILED", "failed"),
    ("running, preparing (workdir, setup): a live node", obs("RUNNING", heartbeat="preparing"), Act.NONE, "RUNNING", None),
    ("running, exit after a notice is no crash", obs("RUNNING", heartbeat="noticed"), Act.NONE, "RUNNING", None),
    ("running, trainer exited 0: succeeded, delete", obs("RUNNING", heartbeat="exit0"), Act.DELETE, "SUCCEEDED", "succeeded"),
    ("running, exited 0 and node already stopped", obs("RUNNING", raw="TERMINATED", heartbeat="exit0"), Act.DELETE, "SUCCEEDED",
     "succeeded"),
    ("running, a crash past max_failures: failed, delete", obs("RUNNING", heartbeat="crash", failures=5), Act.DELETE,
     "FAILED", "failed"),
    ("running, stale heartbeat past max_failures: failed", obs("RUNNING", heartbeat="stale", failures=5), Act.DELETE,
     "FAILED", "failed"),
    ("running, preempted after max_failures failures and 500 restarts: preemptions never count",
     obs("RUNNING", raw="TERMINATED", hint="preempted", failures=5, restarts=500, preemptions=495), Act.START,
     "PROVISIONING", None),
    ("running, preempted past max_preemptions: failed", obs("RUNNING", raw="TERMINATED", hint="preempted",
                                                            spec=make_spec(max_preemptions=2), preemptions=2),
     Act.DELETE, "FAILED", "failed"),
    ("running, preempted at max_preemptions: recovered", obs("RUNNING", raw="TERMINATED", hint="preempted",
                                                             spec=make_spec(max_preemptions=2), preemptions=1),
     Act.START, "PROVISIONING", None),
    ("running, preemption rate exceeded, action alert: recover at once, alert",
     obs("RUNNING", raw=None, hint="preempted", spec=make_spec(termination_action="DELETE", preemption_rate=RATE_ALERT),
         preempted_times=[NOW - timedelta(minutes=m) for m in (50, 20)]), Act.CREATE, "PROVISIONING", "preemption_rate"),
    ("running, preemption rate exceeded, alerted within the window: no second alert",
     obs("RUNNING", raw=None, hint="preempted", spec=make_spec(termination_action="DELETE", preemption_rate=RATE_ALERT),
         preempted_times=[NOW - timedelta(minutes=m) for m in (50, 20)], rate_exceeded_at=NOW - timedelta(minutes=20)),
     Act.CREATE, "PROVISIONING", None),
    ("running, preemptions older than the window: within the rate",
     obs("RUNNING", raw=None, hint="preempted", spec=make_spec(termination_action="DELETE", preemption_rate=RATE_ALERT),
         preempted_times=[NOW - timedelta(minutes=m) for m in (150, 70)]), Act.CREATE, "PROVISIONING", None),
    ("running, preemption rate exceeded, action backoff, node gone: wait",
     obs("RUNNING", raw=None, hint="preempted", spec=make_spec(termination_action="DELETE", preemption_rate=RATE_BACKOFF),
         preempted_times=[NOW - timedelta(minutes=m) for m in (50, 20)]), Act.WAIT, "PREEMPTED", "preemption_rate"),
    ("running, preemption rate exceeded, action backoff, STOP: no restart in place, delete then wait",
     obs("RUNNING", raw="TERMINATED", hint="preempted", spec=make_spec(preemption_rate=RATE_BACKOFF),
         preempted_times=[NOW - timedelta(minutes=m) for m in (50, 20)]), Act.DELETE, "PREEMPTED", "preemption_rate"),
    ("running, preemption rate exceeded, action fail: failed",
     obs("RUNNING", raw="TERMINATED", hint="preempted", spec=make_spec(preemption_rate=RATE_FAIL),
         preempted_times=[NOW - timedelta(minutes=m) for m in (50, 20)]), Act.DELETE, "FAILED", "failed"),
    ("running, cancel requested: cancelled, delete", obs("RUNNING", cancel=True), Act.DELETE, "CANCELLED", None),
    # Preempted: the dead node goes before the replacement counts.
    ("preempted, dead node still there: delete", obs("PREEMPTED", raw="TERMINATED", spec=GPU_DELETE), Act.DELETE, "PREEMPTED", None),
    ("preempted, deleting: poll", obs("PREEMPTED", raw="DELETING", spec=TPU), Act.POLL, "PREEMPTED", None),
    ("preempted, node gone: create the next attempt", obs("PREEMPTED", raw=None, preempted_zone=ZONES[0]), Act.CREATE,
     "PROVISIONING", None),
    ("restarting after a failure, failed node still there: delete", obs("RESTARTING", raw="RUNNING"), Act.DELETE,
     "RESTARTING", None),
    ("restarting after a failure, node gone, backoff not over: wait",
     obs("RESTARTING", raw=None, next_attempt_at=NOW + timedelta(seconds=30)), Act.WAIT, "RESTARTING", None),
    ("restarting after a failure, node gone, backoff over: create",
     obs("RESTARTING", raw=None, next_attempt_at=NOW - timedelta(seconds=1)), Act.CREATE, "PROVISIONING", None),
    # Waiting for capacity.
    ("waiting, before next try: wait", obs("WAITING_FOR_CAPACITY", raw=None, next_attempt_at=NOW + timedelta(seconds=30)),
     Act.WAIT, "WAITING_FOR_CAPACITY", None),
    ("waiting, time is up: create", obs("WAITING_FOR_CAPACITY", raw=None, next_attempt_at=NOW - timedelta(seconds=1)),
     Act.CREATE, "PROVISIONING", None),
    ("waiting, still no zone: wait longer, no second alert",
     obs("WAITING_FOR_CAPACITY", raw=None, blocked=BLOCK_ALL, next_attempt_at=NOW - timedelta(seconds=1)),
     Act.WAIT, "WAITING_FOR_CAPACITY", None),
    # Finished jobs keep nothing billing.
    ("succeeded, node left over: delete", obs("SUCCEEDED"), Act.DELETE, "SUCCEEDED", None),
    ("cancelled, node gone: nothing", obs("CANCELLED", raw=None), Act.NONE, "CANCELLED", None),
    ("failed, node deleting: poll", obs("FAILED", raw="DELETING", spec=TPU), Act.POLL, "FAILED", None),
    ("invalid, nothing", obs("INVALID", raw=None, spec=None), Act.NONE, "INVALID", None),
]


@pytest.mark.parametrize("name,o,action,state,alert", ROWS, ids=[r[0] for r in ROWS])
def test_policy_table(name, o, action, state, alert):
    d = decide(o)
    assert (d.action.kind, new_state(d, o), alert_type(d)) == (action, state, alert)


def test_a_failed_setup_names_the_command_in_status_event_and_alert():
    d = decide(obs("RUNNING", heartbeat="setup_failed"))
    assert d.cause == "setup_failed" and d.status.restarts == 1  # not counted as a restart
    assert (d.status.failures, d.alert["failures"]) == (1, 1)  # but a failure, in the record and the alert alike
    error = "ERROR: No matching distribution found for torch==9"
    assert (d.status.last_error, d.details["last_error"], d.alert["last_error"]) == (error, error, error)
    assert "pip install -r requirements.txt" in d.status.message and "exit code 1" in d.status.message
    assert d.details["failed_command"] == ["pip", "install", "-r", "requirements.txt"]
    assert "No matching distribution" in d.details["output_tail"]
    assert d.alert["cause"] == "setup_failed" and "No matching distribution" in d.alert["output_tail"]
    slack = alerts.to_slack(d.alert)
    assert "command: pip install -r requirements.txt" in slack["text"]
    assert "No matching distribution" in slack["blocks"][-2]["text"]["text"]  # the output tail, as for a crash


def test_a_failed_agent_step_is_named_without_an_exit_code_it_does_not_have():
    d = decide(obs("RUNNING", heartbeat="fetch_failed"))
    assert d.status.state is State.FAILED and "exit code" not in d.status.message
    assert d.status.message.endswith("respawn-agent fetch-workdir gs://b/w.tar.gz "
                                     "(403 Forbidden: the node's service account cannot read gs://b/w.tar.gz)")


def test_create_commits_the_next_attempt_and_its_node_name():
    d = decide(obs("PREEMPTED", raw=None, preempted_zone=ZONES[0], attempt=3))
    assert d.action.attempt == 4 and d.action.node == node_name("job", 4) == d.status.node
    assert d.action.zone == ZONES[1]  # the zone that just preempted the job goes last
    assert d.status.create_state == "pending" and d.status.revision == 8


def test_a_loss_counts_a_restart_and_the_steps_it_cost():
    d = decide(obs("RUNNING", raw="TERMINATED", spec=GPU_DELETE, heartbeat="fresh", hint="preempted"))
    assert d.status.restarts == 2 and d.status.steps_lost == 20 and d.status.preempted_zone == ZONES[0]
    assert d.cause == "preempted" and d.status.recovering


def test_restart_in_place_keeps_the_node_name_and_counts_a_restart():
    d = decide(obs("RUNNING", raw="TERMINATED", hint="preempted"))
    assert d.action.node == "job-3" and d.status.attempt == 3 and d.status.restarts == 2 and d.status.in_place_restarts == 1
    assert d.status.node_started_at == NOW  # heartbeats of the node's previous life no longer count
    # A second delivery that observes the node before the start took effect starts it again and counts nothing.
    again = decide(replace(obs("PROVISIONING", raw="TERMINATED"), status=d.status, hint="preempted"))
    assert again.action.kind is Act.START and again.status is None
    confirmed = after_created(d.status, 3, "job-3", NOW)
    assert confirmed.create_state == "created" and confirmed.restarts == d.status.restarts


def test_on_demand_fallback_after_failures():
    sp = make_spec(placement={"on_demand_fallback": True, "fallback_after_failures": 2})
    d = decide(obs("PROVISIONING", raw=None, heartbeat="none", spec=sp, create_state="failed", consecutive_failures=2,
                   tried_zones=[ZONES[0]]))
    assert d.action.provisioning == "standard" and d.status.provisioning == "standard"


def test_waiting_backoff_grows_with_each_refused_round():
    first = decide(obs("PROVISIONING", raw=None, heartbeat="none", create_state="failed", tried_zones=ZONES,
                       consecutive_failures=3))
    assert first.action.until == NOW + timedelta(seconds=30 * 4)
    again = decide(obs("WAITING_FOR_CAPACITY", raw=None, blocked=BLOCK_ALL, next_attempt_at=NOW, consecutive_failures=3))
    assert again.status.consecutive_failures == 4 and again.action.until >= NOW + timedelta(seconds=300)


def test_outcome_records_ignore_stale_attempts():
    s = status("PROVISIONING", create_state="pending")
    refused = after_create_refused(s, 3, ZONES[0], "capacity", "stockout", NOW)
    assert refused.create_state == "failed" and refused.tried_zones == [ZONES[0]] and refused.consecutive_failures == 1
    assert after_create_refused(s, 2, ZONES[0], "capacity", "x", NOW) is None
    assert after_created(s, 3, "job-3", NOW).create_state == "created"
    assert after_created(s.model_copy(update={"create_state": "created"}), 3, "job-3", NOW) is None
    failed = after_create_failed("job", s, 3, "Invalid value for machineType", NOW)
    assert failed.status.state is State.FAILED and failed.alert["type"] == "failed"
    started = after_start_refused(s, 3, ZONES[0], "stockout", NOW)
    assert started.state is State.PREEMPTED and ZONES[0] in started.tried_zones


# What an action's outcome means (outcomes.followup, outcomes.after_act): reconcile._act performs the call, classifies
# how it ended, and carries out exactly this. Each row: the action, its outcome, the status read after it → whether
# the error is re-raised, the capacity record, whether the job is read again; and what is committed on it.
CREATE = Action(Act.CREATE, zone=ZONES[0], node="job-3", attempt=3, provisioning="spot")
START = Action(Act.START, zone=ZONES[0], node="job-3", attempt=3)
DELETE = Action(Act.DELETE, zone=ZONES[0], node="job-3")
OUTCOMES = {
    "done": Outcome(OutcomeKind.DONE),
    "exists": Outcome(OutcomeKind.EXISTS, "alreadyExists", "The resource 'job-3' already exists"),
    "not_found": Outcome(OutcomeKind.NOT_FOUND, "notFound", "The resource 'job-3' was not found"),
    "capacity": Outcome(OutcomeKind.CAPACITY, "ZONE_RESOURCE_POOL_EXHAUSTED", "does not have enough resources"),
    "quota": Outcome(OutcomeKind.QUOTA, "QUOTA_EXCEEDED", "Quota 'NVIDIA_T4_GPUS' exceeded. Limit: 1.0"),
    "failed": Outcome(OutcomeKind.FAILED, "invalid", "Invalid value for field 'machineType'"),
    "transient": Outcome(OutcomeKind.TRANSIENT, "ServiceUnavailable", "503 backend error"),
}
PENDING = dict(state="PROVISIONING", create_state="pending")
STARTING = dict(state="PROVISIONING", create_state="starting", in_place_restarts=1)
MOVED_ON = dict(state="PROVISIONING", create_state="pending", attempt=4, node="job-4", zone=ZONES[1])


class After:
    """The expected result: followup (propagate, capacity reason, record) and, on the status read after the act,
    what is committed (state, create_state, consecutive_failures, tried_zones, cause, alert) and the follow-up action."""

    def __init__(self, propagate=False, capacity=None, record=True, state=None, create_state=None, failures=0,
                 tried=(), cause=None, alert=None, action=Act.NONE):
        self.propagate, self.capacity, self.record = propagate, capacity, record
        self.state, self.create_state, self.failures, self.tried = state, create_state, failures, list(tried)
        self.cause, self.alert, self.action = cause, alert, action


NOTHING = After(record=False)
RETRY = After(propagate=True, record=False)
CONFIRMED = After(state="PROVISIONING", create_state="created")
FAILED = After(state="FAILED", create_state="pending", cause="create_failed", alert="failed")

AFTER_ACT_ROWS = [
    # create
    ("create done: confirmed", CREATE, "done", PENDING, CONFIRMED),
    ("create met 409: adopted, confirmed", CREATE, "exists", PENDING, CONFIRMED),
    ("create done, the job moved on: delete the node made", CREATE, "done", MOVED_ON, After(action=Act.DELETE)),
    ("create met 409, the job moved on: delete it", CREATE, "exists", MOVED_ON, After(action=Act.DELETE)),
    ("create done, already confirmed by another delivery", CREATE, "done", dict(state="RUNNING"), After()),
    ("create refused for capacity: the zone joins the round", CREATE, "capacity", PENDING,
     After(capacity="capacity", state="PROVISIONING", create_state="failed", failures=1, tried=[ZONES[0]],
           cause="zone_refused_capacity")),
    ("create refused for quota", CREATE, "quota", PENDING,
     After(capacity="quota", state="PROVISIONING", create_state="failed", failures=1, tried=[ZONES[0]],
           cause="zone_refused_quota")),
    ("create refused, stale (the job moved on): only the zone cools down", CREATE, "capacity", MOVED_ON,
     After(capacity="capacity")),
    ("create failed: the job fails", CREATE, "failed", PENDING, FAILED),
    ("create 404 (e.g. the image): the job fails", CREATE, "not_found", PENDING, FAILED),
    ("create failed, the job already finished: nothing", CREATE, "failed", dict(state="CANCELLED"), After()),
    ("create transient: re-raised", CREATE, "transient", PENDING, RETRY),
    # start (restart in place)
    ("start done: confirmed", START, "done", STARTING, CONFIRMED),
    ("start met 409: confirmed", START, "exists", STARTING, CONFIRMED),
    ("start refused for capacity: given up, replaced elsewhere", START, "capacity", STARTING,
     After(capacity="capacity", state="PREEMPTED", create_state="starting", failures=1, tried=[ZONES[0]],
           cause="zone_refused_capacity")),
    ("start refused for quota", START, "quota", STARTING,
     After(capacity="quota", state="PREEMPTED", create_state="starting", failures=1, tried=[ZONES[0]],
           cause="zone_refused_quota")),
    ("start 404: the stopped node vanished, the next pass sees it", START, "not_found", STARTING, NOTHING),
    ("start failed: the job fails", START, "failed", STARTING, After(state="FAILED", create_state="starting",
                                                                    cause="create_failed", alert="failed")),
    ("start transient: re-raised", START, "transient", STARTING, RETRY),
    # delete
    ("delete done", DELETE, "done", dict(state="PREEMPTED"), NOTHING),
    ("delete 404 is success", DELETE, "not_found", dict(state="PREEMPTED"), NOTHING),
    ("delete transient: re-raised", DELETE, "transient", dict(state="PREEMPTED"), RETRY),
    ("delete failed: re-raised", DELETE, "failed", dict(state="PREEMPTED"), RETRY),
    ("delete refused for capacity: re-raised", DELETE, "capacity", dict(state="PREEMPTED"), RETRY),
]


@pytest.mark.parametrize("name,action,outcome,st,want", AFTER_ACT_ROWS, ids=[r[0] for r in AFTER_ACT_ROWS])
def test_after_act_table(name, action, outcome, st, want):
    out = OUTCOMES[outcome]
    f = followup(GPU_STOP, action, out, NOW)
    assert (f.propagate, f.record) == (want.propagate, want.record)
    if want.capacity is None:
        assert f.capacity is None
    else:
        c = f.capacity
        assert (c.zone, c.accelerator_type, c.reason, c.code, c.message) == (
            ZONES[0], "g2-standard-8", want.capacity, out.code, out.message)
        assert (c.recorded_at, c.until) == (NOW, NOW + timedelta(seconds=GPU_STOP.placement.cooldown_seconds))
    before = status(**st)
    d = after_act("job", before, action, out, NOW)
    assert d.action.kind is want.action
    if want.action is Act.DELETE:  # the node this create made, where it made it
        assert (d.action.zone, d.action.node) == (action.zone, action.node)
    if want.state is None:
        assert d.status is None and d.cause is None and d.alert is None
        return
    after = d.status
    assert (after.state.value, after.create_state, after.consecutive_failures, after.tried_zones) == (
        want.state, want.create_state, want.failures, want.tried)
    # The placement and the restart count are the ones the action was about; the revision is bumped once.
    assert (after.attempt, after.node, after.zone, after.restarts) == (3, "job-3", ZONES[0], before.restarts)
    assert after.revision == before.revision + 1 and after.updated_at == NOW
    assert d.cause == want.cause
    assert (d.alert["type"] if d.alert else None) == want.alert
    if want.cause and want.cause.startswith("zone_refused"):
        assert d.details == {"zone": ZONES[0], "code": out.code, "node": "job-3"}
        assert ZONES[0] in after.message and out.message in after.message
    if want.cause == "create_failed":
        assert d.details == {"code": out.code, "message": out.message}
        assert after.message == f"creating job-3 in {ZONES[0]} failed: {out.code}: {out.message}"
        assert d.alert["cause"] == "create_failed" and d.alert["attempt"] == 3


def test_after_act_table_covers_every_action_and_outcome():
    seen = {(r[1].kind, r[2]) for r in AFTER_ACT_ROWS}
    for act in (Act.CREATE, Act.START):
        assert {o for a, o in seen if a is act} == set(OUTCOMES), act
    assert {o for a, o in seen if a is Act.DELETE} >= {"done", "not_found", "transient", "failed"}
    assert {k.value for k in OutcomeKind} == {o.kind.value for o in OUTCOMES.values()}


@pytest.mark.parametrize("kind", get_args(placement.Kind))
def test_every_classified_error_is_an_outcome(kind):
    out = Outcome.of(placement.Classified(kind, "CODE", "msg"))
    assert (out.code, out.message) == ("CODE", "msg")
    assert out.kind is (OutcomeKind.FAILED if kind == "fatal" else OutcomeKind(kind))


def test_outcomes_of_other_actions_are_refused():
    with pytest.raises(ValueError):
        followup(GPU_STOP, Action(Act.POLL), OUTCOMES["done"], NOW)
    with pytest.raises(ValueError):
        after_act("job", status("RUNNING"), Action(Act.WAIT, until=NOW), OUTCOMES["done"], NOW)


# The exhaustive sweep: every state × real node state × heartbeat × cancel × hint.
RAW_STATES = {"gpu": [None, "PENDING", "PROVISIONING", "STAGING", "RUNNING", "PENDING_STOP", "STOPPING", "STOPPED",
                      "SUSPENDING", "SUSPENDED", "TERMINATED", "DEPROVISIONING", "REPAIRING", "WEIRD"],
              "tpu": [None, "CREATING", "READY", "DELETING", "PREEMPTED", "TERMINATED", "STOPPED", "REPAIRING", "UNKNOWN"]}
# A queued resource's states before it is ACTIVE (functions/models/queued.py), then its node's.
RAW_STATES["tpu_queued"] = [*(f"queued:{s}" for s in ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING",
                                                      "ACTIVE", "FAILED", "SUSPENDING", "SUSPENDED", "DELETING")),
                            *RAW_STATES["tpu"]]
FLEX_ENDED = make_spec(termination_action="DELETE", provisioning=["spot", {"model": "flex-start", "max_run_hours": 1}])
GRID = [
    (state, spec_name, raw, hbk, cancel, hint, create_state)
    for state in State
    for spec_name, sp in (("gpu_stop", GPU_STOP), ("gpu_delete", GPU_DELETE), ("tpu", TPU), ("invalid", None),
                          ("gpu_flex", FLEX_ENDED), ("tpu_queued", TPU_QUEUED))
    for raw in RAW_STATES[{"tpu": "tpu", "tpu_queued": "tpu_queued"}.get(spec_name, "gpu")]
    for hbk in HEARTBEATS
    for cancel in (False, True)
    for hint in (None, "preempted", NOTICE)
    for create_state in (("pending", "starting", "created", "failed") if state is not State.PENDING else (None,))
    if state is not State.PENDING or raw is None  # a pending job has no node name yet, so nothing to observe, nor a create
]
SPECS = {"gpu_stop": GPU_STOP, "gpu_delete": GPU_DELETE, "tpu": TPU, "invalid": None, "gpu_flex": FLEX_ENDED,
         "tpu_queued": TPU_QUEUED}
# What a row's status holds besides the grid's columns: a flex-start node past its run's end.
SLOT = {"gpu_flex": dict(provisioning="flex-start", run_ends_at=NOW - timedelta(seconds=30))}


def test_grid_covers_every_state_and_phase():
    assert {g[0] for g in GRID} == set(State)
    phases = {phase_of("tpu" if g[1].startswith("tpu") else "gpu", g[2]) for g in GRID}
    assert phases == set(Phase)


@pytest.mark.parametrize("raw,phase", [("PENDING", Phase.BOOTING), ("PENDING_STOP", Phase.STOPPING),
                                       ("DEPROVISIONING", Phase.STOPPING)])
def test_compute_statuses_beyond_the_documented_nine(raw, phase):
    assert phase_of("gpu", raw) is phase


def test_every_compute_instance_status_has_a_phase():
    # Statuses the installed client library can return never fall to UNKNOWN (where recovery could only poll).
    compute_v1 = pytest.importorskip("google.cloud.compute_v1")
    statuses = set(compute_v1.Instance.Status.__members__) - {"UNDEFINED_STATUS"}
    assert {s for s in statuses if phase_of("gpu", s) is Phase.UNKNOWN} == set()
    assert statuses <= set(RAW_STATES["gpu"])  # and the exhaustive sweep below covers each of them


PROGRESS = ("last_step", "last_committed_step", "total_steps")


class Unread(Mapping):
    """An empty mapping that records whether it was read (a key, a lookup, its length, its keys)."""

    def __init__(self):
        self.read = False

    def __getitem__(self, key):
        self.read = True
        raise KeyError(key)

    def __contains__(self, key):
        self.read = True
        return False

    def __iter__(self):
        self.read = True
        return iter(())

    def __len__(self):
        self.read = True
        return 0


@pytest.mark.parametrize("state", list(State), ids=[s.value for s in State])
def test_invariants_over_every_observation(state):
    """One pass over the grid (each observation built and decided once): the decision's invariants, and the reads
    observe() skips. It reads the zone cooldowns only when needs_capacity() says so, and a node's serial console only
    when needs_console() says so: everywhere else the decision must not read them (so it is the same whether every
    zone is blocked or none is, and whatever the console says)."""
    skipped = 0
    # The status (and its one-node job) depends only on the spec and create_state: built once for each, shared by the
    # observations that vary the node, heartbeat, cancel and hint; checked unchanged at the end (decide is pure).
    statuses, wholes, invalid = {}, {}, obs(state.value, spec=None)
    for _, spec_name, raw, hbk, cancel, hint, create_state in (g for g in GRID if g[0] is state):
        key = (spec_name, create_state)
        if key not in statuses:
            statuses[key] = status(state.value, create_state=create_state, **SLOT.get(spec_name, {}))
            wholes[key] = _whole_of(statuses[key])
        sp = SPECS[spec_name]
        node = NodeObs(phase_of(sp.accelerator.kind if sp is not None else "gpu", raw), raw)
        # What observe() would not read is given as a mapping that records any read: the decision must make none.
        unread = {}
        if not needs_capacity(statuses[key], node, hint):
            skipped += 1
            unread["blocked"] = Unread()
        if not needs_console(statuses[key], node, HEARTBEATS[hbk], SETTINGS, NOW):
            unread["consoles"] = Unread()
        o = Observation(job_id="job", spec=sp, spec_errors=() if sp is not None else invalid.spec_errors,
                        status=statuses[key], cancel_requested=cancel, node=node, heartbeat=HEARTBEATS[hbk], now=NOW,
                        hint=hint, settings=SETTINGS, **unread)
        d = decide(o, wholes[key])
        where = f"{state.value}/{spec_name}/{raw}/{hbk}/cancel={cancel}/hint={hint}/{create_state}"
        assert not [name for name, m in unread.items() if m.read], (where, [n for n, m in unread.items() if m.read])
        after = d.status.state if d.status else state
        # Never a second live node: a create only when the API says the current node does not exist, or during its
        # notice, with that node recorded as leaving (it saves its emergency checkpoint and goes) and named to
        # the new node (the handover).
        if d.action.kind is Act.CREATE:
            if o.node.present:
                assert hint == NOTICE and o.node.phase in (Phase.RUNNING, Phase.STOPPING), where
                leaving = (d.status or o.status).leaving
                assert leaving is not None and (leaving.node, leaving.zone) == (o.status.node, o.status.zone), where
                assert d.action.handover is not None and d.action.handover.node == o.status.node, where
            else:
                assert d.action.handover is None, where
            assert d.action.node == node_name("job", d.action.attempt), where
            final = d.status or o.status
            assert (final.attempt, final.node, final.zone) == (d.action.attempt, d.action.node, d.action.zone), where
            assert d.action.attempt in (o.status.attempt, o.status.attempt + 1), where
        if d.action.kind is Act.START:
            assert o.node.phase is Phase.DEAD and SPECS[spec_name] is GPU_STOP, where
        # A finished job never gets a node again, and a node of a finished job is deleted.
        if after.terminal:
            assert d.action.kind in (Act.NONE, Act.DELETE, Act.POLL), where
            if o.node.present and o.node.phase is not Phase.DELETING:
                assert d.action.kind is Act.DELETE, where
        # Terminal states stay terminal, but for a job stopped at its budget whose budget now allows (here: none):
        # it starts again (PENDING) once no node of it is left; the user's cancel and an invalid spec always win
        # over recovery.
        if state is State.BUDGET_EXHAUSTED and SPECS[spec_name] is not None and not cancel:
            assert after in (State.BUDGET_EXHAUSTED, State.PENDING), where
            assert after is State.BUDGET_EXHAUSTED or not o.node.present, where
        elif state.terminal:
            assert d.status is None, where
        elif cancel and SPECS[spec_name] is not None:
            assert after is State.CANCELLED, where
        elif SPECS[spec_name] is None:
            assert after is State.INVALID, where
        # Every recorded change bumps the revision exactly once (the optimistic-concurrency check).
        if d.status is not None:
            assert d.status.revision == o.status.revision + 1 and d.status.updated_at == NOW, where
        # A slot's decision never writes the job's progress: functions/job.py's `progress` alone does, once.
        if d.status is not None and SPECS[spec_name] is not None and not cancel and not state.terminal:
            assert [getattr(d.status, k) for k in PROGRESS] == [getattr(o.status, k) for k in PROGRESS], where
        # A state change always names its cause; a wait always says until when.
        if after is not state:
            assert d.cause, where
        if d.action.kind is Act.WAIT:
            assert d.action.until is not None and d.action.until > NOW or after is State.WAITING_FOR_CAPACITY, where
    for (spec_name, create_state), st in statuses.items():
        assert st == status(state.value, create_state=create_state, **SLOT.get(spec_name, {}))
        assert wholes[spec_name, create_state] == _whole_of(st)
    # The reads are skipped on the polls of a healthy or booting node, the passes that dominate a recovery.
    assert skipped > 0 or state in (State.PENDING, State.WAITING_FOR_CAPACITY, State.PREEMPTED, State.RESTARTING)


CONSOLE = "startup-script: {\"severity\": \"ERROR\", \"message\": \"could not download gs://b/agent.pyz\"}\n"


def test_a_boot_failure_records_the_console_tail_and_counts_a_failure_not_a_preemption():
    o = replace(obs("RUNNING", heartbeat="none", failures=0, preemptions=4), consoles={"job-3": "x" * 9000 + CONSOLE})
    d = decide(o)
    st = d.status
    assert (d.cause, d.action.kind, st.state) == ("no_heartbeat", Act.DELETE, State.RESTARTING)
    assert (st.failures, st.preemptions, st.boot_failures, st.failure_streak, st.restarts) == (1, 4, 1, 1, 2)
    assert st.console_tail.endswith(CONSOLE) and len(st.console_tail) == 4000  # bounded: the end of it
    assert st.next_attempt_at == NOW + timedelta(seconds=30)  # the backoff before the next node
    assert d.alert["type"] == "boot_failed" and d.alert["console_tail"] == st.console_tail
    assert "could not download" in alerts.to_slack(d.alert)["blocks"][-2]["text"]["text"]


def test_the_second_boot_failure_in_a_row_fails_the_job_naming_what_to_check():
    o = replace(obs("RUNNING", heartbeat="none", boot_failures=1, failures=1), consoles={"job-3": CONSOLE})
    d = decide(o)
    st = d.status
    assert st.state is State.FAILED and d.action.kind is Act.DELETE and st.boot_failures == 2
    assert st.console_tail == CONSOLE and d.alert["console_tail"] == CONSOLE and d.alert["cause"] == "no_heartbeat"
    for what in (GPU_STOP.accelerator.boot_image, "startup script", "respawn-agent", "service account"):
        assert what in st.message, what
    tpu = decide(replace(obs("RUNNING", raw="READY", heartbeat="none", boot_failures=1, spec=TPU), consoles={"job-3": None}))
    assert "tpu-ubuntu2204-base" in tpu.status.message and "no console" in tpu.status.console_tail


def test_a_console_that_was_not_read_says_so():
    d = decide(obs("RUNNING", heartbeat="none"))
    assert d.status.console_tail == "(the console was not read)"


def test_a_heartbeat_ends_the_boot_failures_in_a_row_and_advancing_training_ends_the_backoff_streak():
    d = decide_job(obs("RUNNING", boot_failures=1, failure_streak=2, last_committed_step=90))
    assert (d.status.boot_failures, d.status.failure_streak, d.status.last_committed_step) == (0, 0, 100)
    same = decide_job(obs("RUNNING", heartbeat="fresh", failure_streak=2, last_committed_step=100, last_step=120))
    assert same.status is None  # nothing advanced: the streak stands


@pytest.mark.parametrize("streak,wait", [(0, 30), (1, 60), (2, 120), (4, 480), (5, 900), (30, 900)])
def test_failures_back_off_exponentially_up_to_the_cap_and_preemptions_do_not(streak, wait):
    crash = decide(obs("RUNNING", heartbeat="crash", failure_streak=streak, failures=0))
    assert crash.status.next_attempt_at == NOW + timedelta(seconds=wait)  # base 30 s, cap max_backoff_seconds 900
    assert (crash.status.failures, crash.status.failure_streak) == (1, streak + 1)
    gone = decide(obs("RESTARTING", raw=None, next_attempt_at=crash.status.next_attempt_at))
    assert gone.action == Action(Act.WAIT, until=crash.status.next_attempt_at)
    preempted = decide(obs("RUNNING", raw=None, spec=GPU_DELETE, hint="preempted", failure_streak=streak))
    assert preempted.action.kind is Act.CREATE and preempted.status.next_attempt_at is None
    assert preempted.status.failure_streak == streak and preempted.status.preemptions == 1


def test_preemption_rate_backoff_grows_with_each_preemption_over_the_limit():
    spec = make_spec(termination_action="DELETE", preemption_rate=RATE_BACKOFF)
    times = [NOW - timedelta(minutes=m) for m in (50, 40, 30, 20)]  # 4 in the hour: this one is the 3rd over max 2
    d = decide(obs("RUNNING", raw=None, hint="preempted", spec=spec, preempted_times=times))
    assert d.action == Action(Act.WAIT, until=NOW + timedelta(seconds=30 * 4))
    assert d.status.preempted_times == [*times, NOW] and d.status.rate_exceeded_at == NOW
    assert d.alert["type"] == "preemption_rate" and "5 preemptions within 1 h" in d.alert["message"]


def test_without_a_rate_the_status_keeps_one_preemption_time():
    d = decide(obs("RUNNING", raw=None, spec=GPU_DELETE, hint="preempted",
                   preempted_times=[NOW - timedelta(days=d) for d in (3, 2, 1)]))
    assert d.status.preempted_times == [NOW]


@pytest.mark.parametrize("cause,heartbeat,kind", [
    ("preempted", None, "preemption"), ("host_error", None, "preemption"), ("node_gone", None, "preemption"),
    ("node_terminated", None, "preemption"), ("node_stopping", None, "preemption"),
    ("trainer_crashed", "crash", "failure"), ("stale_heartbeat", "stale", "failure"),
    ("stale_heartbeat", "noticed", "preemption"), ("no_heartbeat", None, "boot_failure"),
])
def test_what_a_loss_counts_as(cause, heartbeat, kind):
    assert loss_kind(cause, HEARTBEATS[heartbeat] if heartbeat else None) == kind


def test_the_recovered_alert_comes_when_the_replacement_trains_and_says_what_it_cost():
    # The lost node reached step 107 (the notice found no later commit than the replacement's restored step 100).
    st = dict(recovering=True, preempted_zone=ZONES[0], zone=ZONES[1], preempted_at=NOW - timedelta(seconds=90),
              last_step=107, steps_lost=20, failures=1, preemptions=2, restarts=3, last_cause="preempted")
    up = decide_job(obs("PROVISIONING", raw="RUNNING", heartbeat="none", **st))
    assert up.alert is None and up.status.recovering and "waiting for its agent" in up.status.message
    restoring = decide_job(replace(obs("RUNNING", heartbeat="restored", **st), status=up.status))
    assert restoring.alert is None and restoring.status.last_step == 107  # the furthest step stays while recovering
    d = decide_job(replace(obs("RUNNING", **st), status=restoring.status))
    a = d.alert
    # From the notice (90 s ago) to its first step (30 s ago); lost: 107 reached, resumed from 100 (recovery_time).
    assert (a["type"], a["old_zone"], a["new_zone"], a["recovery_seconds"], a["steps_lost"], a["resumed_from"]) == (
        "recovered", ZONES[0], ZONES[1], 60.0, 7, 100)
    assert d.status.steps_lost == 7 and d.details["recovery_seconds"] == 60.0 and d.cause == "recovered"
    assert (a["failures"], a["preemptions"], a["restarts"]) == (1, 2, 3) and not d.status.recovering
    assert decide_job(replace(obs("RUNNING", **st), status=d.status)).alert is None  # once


# ---- a multi-host TPU slice: one heartbeat from its workers' -----------------------------------------------------

def test_slice_heartbeat_serves_only_while_every_worker_beats():
    from respawn.control.observation import slice_heartbeat

    w0, w1 = hb(age=5, step=50, committed_step=40), hb(age=50, step=48, committed_step=45, worker=1)
    got = slice_heartbeat([w0, w1])
    # The stalest worker's time (a silent worker makes the slice stale), the newest committed step, worker 0's step.
    assert (got.heartbeat_at, got.committed_step, got.step) == (w1.heartbeat_at, 45, 50)
    assert slice_heartbeat([w0, None]) is None  # a worker that never beat: the slice is not serving yet
    assert slice_heartbeat([w0]) is w0  # one host: its own
    assert slice_heartbeat([]) is None


@pytest.mark.parametrize("workers, state, exit_code, notice", [
    ([("exited", 0, None), ("training", None, None)], "training", None, None),  # worker 0 done first: not yet
    ([("exited", 0, None), ("exited", 0, None)], "exited", 0, None),  # every worker exited 0: the slice did
    ([("training", None, None), ("exited", 3, None)], "exited", 3, None),  # a worker's crash is the slice's
    ([("training", None, None), ("setup-failed", 1, None)], "setup-failed", 1, None),
    ([("training", None, None), ("preempting", None, "preempted")], "preempting", None, "preempted"),
    ([("exited", 75, "sigterm"), ("exited", 75, "sigterm")], "exited", 75, "sigterm"),  # stopped on the notice
])
def test_slice_heartbeat_lets_a_failing_or_noticed_worker_speak_for_the_slice(workers, state, exit_code, notice):
    from respawn.control.observation import slice_heartbeat

    hbs = [hb(st, worker=i, exit_code=code, notice=note) for i, (st, code, note) in enumerate(workers)]
    got = slice_heartbeat(hbs)
    assert (got.state.value, got.exit_code, got.notice) == (state, exit_code, notice)


STARTED = NOW - timedelta(minutes=10)


@pytest.mark.parametrize("hint, node, started_at, cause", [
    (Hint("preempted", "job-3", NOW), "job-3", STARTED, "preempted"),  # about the current life
    (Hint("preempted", "job-2", NOW), "job-3", STARTED, None),  # about an earlier node of the job
    (Hint("preempted", "job-3", STARTED - timedelta(seconds=1)), "job-3", STARTED, None),  # before a restart in place
    (Hint("preempted", "job-3", STARTED), "job-3", STARTED, "preempted"),  # at the start itself: this life
    (Hint("preempted", "job-3"), "job-3", STARTED, "preempted"),  # an entry without a time: its node decides
    (Hint("preempted", "job-3", NOW), "job-3", None, "preempted"),  # a node whose start was never recorded
    (Hint("preempted", "job-3", NOW), None, None, None),  # the job has no node
])
def test_an_events_hint_counts_only_for_the_node_it_names_in_the_life_it_described(hint, node, started_at, cause):
    assert hint.about(node, started_at) == cause



# One code for every job: a row's node is a slot of a job (functions/job.py decides every job through decide.decide).
# With nodes: 1 the job's decision is the row's; with nodes: 3 the same row, as slot 1 of a job whose other members
# train in its generation, acts on slot 1 alone, the same way.

# The field names, read once: the sweep builds a job for every point of the grid.
_MEMBER_FIELDS = tuple(MemberStatus.model_fields)
_COUNTER_FIELDS = tuple(JobCounters.model_fields)
_SUMMARY_FIELDS = tuple(k for k in JobStatus.model_fields if k in MemberStatus.model_fields)


def _whole_of(s):
    """A one-node job's status: its top level is its slot's summary."""
    row = MemberStatus(**{k: getattr(s, k) for k in _MEMBER_FIELDS})
    return JobStatus(**{k: getattr(s, k) for k in _COUNTER_FIELDS}, **{k: getattr(s, k) for k in _SUMMARY_FIELDS},
                     members=[row] if s.node else [])


def _job_of(o, nodes, whole=None):
    """The row as the observation of a job of `nodes` (1, or 3 with the row's slot in the middle): the job's
    observation and what was seen of each member; a one-node job's status is `whole` when given (a sweep builds it
    once for many rows)."""
    s = o.status
    seen_row = job.MemberObs(o.node, o.heartbeat, None, o.hint)
    if nodes == 1:
        return replace(o, status=whole if whole is not None else _whole_of(s)), [seen_row]
    row = MemberStatus(**{k: getattr(s, k) for k in _MEMBER_FIELDS})
    counters = {k: getattr(s, k) for k in _COUNTER_FIELDS}
    others = [MemberStatus(state=State.RUNNING, attempt=a, node=f"job-{a}", zone=s.zone, provisioning="spot",
                           create_state="created", node_started_at=NOW - timedelta(hours=1), address=f"10.0.0.{a}",
                           generation_sent=1) for a in (1, 2)]
    gen = {"number": 1, "members": ["job-1", "job-3", "job-2"], "master_addr": "10.0.0.1"}
    whole = JobStatus(**counters, state=State.RUNNING, attempt=s.attempt, node="job-1", zone=s.zone,
                      members=[others[0], row.model_copy(update={"generation_sent": 1, "address": "10.0.0.3"}),
                               others[1]], generation=gen)
    trains = [job.MemberObs(NodeObs(Phase.RUNNING, "RUNNING"), hb(attempt=a, generation=1), f"10.0.0.{a}") for a in (1, 2)]
    return replace(o, status=whole, spec=o.spec.model_copy(update={"nodes": 3, "min_nodes": 3})), [trains[0], seen_row,
                                                                                                trains[1]]


@pytest.mark.parametrize("name,o,action,state,alert", ROWS, ids=[r[0] for r in ROWS])
def test_every_row_decides_a_one_node_job_the_same(name, o, action, state, alert):
    from respawn.control import job

    jo, seen = _job_of(o, 1)
    d = job.decide(jo, seen)
    assert (d.action.kind, new_state(d, jo), alert_type(d)) == (action, state, alert)


# The job's own decisions, not a slot's, differ by design with several nodes: a cancel deletes every member, one
# member's trainer exiting 0 ends the job only with the last step committed, and a slot that is not placing the job
# stays in the job's zone (a refused zone moves the whole job: membership.plan).
JOB_WIDE = {"running, cancel requested: cancelled, delete", "running, trainer exited 0: succeeded, delete",
            "running, exited 0 and node already stopped", "provisioning, zone refused: next attempt"}
ACTING = [r for r in ROWS if r[2] in (Act.CREATE, Act.START, Act.DELETE) and r[1].spec is not None
          and r[1].spec.accelerator.kind == "gpu" and not r[1].blocked and r[0] not in JOB_WIDE
          and r[1].status.state in (State.RUNNING, State.PROVISIONING, State.PREEMPTED, State.RESTARTING)]


@pytest.mark.parametrize("name,o,action,state,alert", ACTING, ids=[r[0] for r in ACTING])
def test_the_same_rows_act_on_one_slot_of_a_three_node_job(name, o, action, state, alert):
    from respawn.control import job

    jo, seen = _job_of(o, 3)
    d = job.decide(jo, seen)
    assert (d.action.kind, d.action.slot) == (action, 1)
    after = d.status.members[1].state.value if d.status is not None else o.status.state.value
    assert after == state or (d.status.state.value == state and State(state).terminal)
    assert [m.node for i, m in enumerate((d.status or jo.status).members) if i != 1] == ["job-1", "job-2"]
