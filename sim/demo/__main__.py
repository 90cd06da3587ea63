"""`python -m sim.demo` (what `respawn demo` runs from a checkout): the whole flow on this machine."""

from __future__ import annotations

import json
import re
import secrets
import shlex
import signal
import sys
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from respawn.app.cli import CliError, err, run_reporting_errors
from sim.demo.jobfile import read_job, with_job_file
from sim.demo.live import LiveView
from sim.demo.runner import PROJECT, DemoError, DemoRun
from sim.demo.scenario import ScenarioError, default_scenario, load_scenario
from sim.emulators import EmulatorError

PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")  # Google Cloud's rule for a project ID
SUMMARY_ROWS = ("job_id", "state", "expected_state", "message", "final_step", "total_steps", "restarts", "zones",
                "provisioning", "lost_steps",
                "max_live_nodes", "recovery_seconds", "wall_seconds", "goodput", "cost", "timeline", "logs")


def demo(
    scenario: Optional[Path] = typer.Option(
        None, "--scenario", help="a scenario YAML (see examples/scenarios/): zones, preemptions, faults, the expected "
                                 "end; default: a PyTorch job over three zones, preempted twice (default.yaml)"),
    job_file: Optional[Path] = typer.Option(
        None, "--job", help="run your own job spec (as for `respawn jobs register`: its trainer.workdir directory "
                            "packed and uploaded, its setup and command as written) instead of the demo's example; "
                            "the scenario's zones and preemptions, its checkpoints under --out"),
    keep: bool = typer.Option(False, "--keep", help="when the job ends, leave the emulators, functions and sim "
                              "running and print the `export` lines that point `respawn jobs describe/events/logs/"
                              "report` at them; Ctrl-C stops everything"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="where logs, summary.json and timeline.html go"),
    firestore_emulator: Optional[str] = typer.Option(
        None, "--firestore-emulator", metavar="HOST:PORT",
        help="use the Firestore emulator already running there (e.g. \"$FIRESTORE_EMULATOR_HOST\") instead of "
             "starting one: the demo writes under its --project only, deletes that project's documents at the end "
             "and leaves the emulator running"),
    pubsub_emulator: Optional[str] = typer.Option(
        None, "--pubsub-emulator", metavar="HOST:PORT",
        help="the same for the Pub/Sub emulator: the project's topics and subscriptions are deleted at the end"),
    project: Optional[str] = typer.Option(
        None, "--project", help=f"the project the demo's documents, topics and subscriptions belong to; default: "
                                f"{PROJECT} on the demo's own emulators, a new respawn-demo-<8 hex digits> per run on "
                                "emulators given above, so that runs sharing them never meet"),
    as_json: bool = typer.Option(False, "--json", help="end stdout with one JSON object: the summary"),
    live: bool = typer.Option(True, "--live/--no-live", help="the live terminal view (plain lines when not a terminal)"),
) -> None:
    """Run the whole flow on this machine: emulators, sim, real functions, agents and trainers.

    Your own job: respawn demo --job examples/jobs/gpu-spot-small.yaml --keep"""

    def go() -> None:
        shared = firestore_emulator or pubsub_emulator
        run_project = project or (f"respawn-demo-{secrets.token_hex(4)}" if shared else PROJECT)
        if not PROJECT_ID.fullmatch(run_project):
            raise CliError(f"--project {run_project!r} is not a project ID: 6 to 30 lowercase letters, digits and "
                           "hyphens, starting with a letter", code=2)
        try:
            sc = load_scenario(scenario) if scenario else default_scenario()
            job = None
            if job_file is not None and "trainer" in sc.model_fields_set:
                err.print(f"note: the scenario's trainer settings are the demo example's: {job_file} runs its own "
                          "command", markup=False, highlight=False)
            if job_file is not None or sc.job_file is not None:
                job = read_job(job_file or Path(sc.job_file))  # type: ignore[arg-type]
                sc = with_job_file(sc, job)
        except ScenarioError as exc:
            raise CliError(str(exc), code=2) from None
        # Absolute from here on: the nodes, the sim and the functions run with working directories of their own.
        run_name = f"{job.id}-{sc.name}" if job else sc.name
        base = (out_dir or Path("respawn-demo-out") / f"{run_name}-{datetime.now():%Y%m%d-%H%M%S}").resolve()
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a regular file on the way, no permission
            raise CliError(f"--out {base}: cannot make that folder ({exc.strerror}): give a folder that exists or "
                           "can be made", code=2) from None
        # The run's checkpoints go to OUT/checkpoints: an earlier run's there would be resumed, not trained.
        earlier = [name for name in ("checkpoints", "summary.json") if (base / name).exists()]
        if earlier:
            raise CliError(f"--out {base}: an earlier run's output is there ({', '.join(earlier)}), and this run would "
                           "resume its checkpoints: give a new folder, or remove that one", code=2)
        view = LiveView(enabled=live and not as_json)

        def on_term(signum, frame):
            raise KeyboardInterrupt

        # Ctrl-C stops everything even where SIGINT came in ignored (a shell's background job, some CI runners).
        previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, on_term),
                    signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
        problem = None
        try:
            with view:
                view.say(f"scenario {sc.name}: {sc.description or 'no description'}"
                         + (f"; job {job.path}" if job else "") + f"; output in {base}")
                run = DemoRun(sc, base, on_progress=view.update, say=view.say, job=job, project=run_project,
                              firestore_host=firestore_emulator, pubsub_host=pubsub_emulator)
                result = run.run(keep=keep)
            try:
                problem = _unexpected(sc, result)
                if keep:
                    result["kept"] = {"env": run.cli_env, "pids": run.pids()}
                _print_summary(sc, result)
                if keep:
                    _say_how_to_reach(run, result)
                if as_json:
                    print(json.dumps(result), flush=True)
                if keep:
                    _wait_then_stop(run)
            finally:
                run.close()  # stopped already unless kept (a second close stops nothing)
        except (DemoError, EmulatorError) as exc:
            raise CliError(f"demo failed: {exc}") from None
        except KeyboardInterrupt:
            raise CliError("demo interrupted; everything it started has been stopped", code=130) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if problem:
            raise CliError(problem)

    run_reporting_errors(go)


