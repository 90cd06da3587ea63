"""A bad day as the record tells it (issue 46 item 1, issue 45 item 3), in the pure core: a crash is a failure in
every word (its state, its cause, its count, the trainer's last error), and a noticed node's emergency save is told
with its outcome on the loss, its event and Slack, in the words of respawn.losswords. Observations in, Decisions
out; the events as functions/job.py writes them."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from respawn import losswords
from respawn.control import alerts, job
from respawn.control import decide as core
from respawn.control import actions, observation
from respawn.schema import Leaving, State
from test_decide_table import GPU_DELETE, NOW, _job_of, hb, make_spec, obs

TRACEBACK = ('Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
             '    raise ValueError("bad learning rate")\nValueError: bad learning rate\n')
CRASH = hb("exited", exit_code=1, step=130, committed_step=100, output_tail=TRACEBACK)
WORKER = "rank 1: RuntimeError: DataLoader worker (pid 7883) is killed by signal: Terminated."
FAILED_SAVE = {"state": "failed", "step": None, "reason": WORKER}


def _job_decision(o):
    """The decision and its event as production writes them for a one-node job (functions/job.py)."""
    jo, seen = _job_of(o, 1)
    d = job.decide(jo, seen)
    return d, job.event(jo, d)


def _slack_lines(alert) -> list[str]:
    return [b["text"]["text"] for b in alerts.to_slack(alert)["blocks"] if b["type"] == "section" and "text" in b]


GLOO_BROKE = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
              "[10.0.0.3]:5825. This is typically caused by a remote worker crashing.")
TORCHRUN_TAIL = ("[rank2]: Traceback (most recent call last):\n[rank2]:   File \"train.py\", line 9, in <module>\n"
                 "[rank2]: ValueError: bad learning rate\nE1207 13:28:35.370000 2953 api.py:1002] failed (exitcode: 1) "
                 "local_rank: 0 (pid: 3244) of binary: python3\nTraceback (most recent call last):\n"
                 "  File \"torchrun\", line 8, in <module>\n    raise ChildFailedError(\n"
                 "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
                 "============================================================\ntrain.py FAILED\n"
                 "Root Cause (first observed failure):\n  rank      : 2 (local_rank: 0)\n"
                 "============================================================\n")


@pytest.mark.parametrize("tail,line", [
    (TRACEBACK, "ValueError: bad learning rate"),
    # A chained exception: the last one raised is the one the run died of.
    ("KeyError: 'lr'\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most "
     "recent call last):\n  File \"t.py\", line 3\ntorch.OutOfMemoryError: CUDA out of memory. Tried 2.00 GiB\n",
     "torch.OutOfMemoryError: CUDA out of memory. Tried 2.00 GiB"),
    ("Traceback (most recent call last):\n  File \"t.py\", line 2\n    assert lr > 0\nAssertionError\n\n",
     "AssertionError"),
    ("step 3 done\nSegmentation fault (core dumped)\n  \n", "Segmentation fault (core dumped)"),  # no exception line
    ("\x1b[31mRuntimeError: NCCL error\x1b[0m\n", "RuntimeError: NCCL error"),
    # Under torchrun: the rank's own error, without torchrun's prefix, not the launcher's ChildFailedError after it.
    (TORCHRUN_TAIL, "ValueError: bad learning rate"),
    (TORCHRUN_TAIL.replace("[rank2]: ValueError: bad learning rate", "[rank2]: " + GLOO_BROKE),
     "RuntimeError: " + GLOO_BROKE.split("RuntimeError: ")[1]),
    ("", None), (None, None), ("\n  \n", None),
])
def test_the_last_error_is_the_last_exception_line_else_the_last_line(tail, line):
    assert losswords.last_error(tail) == line


def test_a_collective_broken_under_a_rank_is_told_apart_from_its_own_error():
    assert not losswords.broken_collective(TORCHRUN_TAIL) and not losswords.broken_collective(None)
    assert losswords.broken_collective(TORCHRUN_TAIL.replace("ValueError: bad learning rate", GLOO_BROKE))
    assert losswords.broken_collective("RuntimeError: NCCL communicator was aborted on rank 3.\n")


def test_a_crash_is_a_failure_in_every_word_the_record_holds():
    o = replace(obs("RUNNING", spec=GPU_DELETE), heartbeat=CRASH)
    d, ev = _job_decision(o)
    st = d.status
    # Its own transition: RESTARTING with the crash's cause, while its node is deleted and its backoff runs.
    assert (ev.from_state, ev.to_state, ev.cause) == (State.RUNNING, State.RESTARTING, "trainer_crashed")
    assert (st.failures, st.preemptions, st.last_cause) == (1, 0, "trainer_crashed")
    assert st.message.startswith("trainer exited 1 on job-3 (ValueError: bad learning rate); deleting it")
    assert "preempt" not in st.message.lower() and "preempt" not in ev.cause
    # The trainer's error, one line, on the record, the event and the alert; Slack shows it on a line of its own.
    assert st.last_error == ev.details["last_error"] == d.alert["last_error"] == "ValueError: bad learning rate"
    assert d.alert["type"] == "crashed" and "emergency" not in ev.details
    assert "last error: ValueError: bad learning rate" in _slack_lines(d.alert)
    # The replacement follows once the node is gone and the backoff is over: RESTARTING → PROVISIONING.
    slot = job.project(d.status, 0)
    after = core.decide(replace(o, status=slot, node=observation.ABSENT, heartbeat=None, now=slot.next_attempt_at))
    assert (after.action.kind, after.status.state, after.cause) == (actions.Act.CREATE, State.PROVISIONING,
                                                                     "replacement")


def test_a_crash_past_max_failures_says_the_number_the_counter_holds():
    spec = make_spec(max_restarts=3, termination_action="DELETE")  # max_restarts: max_failures's old name
    d, ev = _job_decision(replace(obs("RUNNING", spec=spec, failures=3), heartbeat=CRASH))
    assert (d.status.state, ev.to_state, ev.cause) == (State.FAILED, State.FAILED, "trainer_crashed")
    assert d.status.failures == d.alert["failures"] == 4
    assert d.status.message.startswith("gave up after 4 failures, more than max_failures (3)")
    assert d.status.message.endswith("last error: ValueError: bad learning rate")
    assert ev.details["last_error"] == d.alert["last_error"] == "ValueError: bad learning rate"


def test_a_stale_heartbeat_is_a_failure_too_never_preempted():
    d, ev = _job_decision(obs("RUNNING", heartbeat="stale", spec=GPU_DELETE))
    assert (ev.to_state, ev.cause, d.status.failures, d.status.preemptions) == (
        State.RESTARTING, "stale_heartbeat", 1, 0)
    assert d.status.last_error is None and "last_error" not in ev.details


def test_a_failed_setup_ends_the_job_as_one_failure_with_its_last_error():
    d, ev = _job_decision(obs("RUNNING", heartbeat="setup_failed"))
    assert (ev.to_state, ev.cause, d.status.failures) == (State.FAILED, "setup_failed", 1)
    assert ev.details["last_error"] == d.status.last_error == "ERROR: No matching distribution found for torch==9"


# The emergency save of a noticed node, as its heartbeat tells it.


@pytest.mark.parametrize("emergency,resumed,lost,said", [
    (FAILED_SAVE, 216, 19, "emergency save failed on rank 1: RuntimeError: DataLoader worker (pid 7883) is killed by "
                           "signal: Terminated — resumed from step 216, 19 steps lost"),
    ({"state": "committed", "step": 131, "reason": None}, 131, 0,
     "emergency save committed step 131 — resumed from step 131, 0 steps lost"),
    ({"state": "not-started", "step": None, "reason": "the trainer had not started its first step"}, None, None,
     "emergency save not started: the trainer had not started its first step"),
    ({"state": "abandoned", "step": 40, "reason": "the notice budget ran out"}, 30, 1,
     "emergency save abandoned: the notice budget ran out — resumed from step 30, 1 step lost"),
    # The large-state demo scenario's (moved down from tests/test_demo_scenarios.py): a state too large for the budget.
    ({"state": "abandoned", "step": 162, "reason": "rank 0: deadline reached while writing step 162 (83886080 of "
                                                   "167855780 bytes)"}, 100, 62,
     "emergency save abandoned on rank 0: deadline reached while writing step 162 (83886080 of 167855780 bytes) — "
     "resumed from step 100, 62 steps lost"),
    ({"state": "saving", "step": 40, "reason": None}, None, None, "emergency save did not finish before the node went"),
    (None, 30, 2, None), ({"state": "mystery"}, None, None, None),
])
def test_the_emergency_sentence(emergency, resumed, lost, said):
    assert losswords.emergency_sentence(emergency, resumed, lost) == said


@pytest.mark.parametrize("details, said", [
    ({"emergency": {"state": "failed", "step": 9, "reason": "rank 1: OSError: disk full"}, "last_error": None},
     "emergency save failed on rank 1: OSError: disk full"),
    ({"emergency": {"state": "committed", "step": 9, "reason": None}}, None),  # a good day says nothing extra
    ({"last_error": "ValueError: bad lr"}, "ValueError: bad lr"),
    ({"emergency": {"state": "not-started", "step": None, "reason": "rank 0: killed"}, "last_error": "KeyError: 'x'"},
     "emergency save not started on rank 0: killed; KeyError: 'x'"),
    ({}, None),
])
def test_an_events_words_on_a_bad_day(details, said):
    assert losswords.event_words(details) == said


def _preempted_after_save(emergency):
    """job-3's node is gone; its last heartbeat said the notice came and how its save ended."""
    final = hb("exited", exit_code=75, notice="preempted", step=131, committed_step=100, emergency=emergency)
    return replace(obs("RUNNING", raw=None, spec=GPU_DELETE, hint="preempted"), heartbeat=final)


