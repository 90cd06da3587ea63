"""`python -m sim.demo` (what `respawn demo` runs from a checkout): the whole flow on this machine."""

from __future__ import annotations

import itertools
import json
import os
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

from respawn.app.cli import CliError, command, err, run_reporting_errors
from sim.demo.jobfile import read_job, with_job_file
from sim.demo.live import LiveView
from sim.demo.runner import PROJECT, DemoError, DemoRun
from sim.demo.scenario import ScenarioError, default_scenario, load_scenario
from sim.emulators import EmulatorError

PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")  # Google Cloud's rule for a project ID
SUMMARY_ROWS = ("job_id", "state", "expected_state", "message", "final_step", "total_steps", "restarts", "zones",
                "provisioning", "lost_steps",
                "max_live_nodes", "recovery_seconds", "wall_seconds", "goodput", "cost", "summary", "report",
                "describe",
                "logs")


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
    out_dir: Optional[Path] = typer.Option(None, "--out", help="where logs.txt, summary.json and report.html go"),
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
        run_name = f"{job.id}-{sc.name}" if job else sc.name
        base = claim_output(out_dir, run_name)
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
                if result.get("interrupted"):  # stopped already, the record of what ran written: say where
                    _print_summary(sc, result)
                    if as_json:
                        print(json.dumps(result), flush=True)
                    raise CliError(f"demo {problem}; everything it started has been stopped; {_kept_where(base)}",
                                   code=130)
                if keep:
                    result["kept"] = {"env": run.standins.cli_env, "pids": run.pids()}
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
            raise CliError(f"demo failed: {exc}; {_kept_where(base)}") from None
        except KeyboardInterrupt:
            raise CliError(f"demo interrupted; everything it started has been stopped; {_kept_where(base)}",
                           code=130) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if problem:
            raise CliError(f"{problem}; the record is in {base}")

    run_reporting_errors(go)


# Marks a folder as one run's (claim_output): a second run refuses it, even one started in the same instant.
CLAIM = ".respawn-demo-run"


def claim_output(out_dir: Path | None, run_name: str) -> Path:
    """The run's own output folder, absolute (the nodes, the sim and the functions run in folders of their own), made
    or claimed atomically so that no other run can take it: by default a new folder under ./respawn-demo-out named
    for the run and the time (another suffix -2, -3… where a run started in the same second took that name); with
    --out, a new or empty folder, claimed by creating its CLAIM file exclusively. Raises CliError."""
    if out_dir is None:
        parent = Path("respawn-demo-out").resolve()
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CliError(f"cannot make {parent} ({exc.strerror}): give --out a folder that can be made",
                           code=2) from None
        stamp = f"{run_name}-{datetime.now():%Y%m%d-%H%M%S}"
        for n in itertools.count(1):
            base = parent / (stamp if n == 1 else f"{stamp}-{n}")
            try:
                os.mkdir(base)  # atomic: exactly one run makes each name
            except FileExistsError:
                continue
            except OSError as exc:
                raise CliError(f"cannot make {base} ({exc.strerror}): give --out a folder that can be made",
                               code=2) from None
            _claim(base)
            return base
    base = out_dir.resolve()
    if base.exists() and not base.is_dir():
        raise CliError(f"--out {base} is a file: give a folder (a new or empty one)", code=2)
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
    _claim(base)
    return base


def _claim(base: Path) -> None:
    try:
        fd = os.open(base / CLAIM, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise CliError(f"--out {base}: another demo run has taken that folder ({CLAIM} is there): give a new one",
                       code=2) from None
    except OSError as exc:
        raise CliError(f"--out {base}: cannot write there ({exc.strerror}): give a folder you may write",
                       code=2) from None
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")


def _kept_where(base: Path) -> str:
    """Where what the run left is: its record (summary, report, logs) once written, else its parts' logs."""
    if (base / "summary.json").exists():
        return f"what it ran is recorded in {base} (summary.json, report.html, logs.txt)"
    return f"the logs of what it started are in {base}"


def _unexpected(sc, result: dict) -> str | None:
    """How the run's end differs from what the scenario expects; None when it does not. A run that missed the
    scenario's preemptions, or trained nothing where it had steps to train (say, it resumed a finished run's
    checkpoint), showed nothing of what the scenario is for: not a success either."""
    if result.get("interrupted"):
        return f"interrupted at {result['wall_seconds']:.0f} s (the job {result['state']})"
    if result["state"] != result["expected_state"]:
        if result.get("timed_out"):
            return (f"the job did not end within the scenario's {sc.timeout_seconds:g} s (it was {result['state']}), "
                    f"the scenario expected {result['expected_state']}")
        return f"the job ended {result['state']}, the scenario expected {result['expected_state']}"
    if result.get("preemptions_missed"):
        return (f"the job ended {result['state']} before {len(result['preemptions_missed'])} of the scenario's "
                f"preemptions ({', '.join(result['preemptions_missed'])}): the run did not show what it is for")
    if result["state"] == "SUCCEEDED" and result.get("total_steps") and not result.get("goodput"):
        return (f"the job ended SUCCEEDED with goodput 0: it trained none of its {result['total_steps']} steps in "
                "this run (it resumed a finished run's checkpoint?)")
    if sc.expect.provisioning is not None and result["provisioning"] != sc.expect.provisioning:
        return (f"the job's nodes ran on {', '.join(result['provisioning']) or 'nothing'}, the scenario expected "
                f"{', '.join(sc.expect.provisioning)}")
    return None


def _print_summary(sc, result: dict) -> None:
    """The summary on stderr: a table on a terminal; elsewhere (a pipe, a file, CI) a line a row, each whole, as a
    table cut to an 80-column guess would cut the paths to the record."""
    rows = [(key, ", ".join(map(str, value)) if isinstance(value, list) else str(value))
            for key, value in ((k, result[k]) for k in SUMMARY_ROWS if k in result)]
    rows += [("Slack", text) for text in result.get("alerts") or []]
    if not err.is_terminal:
        print("\n".join([f"respawn demo: {sc.name}", *(f"  {key}: {value}" for key, value in rows)]),
              file=sys.stderr, flush=True)
        return
    table = Table("", "", title=f"respawn demo: {sc.name}", show_header=False)
    for key, value in rows:
        table.add_row(key, value)
    table.columns[1].overflow = "fold"  # a path too long for the terminal goes on, on the next line
    err.print(table)


def _say_how_to_reach(run: DemoRun, result: dict) -> None:
    """--keep: the lines that point `respawn jobs …` in another shell at the stand-ins, plain, to copy."""
    job = result["job_id"]
    lines = ["demo: --keep: the emulators, functions and sim go on. In another shell, point respawn at them:",
             *(f"export {k}={shlex.quote(v)}" for k, v in run.standins.cli_env.items()),
             "; ".join(f"{command()} jobs {what} {job}" for what in ("describe", "events", "logs", "report")),
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
