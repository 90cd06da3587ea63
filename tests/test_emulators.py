"""The emulator harness: clear failures when an emulator is missing, isolation between runs, clean stops."""

from __future__ import annotations

import os

import pytest

from sim import emulators


def test_missing_emulator_fails_with_install_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("RESPAWN_FIRESTORE_EMULATOR", str(tmp_path / "no-such-launcher"))
    with pytest.raises(emulators.EmulatorError) as info:
        emulators.start_firestore()
    assert "RESPAWN_FIRESTORE_EMULATOR" in str(info.value)


def test_not_installed_anywhere_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("RESPAWN_PUBSUB_EMULATOR", raising=False)
    monkeypatch.setattr(emulators, "SDK_ROOTS", [tmp_path])
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcloud, no java
    with pytest.raises(emulators.EmulatorError) as info:
        emulators.start_pubsub()
    assert "apt-get install google-cloud-cli-firestore-emulator google-cloud-cli-pubsub-emulator" in str(info.value)


def test_emulator_that_dies_at_start_reports_its_log(monkeypatch, tmp_path):
    launcher = tmp_path / "broken"
    launcher.write_text("#!/bin/sh\necho 'java.lang.OutOfMemoryError' >&2\nexit 3\n")
    launcher.chmod(0o755)
    monkeypatch.setenv("RESPAWN_FIRESTORE_EMULATOR", str(launcher))
    with pytest.raises(emulators.EmulatorError) as info:
        emulators.start_firestore(timeout=20)
    assert "exited with code 3" in str(info.value) and "OutOfMemoryError" in str(info.value)


def test_two_firestore_emulators_run_side_by_side_and_stop_completely(project, monkeypatch, capsys):
    import socket

    from google.cloud import firestore

    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Drespawn.caller=kept")
    # The first is given a port another process took after free_port() found it free (CI's parallel tests did, in
    # the seconds before the JVM binds): its JVM fails to bind and exits, and the harness starts it again on another
    # port (the Pub/Sub emulator's case, which lives on unbound, is the next test's).
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    real, ports = emulators.free_port, iter([port])
    monkeypatch.setattr(emulators, "free_port", lambda: next(ports, None) or real())
    try:
        first = emulators.start_firestore()
    finally:
        taken.close()
    monkeypatch.setattr(emulators, "free_port", real)
    second = emulators.start_firestore()
    try:
        assert first.host != f"127.0.0.1:{port}" and first.proc.poll() is None
        assert f"port {port} was taken before it bound it" in capsys.readouterr().err
        assert first.host != second.host
        # Each JVM runs with the harness's JIT options after the caller's own (the JVM says what it picked up).
        for emu in (first, second):
            said = emu.log_path.read_text()
            assert f"Picked up JAVA_TOOL_OPTIONS: -Drespawn.caller=kept {emulators.JVM_OPTIONS}" in said
        saved = os.environ.get("FIRESTORE_EMULATOR_HOST")
        try:
            os.environ["FIRESTORE_EMULATOR_HOST"] = first.host
            firestore.Client(project=project).collection("c").document("d").set({"where": "first"})
            os.environ["FIRESTORE_EMULATOR_HOST"] = second.host
            assert not firestore.Client(project=project).collection("c").document("d").get().exists
        finally:
            if saved is None:
                os.environ.pop("FIRESTORE_EMULATOR_HOST", None)
            else:
                os.environ["FIRESTORE_EMULATOR_HOST"] = saved
    finally:
        first.stop()
        second.stop()
    for emu in (first, second):
        with pytest.raises(ProcessLookupError):
            os.killpg(emu.proc.pid, 0)  # the whole group, java included, is gone


def test_firestore_is_empty_at_the_start_of_each_test(firestore_db):
    assert list(firestore_db.collection("leftover").stream()) == []
    firestore_db.collection("leftover").document("x").set({"v": 1})


def test_firestore_is_empty_again(firestore_db):
    assert list(firestore_db.collection("leftover").stream()) == []
    firestore_db.collection("leftover").document("x").set({"v": 1})


def test_a_port_taken_before_the_emulator_binds_it_is_replaced_by_another(monkeypatch, capsys):
    # free_port() finds a port free, then the JVM binds it seconds later: another process may take it in between
    # (CI's parallel tests did). The emulator then fails to bind; the harness starts it again on another port. The
    # Pub/Sub emulator lives on unbound (Firestore's, which exits: the side-by-side test above).
    import socket

    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    real, ports = emulators.free_port, iter([port])
    monkeypatch.setattr(emulators, "free_port", lambda: next(ports, None) or real())
    try:
        emu = emulators.start_pubsub()
    finally:
        taken.close()
    try:
        assert emu.host != f"127.0.0.1:{port}" and emu.proc.poll() is None
        assert f"port {port} was taken before it bound it" in capsys.readouterr().err
    finally:
        emu.stop()


def test_stop_groups_ends_every_group_and_kills_one_that_ignores_sigterm():
    import subprocess

    polite = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; echo ready; sleep 60 & wait; sleep 60"],
                                stdout=subprocess.PIPE, start_new_session=True)
    assert stubborn.stdout.readline() == b"ready\n"  # its trap is set: a TERM sent before would end it (-15)
    done = subprocess.Popen(["true"], start_new_session=True)
    done.wait()
    emulators.stop_groups([polite, stubborn, done], timeout=2)
    stubborn.stdout.close()
    assert [p.returncode for p in (polite, stubborn, done)] == [-15, -9, 0]
    assert not any(emulators.group_alive(p.pid) for p in (polite, stubborn))  # the sleeps too, not only the shells


def test_a_shared_pubsub_emulator_is_emptied_one_project_at_a_time(pubsub_emulator):
    """What a demo on the session's emulators deletes on its way out is its own project's, never another's."""
    from google.cloud import pubsub_v1

    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    for project in ("demo-test-mine", "demo-test-other"):
        topic = publisher.create_topic(name=publisher.topic_path(project, "respawn-sweep")).name
        subscriber.create_subscription(name=subscriber.subscription_path(project, "respawn-on-sweep-push"), topic=topic)
    for kind in ("subscriptions", "topics"):
        emulators.delete_pubsub(pubsub_emulator, "demo-test-mine", kind)
    assert list(publisher.list_topics(project="projects/demo-test-mine")) == []
    assert list(subscriber.list_subscriptions(project="projects/demo-test-mine")) == []
    assert [t.name for t in publisher.list_topics(project="projects/demo-test-other")] == [
        "projects/demo-test-other/topics/respawn-sweep"]
    assert [s.name for s in subscriber.list_subscriptions(project="projects/demo-test-other")] == [
        "projects/demo-test-other/subscriptions/respawn-on-sweep-push"]
    for kind in ("subscriptions", "topics"):
        emulators.delete_pubsub(pubsub_emulator, "demo-test-other", kind)


def test_an_emulator_given_by_address_must_answer_there():
    with pytest.raises(emulators.EmulatorError, match=r"no Firestore emulator answers at 127\.0\.0\.1:\d+"):
        emulators.check_running("Firestore", f"127.0.0.1:{emulators.free_port()}")
    with pytest.raises(emulators.EmulatorError, match="is not HOST:PORT"):
        emulators.check_running("Pub/Sub", "http://127.0.0.1:8085")