def test_a_preemption_carries_the_save_that_failed_to_the_record_the_event_and_the_recovered_alert():
    d, ev = _job_decision(_preempted_after_save(FAILED_SAVE))
    assert (ev.cause, d.status.preemptions, d.status.failures) == ("preempted", 1, 0)
    assert d.status.emergency == ev.details["emergency"] == FAILED_SAVE
    assert d.status.last_error is None and "last_error" not in ev.details
    # The replacement resumes from step 100 and steps: the recovered alert says how the save ended, once, in words.
    slot = job.project(d.status, 0)
    back = hb(attempt=slot.attempt, step=102, committed_step=100, started_at=NOW + timedelta(seconds=20),
              first_step=101, first_step_at=NOW + timedelta(seconds=40), age=-41)
    running = slot.model_copy(update={"state": State.RUNNING, "create_state": "created",
                                      "node_started_at": NOW + timedelta(seconds=1)})
    r = core.decide(replace(obs("RUNNING", spec=GPU_DELETE), status=running, heartbeat=back,
                            now=NOW + timedelta(seconds=45)))
    assert r.alert["type"] == "recovered" and r.alert["emergency"] == r.details["emergency"] == FAILED_SAVE
    said = ("emergency save failed on rank 1: RuntimeError: DataLoader worker (pid 7883) is killed by signal: "
            "Terminated — resumed from step 100, 31 steps lost")
    lines = _slack_lines(r.alert)
    assert lines.count(said) == 1 and sum("emergency save" in line for line in lines) == 1
    assert alerts.to_slack(r.alert)["text"].count("emergency save") == 1