def _unexpected(sc, result: dict) -> str | None:
    """How the run's end differs from what the scenario expects; None when it does not."""
    if result["state"] != result["expected_state"]:
        return f"the job ended {result['state']}, the scenario expected {result['expected_state']}"
    if sc.expect.provisioning is not None and result["provisioning"] != sc.expect.provisioning:
        return (f"the job's nodes ran on {', '.join(result['provisioning']) or 'nothing'}, the scenario expected "
                f"{', '.join(sc.expect.provisioning)}")
    return None


def _print_summary(sc, result: dict) -> None:
    table = Table("", "", title=f"respawn demo: {sc.name}", show_header=False)
    for key in SUMMARY_ROWS:
        value = result[key]
        table.add_row(key, ", ".join(map(str, value)) if isinstance(value, list) else str(value))
    for text in result["alerts"]:
        table.add_row("Slack", text)
    err.print(table)


def _say_how_to_reach(run: DemoRun, result: dict) -> None:
    """--keep: the lines that point `respawn jobs …` in another shell at the stand-ins, plain, to copy."""
    job = result["job_id"]
    lines = ["demo: --keep: the emulators, functions and sim go on. In another shell, point respawn at them:",
             *(f"export {k}={shlex.quote(v)}" for k, v in run.cli_env.items()),
             f"respawn jobs describe {job}; respawn jobs events {job}; respawn jobs logs {job}; "
             f"respawn jobs report {job}",
             f"demo: Ctrl-C stops everything (processes {' '.join(map(str, result['kept']['pids']))}, and the sim)."]
    print("\n".join(lines), file=sys.stderr, flush=True)


def _wait_then_stop(run: DemoRun) -> None:
    """--keep: wait for Ctrl-C (or SIGTERM), then stop everything the demo started, by PID."""
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the stopping short
        signal.signal(sig, signal.SIG_IGN)
    pids = run.pids()
    run.close()
    print(f"demo: stopped everything it started: {len(pids)} processes by PID, and the sim", file=sys.stderr,
          flush=True)


if __name__ == "__main__":
    app = typer.Typer(add_completion=False)
    app.command()(demo)
    app(prog_name="respawn demo")
