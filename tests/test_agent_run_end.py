"""A flex-start node knows its end (respawn-run-seconds: its run duration from the VM's start, taken as the guest's
boot), a reservation-bound node its reservation's (respawn-run-ends-at), and each acts on it as on a preemption notice, before it: the trainer's emergency save, the controller told at once
(kind run-ending), the final heartbeat saying run-ending. Real agents against the metadata sim, the Firestore
emulator and the Pub/Sub emulator. The run seconds are chosen against this machine's own boot clock (uptime + N):
the agent computes from the real clock, nothing is patched; RESPAWN_BOOT_TIME (the sim's nodes' boot) is used where
an agent must be late in its run."""

from __future__ import annotations

import math
import signal
import sys
import time
from datetime import datetime, timedelta, timezone

from agent_fixtures import (NodePython, agent_env, agent_tree, attributes, node_image_python,  # noqa: F401  (fixtures)
                            settings, wait_for)
from respawn.agent.run_end import RUN_END_MARGIN_S
from respawn.contract import ATTR_RUN_ENDS_AT, ATTR_RUN_SECONDS, EXIT_AGENT_DETACH, EXIT_CONFIG_ERROR, EXIT_PREEMPTED, NOTICE_RUN_ENDING
from test_agent_nudge import sweep  # noqa: F401  (a fixture: the sweep topic and a pull on it)

BUDGET = 3  # notice_budget_seconds: the tiny trainer saves at its next step


def _boot(env, node: str, s: dict, run_seconds: str | None, python: NodePython | None = None,
          ends_at: str | None = None, **agent_env: str):
    job, _, attempt = node.rpartition("-")
    attrs = attributes(job, int(attempt), env.project, s)
    if run_seconds is not None:
        attrs[ATTR_RUN_SECONDS] = run_seconds
    if ends_at is not None:
        attrs[ATTR_RUN_ENDS_AT] = ends_at
    return env.agent(env.metadata(node, attrs), env.tmp / node, python=python, **agent_env)


def _said(agent, prefix: str) -> dict | None:
    return next((e for e in agent.events() if e["message"].startswith(prefix)), None)


def _stepping(agent) -> bool:
    return (agent.node_dir / "status.json").exists()


def _uptime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def test_the_trainer_saves_and_stops_before_the_runs_end_and_a_node_without_one_trains_on(agent_env, sweep,
                                                                                         agent_tree):
    topic, pull = sweep
    s = settings([sys.executable, str(agent_env.tiny_trainer)], f"file://{agent_env.tmp}/store", sweep_topic=topic,
                 notice_budget_seconds=BUDGET, heartbeat_seconds=30)  # the notice must not wait for a beat
    act_in = 10.0  # time for both agents to start their trainers first
    run_seconds = math.ceil(_uptime() + act_in + BUDGET + RUN_END_MARGIN_S)
    planned = datetime.now(timezone.utc) + timedelta(seconds=run_seconds - _uptime() - BUDGET - RUN_END_MARGIN_S)
    # On the oldest node image's bare Python (the boot clock, the timer: standard library of 3.9).
    flex = _boot(agent_env, "fx-1", s, str(run_seconds), NodePython("3.9", node_image_python("3.9"), str(agent_tree)))
    plain = _boot(agent_env, "pl-1", s, None)
    known = wait_for(lambda: _said(flex, "flex-start run: its end is known"), 30, "the run's end logged")
    assert (known["run_seconds"], known["boot_from"], known["notice_budget_s"], known["margin_s"]) == (
        run_seconds, "CLOCK_BOOTTIME", BUDGET, RUN_END_MARGIN_S)
    assert abs(datetime.fromisoformat(known["acts_at"]) - planned) < timedelta(seconds=2)
    assert abs(datetime.fromisoformat(known["run_ends_at"]) - planned
               - timedelta(seconds=BUDGET + RUN_END_MARGIN_S)) < timedelta(seconds=2)
    wait_for(lambda: _stepping(flex) and _stepping(plain), 30, "both trainers stepping")
    assert pull() == [] and flex.proc.poll() is None  # not before its moment

    [message] = wait_for(pull, act_in + 15, "the run-ending notice on the sweep topic")
    notice = message.pop("notice")
    assert message == {"task": "sweep", "job_id": "fx"}
    assert (notice["node"], notice["kind"]) == ("fx-1", NOTICE_RUN_ENDING)
    # Told at the planned moment: a run's budget and margin before the end, not earlier.
    told = datetime.fromisoformat(notice["at"])
    assert planned - timedelta(seconds=1) <= told <= planned + timedelta(seconds=5)
    acted = _said(flex, "flex-start run: its end is near; acting")
    assert acted["severity"] == "WARNING" and acted["notice"] == NOTICE_RUN_ENDING
    assert BUDGET + RUN_END_MARGIN_S - 3 <= acted["seconds_to_end"] <= BUDGET + RUN_END_MARGIN_S + 1

    assert flex.wait(BUDGET + 15) == 0
    hb = agent_env.heartbeat("fx-1")
    assert (hb["state"], hb["notice"], hb["exit_code"]) == ("exited", NOTICE_RUN_ENDING, EXIT_PREEMPTED)
    assert hb["emergency"]["state"] == "committed" and hb["committed_step"] == hb["emergency"]["step"] is not None
    assert (flex.node_dir / "checkpoints" / f"step_{hb['committed_step']:012d}" / "COMMITTED").exists()
    assert flex.trainer_record()["notice"] == NOTICE_RUN_ENDING
    assert datetime.now(timezone.utc) < datetime.fromisoformat(known["run_ends_at"]) - timedelta(
        seconds=RUN_END_MARGIN_S - 5)  # all done well before the end
    # The node without the attribute trains on, and nobody told the controller anything more.
    time.sleep(1.0)
    assert plain.proc.poll() is None and _said(plain, "flex-start") is None
    hb = agent_env.heartbeat("pl-1")  # beats every 30 s here: its last may still be the one from its preparation
    assert hb["state"] in ("preparing", "training") and hb["notice"] is None
    assert pull() == []


