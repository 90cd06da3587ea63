"""`python -m sim.demo` (what `respawn demo` runs from a checkout): the whole flow on this machine."""

from __future__ import annotations

import json
import signal
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from respawn.cli import CliError, err, run_reporting_errors
from sim.demo.live import LiveView
from sim.demo.runner import DemoError, DemoRun
from sim.demo.scenario import ScenarioError, default_scenario, load_scenario
from sim.emulators import EmulatorError

SUMMARY_ROWS = ("job_id", "state", "expected_state", "message", "final_step", "total_steps", "restarts", "zones",
                "provisioning", "lost_steps",
                "max_live_nodes", "notice_to_step_seconds", "wall_seconds", "goodput", "cost", "timeline", "logs")


def demo(
    scenario: Optional[Path] = typer.Option(None, "--scenario", help="a scenario YAML (see examples/scenarios/)"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="where logs, summary.json and timeline.html go"),
    as_json: bool = typer.Option(False, "--json", help="end stdout with one JSON object: the summary"),
    live: bool = typer.Option(True, "--live/--no-live", help="the live terminal view (plain lines when not a terminal)"),
) -> None:
    """Run the whole flow on this machine: emulators, sim, real functions, agents and trainers."""

    def go() -> None:
        try:
            sc = load_scenario(scenario) if scenario else default_scenario()
        except ScenarioError as exc:
            raise CliError(str(exc), code=2) from None
        # Absolute from here on: the nodes, the sim and the functions run with working directories of their own.
        base = (out_dir or Path("respawn-demo-out") / f"{sc.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}").resolve()
        base.mkdir(parents=True, exist_ok=True)
        view = LiveView(enabled=live and not as_json)

        def on_term(signum, frame):
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, on_term)
        try:
            with view:
                view.say(f"scenario {sc.name}: {sc.description or 'no description'}; output in {base}")
                result = DemoRun(sc, base, on_progress=view.update, say=view.say).run()
        except (DemoError, EmulatorError) as exc:
            raise CliError(f"demo failed: {exc}") from None
        except KeyboardInterrupt:
            raise CliError("demo interrupted; everything it started has been stopped", code=130) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
        table = Table("", "", title=f"respawn demo: {sc.name}", show_header=False)
        for key in SUMMARY_ROWS:
            value = result[key]
            table.add_row(key, ", ".join(map(str, value)) if isinstance(value, list) else str(value))
        for text in result["alerts"]:
            table.add_row("Slack", text)
        err.print(table)
        if as_json:
            print(json.dumps(result))
        if result["state"] != result["expected_state"]:
            raise CliError(f"the job ended {result['state']}, the scenario expected {result['expected_state']}")
        if sc.expect.provisioning is not None and result["provisioning"] != sc.expect.provisioning:
            raise CliError(f"the job's nodes ran on {', '.join(result['provisioning']) or 'nothing'}, the scenario "
                           f"expected {', '.join(sc.expect.provisioning)}")

    run_reporting_errors(go)


if __name__ == "__main__":
    app = typer.Typer(add_completion=False)
    app.command()(demo)
    app(prog_name="respawn demo")
