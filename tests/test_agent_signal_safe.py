"""The agent's main-loop event under signals: a handler that sets it while the main thread is inside its wait() or
clear() must not block (node_agent/signal_safe.py). Run in a process of its own, a storm of signals against a loop
that waits and clears as the agent's does; threading.Event blocks in it (or nests handlers until RecursionError)."""

from __future__ import annotations

import subprocess
import sys

STORM = """
import importlib, os, signal, sys, threading, time

module, _, name = sys.argv[1].partition(":")
event = getattr(importlib.import_module(module), name)()
handled, done = [0], []

def on_signal(*_):
    handled[0] += 1
    event.set()

signal.signal(signal.SIGUSR1, on_signal)

def storm():
    for _ in range(int(sys.argv[2])):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.0001)
    done.append(True)
    event.set()

threading.Thread(target=storm, daemon=True).start()
while not done:  # the agent's main loop, waiting and clearing
    event.wait(0)  # a busy loop: nearly every handler runs inside wait() or clear()
    event.clear()
print(handled[0])
"""


def storm(event: str, signals: int) -> subprocess.CompletedProcess:
    """`signals` SIGUSR1s, each setting `event` (module:class), against a loop that waits on it and clears it."""
    return subprocess.run([sys.executable, "-c", STORM, event, str(signals)], capture_output=True, text=True,
                          timeout=60)


def test_a_signal_handled_inside_the_agents_wait_or_clear_does_not_block_it():
    # threading.Event fails this at once, each of five tries: RecursionError, or blocked until the timeout.
    out = storm("respawn.agent.signal_safe:SignalSafeEvent", 500)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) >= 10  # handlers ran (signals that come while one is pending merge into it)