def test_an_agent_late_in_its_run_acts_at_once(agent_env, sweep):
    topic, pull = sweep
    s = settings([sys.executable, str(agent_env.tiny_trainer)], f"file://{agent_env.tmp}/store", sweep_topic=topic,
                 notice_budget_seconds=BUDGET, heartbeat_seconds=30)
    # The agent restarted (SIGHUP, as on an upgrade) late in the run adopts the trainer and has it save at once.
    booted = time.time() - 1000
    agent = _boot(agent_env, "late-1", s, "4000", RESPAWN_BOOT_TIME=str(booted))
    wait_for(lambda: _stepping(agent), 30, "the trainer stepping")
    assert _said(agent, "flex-start run: its end is known")["acts_in_s"] > 2900
    agent.proc.send_signal(signal.SIGHUP)
    assert agent.wait(15) == EXIT_AGENT_DETACH
    booted -= 3000 - 20  # now 20 s before the end: inside the budget and the margin
    agent = agent_env.agent(agent_env.metadata("late-1b", {**attributes("late", 1, agent_env.project, s),
                                                          ATTR_RUN_SECONDS: "4000"}),
                            agent_env.tmp / "late-1", RESPAWN_BOOT_TIME=str(booted))
    assert agent.wait(BUDGET + 15) == 0
    known = _said(agent, "flex-start run: its end is known")
    assert known["acts_in_s"] == 0 and known["boot_from"] == "RESPAWN_BOOT_TIME"
    assert _said(agent, "adopting the trainer") is not None
    assert 15 <= _said(agent, "flex-start run: its end is near; acting")["seconds_to_end"] <= 21
    hb = agent_env.heartbeat("late-1")
    assert (hb["state"], hb["notice"], hb["exit_code"]) == ("exited", NOTICE_RUN_ENDING, EXIT_PREEMPTED)
    assert hb["emergency"]["state"] == "committed"
    assert [(m["notice"]["node"], m["notice"]["kind"]) for m in pull()] == [("late-1", NOTICE_RUN_ENDING)]
    # A fresh node already past its acting time (its end past, even) starts nothing.
    agent = _boot(agent_env, "past-1", s, "900", RESPAWN_BOOT_TIME=str(time.time() - 1000))
    assert agent.wait(30) == 0
    assert agent.trainer_record() is None and _said(agent, "preparation finished") is None
    hb = agent_env.heartbeat("past-1")
    assert (hb["state"], hb["notice"], hb["exit_code"]) == ("exited", NOTICE_RUN_ENDING, None)
    assert [(m["notice"]["node"], m["notice"]["kind"]) for m in pull()] == [("past-1", NOTICE_RUN_ENDING)]