def test_a_committed_save_says_so():
    d, ev = _job_decision(_preempted_after_save({"state": "committed", "step": 131, "reason": None}))
    assert ev.details["emergency"]["state"] == "committed"
    a = alerts.make("recovered", "job", NOW, "training again", emergency=d.status.emergency, resumed_from=131,
                    steps_lost=0)
    assert "emergency save committed step 131 — resumed from step 131, 0 steps lost" in _slack_lines(a)


def test_a_loss_without_a_notice_tells_no_save():
    d, ev = _job_decision(replace(obs("RUNNING", raw=None, spec=GPU_DELETE, hint="preempted"),
                                  heartbeat=hb(step=120, committed_step=100, emergency={"state": "idle"})))
    assert d.status.emergency is None and "emergency" not in ev.details


def test_a_save_still_under_way_at_the_notice_is_told_by_the_leaving_nodes_final_heartbeat():
    saving = hb("preempting", notice="preempted", step=131, committed_step=100,
                emergency={"state": "saving", "step": 131, "reason": None})
    d = core.decide(replace(obs("RUNNING", spec=GPU_DELETE, hint=observation.NOTICE), heartbeat=saving))
    assert d.status.leaving is not None and d.status.emergency is None  # not an outcome yet: nothing said
    # Passes later, job-3's final heartbeat: its save failed. The record holds it, with or without anything else.
    final = hb("exited", exit_code=1, notice="preempted", step=131, committed_step=100, emergency=FAILED_SAVE)
    later = replace(obs("PROVISIONING", raw="STAGING", heartbeat="none", spec=GPU_DELETE), status=d.status,
                    leaving_heartbeat=final, leaving=observation.NodeObs(observation.Phase.RUNNING, "RUNNING"),
                    now=NOW + timedelta(seconds=5))
    told = core.decide(later)
    assert told.status.emergency == FAILED_SAVE and told.status.revision == d.status.revision + 1
    assert told.action == actions.POLL  # what the pass does besides is unchanged
    # Told once: the next pass writes nothing more; an older life's heartbeat of that name tells nothing.
    assert core.decide(replace(later, status=told.status)).status is None
    older = final.model_copy(update={"attempt": 2})
    assert core.decide(replace(later, leaving_heartbeat=older)).status is None