def test_a_reservation_bound_node_saves_and_stops_before_its_reservations_end(agent_env, sweep):
    # respawn-run-ends-at is a wall-clock end (a calendar reservation's), whatever the VM's boots: the agent acts a
    # budget and a margin before it, as on a flex-start run's end.
    topic, pull = sweep
    s = settings([sys.executable, str(agent_env.tiny_trainer)], f"file://{agent_env.tmp}/store", sweep_topic=topic,
                 notice_budget_seconds=BUDGET, heartbeat_seconds=30)
    ends = datetime.now(timezone.utc) + timedelta(seconds=8 + BUDGET + RUN_END_MARGIN_S)
    agent = _boot(agent_env, "rb-1", s, None, ends_at=ends.isoformat().replace("+00:00", "Z"))
    known = wait_for(lambda: _said(agent, "reservation-bound run: its end is known"), 30, "the end logged")
    assert abs(datetime.fromisoformat(known["run_ends_at"]) - ends) < timedelta(seconds=2)
    [message] = wait_for(pull, 30, "the run-ending notice on the sweep topic")
    assert (message["notice"]["node"], message["notice"]["kind"]) == ("rb-1", NOTICE_RUN_ENDING)
    assert agent.wait(BUDGET + 15) == 0
    hb = agent_env.heartbeat("rb-1")
    assert (hb["state"], hb["notice"], hb["exit_code"]) == ("exited", NOTICE_RUN_ENDING, EXIT_PREEMPTED)
    assert hb["emergency"]["state"] == "committed"
    # A malformed end is the attribute's configuration error, in one line.
    agent = _boot(agent_env, "rb-2", s, None, ends_at="2026-12-20 00:00")
    assert agent.wait(30) == EXIT_CONFIG_ERROR
    [error] = [e for e in agent.events() if e["severity"] == "ERROR"]
    assert error["attribute"] == ATTR_RUN_ENDS_AT and "RFC 3339 time with its offset" in error["message"]


def test_a_node_whose_setup_failed_has_nothing_to_save_at_its_end(agent_env, sweep):
    topic, pull = sweep
    s = settings([sys.executable, str(agent_env.tiny_trainer)], f"file://{agent_env.tmp}/store", sweep_topic=topic,
                 notice_budget_seconds=BUDGET, setup=[["python", "-c", "import sys; sys.exit(4)"]],
                 interpreter=sys.executable)
    agent = _boot(agent_env, "sf-1", s, "1000", RESPAWN_BOOT_TIME=str(time.time() - 1000 + BUDGET + RUN_END_MARGIN_S
                                                                      + 4))
    wait_for(lambda: _said(agent, "flex-start run: its end is near"), 30, "the run's end reached")
    said = _said(agent, "flex-start run: its end is near")
    assert said["message"].endswith("nothing to save") and said["state"] == "setup-failed"
    time.sleep(1.0)
    assert agent.proc.poll() is None  # it stays up, heartbeating its failure until the VM goes
    hb = agent_env.heartbeat("sf-1")
    assert (hb["state"], hb["notice"], hb["exit_code"]) == ("setup-failed", None, 4)
    assert pull() == [{"task": "sweep", "job_id": "sf"}]  # the failure's wake-up, no notice


def test_a_malformed_run_duration_is_a_configuration_error(agent_env):
    s = settings([sys.executable, str(agent_env.tiny_trainer)], f"file://{agent_env.tmp}/store")
    for i, value in enumerate(["90m", "0"]):
        agent = _boot(agent_env, f"bad-{i + 1}", s, value)
        assert agent.wait(30) == EXIT_CONFIG_ERROR
        [error] = [e for e in agent.events() if e["severity"] == "ERROR"]
        assert error["attribute"] == ATTR_RUN_SECONDS
        assert error["message"] == (f"metadata attribute {ATTR_RUN_SECONDS}: must be a positive whole number of "
                                    f"seconds (the VM's run duration), got {value!r}")
        assert agent.trainer_record() is None