def test_a_save_told_by_a_leaving_member_reaches_the_jobs_record():
    leaving = Leaving(node="job-3", zone="us-central1-a", attempt=3, until=NOW + timedelta(seconds=30))
    o = obs("PROVISIONING", raw="STAGING", heartbeat="none", spec=GPU_DELETE, leaving=leaving, attempt=4,
            node="job-4", create_state="created", recovering=True, last_cause="preempted", preempted_at=NOW)
    jo, seen = _job_of(o, 1)
    final = hb("exited", exit_code=1, notice="preempted", step=131, emergency=FAILED_SAVE)
    seen = [replace(seen[0], leaving=observation.NodeObs(observation.Phase.RUNNING, "RUNNING"),
                    leaving_heartbeat=final)]
    d = job.decide(jo, seen)
    assert d.status.emergency == d.status.members[0].emergency == FAILED_SAVE


def test_a_preemption_limit_that_fails_the_job_says_how_the_save_ended():
    spec = make_spec(termination_action="DELETE", max_preemptions=1)
    o = _preempted_after_save(FAILED_SAVE)
    d, ev = _job_decision(replace(o, spec=spec, status=o.status.model_copy(update={"preemptions": 1})))
    assert d.status.state is State.FAILED and d.alert["emergency"] == FAILED_SAVE == ev.details["emergency"]
    # The count the message gives is the counter's.
    assert d.status.preemptions == 2 and d.status.message.startswith("gave up after 2 preemptions, more than "
                                                                     "max_preemptions (1)")
    assert any(line.startswith("emergency save failed on rank 1") for line in _slack_lines(d.alert))


def test_a_slices_save_is_its_worst_workers():
    committed = {"state": "committed", "step": 131, "reason": None}
    workers = [hb("preempting", notice="preempted", step=131, emergency=committed),
               hb("preempting", worker=1, notice="preempted", step=131, emergency=FAILED_SAVE)]
    assert observation.slice_heartbeat(workers).emergency == FAILED_SAVE
    assert observation.slice_heartbeat([workers[0], workers[0]]).emergency == committed
