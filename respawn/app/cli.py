"""The `respawn` command line: register and inspect jobs in Firestore (a real project, or the emulator)."""

from __future__ import annotations

import json
import os
import sys
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import typer
import typer.core
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from respawn import deployment, schema
from respawn.logs import one_line

from .selftest_run import TIMEOUT_S as SELFTEST_TIMEOUT_S
from .workdir import GCS_PREFIX, PackedWorkdir, WorkdirError, human_bytes, pack, workdir_uri

class _Commands(typer.core.TyperGroup):
    """The top-level commands; a `jobs` subcommand given at the top (`respawn validate`) is pointed at."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name and self.get_command(ctx, name) is None:
            jobs = self.get_command(ctx, "jobs")
            if jobs is not None and jobs.get_command(ctx, name) is not None:
                say("error", f"no command {name!r} at the top: it is `{command()} jobs {name}`")
                raise typer.Exit(2)
        return super().resolve_command(ctx, args)


# Plain help (click's): Rich's option tables cut long option names at 80 columns (--checkpoint-interval-m…).
app = typer.Typer(cls=_Commands, no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Respawn: hands-off training on Spot GPUs and TPUs.")
jobs_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Register and inspect jobs.")
app.add_typer(jobs_app, name="jobs")

# Piped output keeps whole table rows rather than an 80-column guess. No Rich markup: what is printed (paths, specs,
# errors, table cells) is printed as written, `[...]` included; styles are given as Text (say, Text.assemble).
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200, markup=False)
err = Console(stderr=True, soft_wrap=True, markup=False)

ProjectOpt = typer.Option(None, "--project", envvar="GOOGLE_CLOUD_PROJECT", help="Google Cloud project (default: ADC's)")
# Packing and uploading show progress above this many bytes.
PROGRESS_MIN_BYTES = 8 * 1024 * 1024
FOLLOW_POLL_S = 2.0  # `jobs logs --follow`: how often the job's log chunks are listed again
SweepTopicOpt = typer.Option(deployment.SWEEP_TOPIC, "--sweep-topic", help="Pub/Sub topic the controller's sweep listens on")


def command() -> str:
    """`respawn` as the user can run it again from here: the name alone where PATH finds this same program, else its
    path (`.venv/bin/respawn`, as the README's first command leaves it), or `python -m respawn`. The demo, which runs
    as `python -m sim.demo`, is told how respawn was started (RESPAWN_COMMAND)."""
    import shlex
    import shutil

    given = os.environ.get("RESPAWN_COMMAND")
    if given:
        return given
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "respawn"
    if os.path.basename(argv0) == "__main__.py":  # python -m respawn
        return f"{shlex.quote(_short(sys.executable))} -m respawn"
    found = shutil.which(os.path.basename(argv0))
    try:
        if found and os.path.samefile(found, argv0 if os.sep in argv0 else found):
            return os.path.basename(argv0)
    except OSError:
        pass
    return shlex.quote(_short(argv0))


def _short(path: str) -> str:
    """A path relative to the working directory when it lies under it (with ./ where it would read as a bare
    name), else absolute."""
    full = os.path.abspath(path)
    rel = os.path.relpath(full)
    if rel.startswith(os.pardir):
        return full
    return rel if os.sep in rel else f".{os.sep}{rel}"


def say(label: str, text: str) -> None:
    """One line (or a short list) on stderr: "error: …" in red, "warning: …" or "note: …" in yellow."""
    err.print(Text.assemble((f"{label}:", "red" if label == "error" else "yellow"), " ", text), highlight=False)


class CliError(Exception):
    """A failure the user can act on: printed without a traceback."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _store(project: str | None):
    """The job store (imported here: `respawn --help` and `jobs validate` load no Google client)."""
    from .jobstore import JobStore, StoreError

    try:
        return JobStore.open(project)
    except StoreError as exc:
        raise CliError(str(exc)) from None


def _no_such_job(job_id: str) -> CliError:
    return CliError(f"no job {job_id!r}; `{command()} jobs list` shows the registered jobs")


def _read_spec_data(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", code=2) from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8 text (byte {exc.start}): give a YAML or JSON job spec", code=2) from None
    try:
        data = yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        raise CliError(f"{path} is neither valid YAML nor JSON: {yaml_problem(exc, path)}", code=2) from None
    if data is None:
        raise CliError(f"{path} is empty: a job spec is a mapping of fields (docs/job-spec.md)", code=2)
    return data


def yaml_problem(exc: yaml.YAMLError, path: Path) -> str:
    """PyYAML's own words (line, column, the line with a caret under the spot, what it expected), naming the file
    instead of "<unicode string>"."""
    for mark in (getattr(exc, "context_mark", None), getattr(exc, "problem_mark", None)):
        if mark is not None:
            mark.name = str(path)
    return str(exc)


def _parse_spec(path: Path, data: Any, live: Any = None) -> schema.JobSpec:
    """The spec, valid, its nodes within the platform's limits (the control plane's admission check) and naming only
    what exists (respawn.catalog: the offline catalog, or `live`'s answers from the APIs where it has them)."""
    from respawn import catalog
    from respawn.control import composition

    try:
        spec = composition.admit(data)
        missing = catalog.problems(spec, live)
        if missing:
            raise schema.SpecError(missing)
    except schema.SpecError as exc:
        raise CliError(f"{path}: {exc}", code=2) from None
    for line in schema.deprecations(data):
        say("warning", f"{path}: {line}")
    return spec


def _live_catalog(project: str | None) -> Any:
    """The APIs' answers to what exists (respawn.app.catalogcheck), or None where none can be asked (then the offline
    catalog alone decides, and a note says why)."""
    from .catalogcheck import live

    answer, why = live(project)
    if why:
        say("note", f"machine types, GPUs and TPU types checked against the offline catalog only ({why})")
    return answer


def _fmt_time(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    return "" if value is None else str(value)


def run_reporting_errors(fn, *args) -> None:
    try:
        fn(*args)
    except CliError as exc:
        say("error", str(exc))
        raise typer.Exit(exc.code) from None
    except Exception as exc:  # a cloud error: name it, without a traceback
        from .jobstore import NoSuchJob, is_api_error, is_unanswered

        if isinstance(exc, NoSuchJob):
            say("error", str(_no_such_job(str(exc))))
            raise typer.Exit(1) from None
        if is_unanswered(exc):  # it answered the probe, then a call ran past its deadline (or was refused)
            from .endpoints import FIRESTORE, late, unanswered

            said = f"{late()}: {one_line(exc, 200)}"
            say("error", unanswered(FIRESTORE, said, os.environ.get("GOOGLE_CLOUD_PROJECT")))
            raise typer.Exit(1) from None
        if is_api_error(exc):
            say("error", f"Firestore call failed: {one_line(exc, 500)}")
            raise typer.Exit(1) from None
        raise


@jobs_app.command("register")
def register(
    file: Path = typer.Argument(..., help="job spec, YAML or JSON"),
    workdir: Optional[Path] = typer.Option(
        None, "--workdir", help="pack this directory (minus .git/ and what .gitignore and .respawnignore exclude), "
                                "upload it to the checkpoint bucket and set trainer.workdir to it"),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and pack only: upload and register nothing"),
    project: Optional[str] = ProjectOpt,
) -> None:
    """Validate a job spec and write it to Firestore. Refuses to overwrite an existing job. A trainer.workdir that
    is a directory (relative to the spec file), or --workdir, is packed and uploaded first, and its URI recorded."""

    def go() -> None:
        data = _read_spec_data(file)
        trainer, written = _trainer_workdir(data)
        directory = workdir if workdir is not None else _local_workdir(file, written)
        live = _live_catalog(project)
        if directory is None:
            spec = _parse_spec(file, data, live)
            _check_image(spec, project)
            _check_network(spec, project)
            _check_quota(spec, project)
            spec = _pin_trainer_image(spec, trainer)
            if dry_run:
                out.print(Text.assemble(f"{file}: valid; would register ", (spec.id, "bold"),
                                        " (dry run: nothing written)"))
                return
            _register(_store(project), spec, file)
            return
        trainer.pop("workdir", None)  # replaced by the packed directory's URI, so not validated as written
        spec = _parse_spec(file, data, live)  # every other field, before anything is packed or sent
        _check_image(spec, project)
        _check_network(spec, project)
        _check_quota(spec, project)
        _pin_trainer_image(spec, trainer)  # into `trainer`, which the parse below reads again
        store = None
        if not dry_run:
            store = _store(project)
            _refuse_existing(store, spec.id)
        packed = _pack(directory)
        uri = workdir_uri(spec.checkpoint_uri, packed.sha256)
        if workdir is not None and written is not None and written != uri:
            say("note", f"--workdir replaces trainer.workdir of {file} ({written})")
        trainer["workdir"] = uri
        spec = _parse_spec(file, data, live)
        if store is None:
            out.print(Text.assemble(f"would upload {uri} and register ", (spec.id, "bold"),
                                    " with trainer.workdir set to it (dry run: nothing written)"), highlight=False)
            return
        from .codestore import CodeStoreError, upload

        with closing(_Meter(f"uploading {uri}")) as meter:
            try:
                sent = upload(packed, spec.checkpoint_uri, project, meter)
            except CodeStoreError as exc:
                raise CliError(str(exc)) from None
        out.print(("uploaded " if sent.sent else "already uploaded (same content): ") + uri, highlight=False)
        _register(store, spec, file)
        out.print(f"trainer.workdir: {uri} (sha256 {packed.sha256})", highlight=False)

    run_reporting_errors(go)


def _check_image(spec: schema.JobSpec, project: str | None) -> None:
    """Refuse a GPU job whose boot image Compute Engine does not have; a look that cannot be made blocks nothing
    (the controller looks again when it first handles the job, and the create's 404 says the same)."""
    if spec.accelerator.kind != "gpu":
        return
    from .imagecheck import check
    from respawn.images import ImageVerdict, missing_error

    found = check(spec.accelerator.boot_image, project)
    if found is None:
        return
    if found.verdict is ImageVerdict.MISSING:
        raise CliError(f"{spec.id}: {missing_error(found)}", code=2)
    if found.verdict is ImageVerdict.UNCHECKED:
        say("note", f"boot image {found.image} not checked ({found.detail}); the controller checks it when it first "
                    "handles the job")
    else:
        out.print(f"boot image: {found.image} → {found.detail}", highlight=False)


def _pin_trainer_image(spec: schema.JobSpec, trainer: dict | None) -> schema.JobSpec:
    """The spec with trainer.image pinned by digest (respawn.app.registry: the tag resolved, the image checked to
    exist and to run on the VMs' architecture), written into `trainer` too; a failure refuses the job (exit 2)."""
    if spec.trainer.image is None:
        return spec
    from .registry import RegistryError, pin

    try:
        pinned, found = pin(spec)
    except RegistryError as exc:
        raise CliError(f"{spec.id}: {exc}", code=2) from None
    out.print(f"trainer.image: {spec.trainer.image} → {found.pinned} ({', '.join(found.platforms)})", highlight=False)
    if trainer is not None:
        trainer["image"] = found.pinned
    return pinned


def _check_network(spec: schema.JobSpec, project: str | None) -> None:
    """Warn when a job of several hosts (GPU VMs, or a TPU slice's workers) would run where they cannot reach each
    other: the build's ingress rule is missing or disabled. Nothing is refused: the user's network may allow it."""
    from respawn.topology import tpu_hosts

    hosts = tpu_hosts(spec.accelerator.accelerator_type) if spec.accelerator.kind == "tpu" else spec.nodes
    if hosts < 2:
        return
    from .firewallcheck import missing_rule

    problem = missing_rule(project)
    if problem:
        say("warning", f"{spec.id} runs on {hosts} hosts; {problem}")


def _check_quota(spec: schema.JobSpec, project: str | None) -> None:
    """Refuse a GPU job that no listed zone's region has quota for on any tier it may use; warn about the rest
    (respawn.advice.quota_verdict). A look that cannot be made says one line and blocks nothing."""
    from .quotacheck import check

    verdict = check(spec, project)
    if verdict is None or not verdict.lines:
        return
    if verdict.refuse:
        raise CliError(f"{spec.id}: no quota for its GPUs in any listed zone's region:\n  " + "\n  ".join(verdict.lines),
                       code=2)
    for line in verdict.lines:
        say("warning", f"{spec.id} quota: {line}")


def _trainer_workdir(data: Any) -> tuple[dict | None, Any]:
    """The spec's trainer mapping (None when it is not one) and its workdir as written."""
    trainer = data.get("trainer") if isinstance(data, dict) else None
    if not isinstance(trainer, dict):
        return None, None
    return trainer, trainer.get("workdir")


def _local_workdir(file: Path, written: Any) -> Path | None:
    """trainer.workdir written as a directory — anything but a URI — relative to the spec file's folder."""
    if not isinstance(written, str) or not written or "://" in written:
        return None
    path = Path(written).expanduser()
    return path if path.is_absolute() else file.parent / path


def _register(store, spec: schema.JobSpec, file: Path) -> None:
    from .jobstore import JobExists

    try:
        store.register(spec.id, spec.to_doc(), source=str(file))
    except JobExists:
        raise _exists(spec.id) from None
    out.print(Text.assemble("registered ", (spec.id, "bold"),
                    f": {spec.accelerator.kind} {spec.provisioning} over {', '.join(spec.zones)}"))


def _exists(job_id: str) -> CliError:
    return CliError(f"job {job_id!r} already exists; pick another id (a finished job keeps its record)")


def _refuse_existing(store, job_id: str) -> None:
    """Refuse a taken job id before packing and uploading (register itself refuses it again, atomically)."""
    from .jobstore import NoSuchJob

    try:
        store.job_document(job_id)
    except NoSuchJob:
        return
    raise _exists(job_id)


class _Meter:
    """A progress callback (done, total) shown only for large transfers: a bar on a terminal, else a line at
    each quarter (for logs)."""

    def __init__(self, what: str):
        self.what = what
        self.bar = None
        self.task = None
        self.quarter = 0

    def __call__(self, done: int, total: int) -> None:
        if total < PROGRESS_MIN_BYTES:
            return
        if err.is_terminal:
            if self.bar is None:
                from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

                self.bar = Progress(TextColumn(self.what), BarColumn(), DownloadColumn(binary_units=True),
                                    TransferSpeedColumn(), console=err, transient=True)
                self.task = self.bar.add_task(self.what, total=total)
                self.bar.start()
            self.bar.update(self.task, completed=done)
            return
        quarter = done * 4 // total
        if quarter > self.quarter:
            self.quarter = quarter
            err.print(f"{self.what}: {human_bytes(done)} of {human_bytes(total)} ({quarter * 25}%)", highlight=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _pack(directory: Path) -> PackedWorkdir:
    with closing(_Meter(f"packing {directory}")) as meter:
        try:
            packed = pack(directory, meter)
        except WorkdirError as exc:
            raise CliError(str(exc), code=2) from None
    out.print(f"packed {directory}: {packed.files} files ({human_bytes(packed.scan.content_bytes)}) into "
              f"{human_bytes(packed.size)}, sha256 {packed.sha256}", highlight=False)
    warning = packed.size_warning()
    if warning:
        say("warning", warning)
    return packed


@jobs_app.command("pack")
def pack_cmd(
    directory: Path = typer.Argument(..., help="the directory --workdir would pack"),
    list_all: bool = typer.Option(False, "--list", help="every member: mode, size, path"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="also write the archive here"),
) -> None:
    """Pack a directory as `jobs register --workdir` would, and show what would be uploaded; sends nothing."""

    def go() -> None:
        packed = _pack(directory)
        out.print(f"object name: {packed.object_name} (in gs://BUCKET/{GCS_PREFIX}/ of the job's checkpoint bucket)",
                  highlight=False)
        if list_all:
            for m in packed.scan.members:
                shown = f"{m.path} -> {m.target}" if m.kind == "symlink" else m.path + ("/" if m.kind == "dir" else "")
                out.print(f"{m.mode:04o} {m.size:>12} {shown}", highlight=False)
        else:
            table = Table("top-level entry", "files", "bytes")
            for top, (count, size) in _by_top_entry(packed.scan.members).items():
                table.add_row(top, str(count), human_bytes(size))
            out.print(table)
        left = packed.scan.excluded
        if left:
            out.print(f"left out ({len(left)}): " + ", ".join(left[:10]) + (", …" if len(left) > 10 else ""),
                      highlight=False)
        if output is not None:
            try:
                output.write_bytes(packed.data)
            except OSError as exc:
                raise CliError(f"cannot write {output}: {exc.strerror}", code=2) from None
            out.print(f"archive written to {output}", highlight=False)

    run_reporting_errors(go)


def _by_top_entry(members) -> dict[str, tuple[int, int]]:
    """Files (and symlinks) and bytes under each top-level entry, a directory shown with a trailing "/"."""
    groups: dict[str, tuple[int, int]] = {}
    for m in members:
        head, sep, _ = m.path.partition("/")
        key = head + "/" if sep or m.kind == "dir" else head
        count, size = groups.get(key, (0, 0))
        groups[key] = (count + (m.kind != "dir"), size + m.size)
    return groups


@jobs_app.command("list")
def list_jobs(
    project: Optional[str] = ProjectOpt,
    as_json: bool = typer.Option(False, "--json", help="one JSON object per job"),
) -> None:
    """A table of jobs: id, state, zone, node, recoveries (failures, preemptions), last committed step, cost so far
    (and the same node time on demand), updated."""

    def go() -> None:
        rows = _store(project).job_statuses()
        if as_json:
            for job_id, status in rows:
                print(json.dumps({"id": job_id, **status.model_dump(mode="json")}))
            return
        if not rows:
            out.print("no jobs registered")
            return
        from respawn import ledger, prices

        now = datetime.now(timezone.utc)
        table = Table("id", "state", "zone", "node", "restarts", "failures", "preemptions", "committed step",
                      "cost (on demand)", "updated")
        for job_id, st in rows:
            usd, on_demand = ledger.spent(st, now)
            table.add_row(
                job_id, st.state.value, st.zone or "-", st.node or "-", str(st.restarts), str(st.failures),
                str(st.preemptions),
                "-" if st.last_committed_step is None else str(st.last_committed_step),
                f"{prices.usd(usd)} ({prices.usd(on_demand)})", _fmt_time(st.updated_at),
            )
        out.print(table)

    run_reporting_errors(go)


@jobs_app.command("describe")
def describe(job_id: str, project: Optional[str] = ProjectOpt,
             as_json: bool = typer.Option(False, "--json", help="the raw record (spec, status) and the figures as one "
                                                                "JSON object, for a program")) -> None:
    """The job for a person: its state, each loss and recovery (time, steps lost, emergency save, zone), its cost and
    what it saved against on demand, and where its time went (goodput); --json: the record behind them."""

    def go() -> None:
        from . import report
        from respawn.control.recovery import strategy_for
        from .jobstore import NoSuchJob

        try:
            r, doc, _ = report.load(_store(project), job_id)
        except NoSuchJob:
            raise _no_such_job(job_id) from None
        status = schema.JobStatus.model_validate(doc.get("status") or {})
        try:
            recovery = strategy_for(schema.parse_spec(doc.get("spec"))).name
        except schema.SpecError:
            recovery = None  # the status says why the spec is invalid
        # Every figure is the report's (report.figures: computed once from the record), the page's too.
        f = report.figures(r)
        if as_json:
            print(json.dumps({"id": job_id, "cancel_requested": bool(doc.get("cancel_requested")),
                              "created_at": _fmt_time(doc.get("created_at")), "recovery": recovery, "figures": f,
                              "status": status.model_dump(mode="json", exclude_none=True), "spec": doc.get("spec")},
                             ensure_ascii=False, default=str))  # a spec's values as Firestore keeps them
            return
        _describe_for_a_person(job_id, status, recovery, f)

    run_reporting_errors(go)


def _describe_for_a_person(job_id: str, status: schema.JobStatus, recovery: str | None, f: dict[str, Any]) -> None:
    from . import report
    from respawn.control.recovery_time import text as recovery_time_text
    from respawn.prices import usd

    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    for key, _, value in report.headline(f):  # the page's figures, by short names (the page explains them)
        if key not in ("recoveries", "cost_per_recovery"):  # the table below says them, loss by loss
            facts.add_row({"saved": "saved vs on demand"}.get(key, key.replace("_", " ")), Text(value))
    if status.message:
        facts.add_row("message", Text(status.message))
    if recovery:
        facts.add_row("recovery strategy", Text(recovery))
    if "cost" in f:
        c = f["cost"]
        facts.add_row("prices", Text(str(c["prices"])))
        if "budget_usd" in c:
            facts.add_row("budget", Text(f"{usd(c['budget_usd'])}, {c['budget_used']} used"))
        if c.get("unpriced"):
            facts.add_row("unpriced", Text("; ".join(map(str, c["unpriced"]))))
    out.print(Text.assemble("job ", (job_id, "bold")))
    out.print(facts)
    if f["recoveries"]:
        header, rows = report.told_columns(report.RECOVERY_HEADER, report.recovery_rows(f, parts=False))
        header = [("recovery time" if h.startswith("recovery time") else h) for h in header]
        losses = Table(*header, "cost", title="losses and recoveries (times since registration)", title_justify="left")
        for x, row in zip(f["recoveries"], rows):
            losses.add_row(*row, "-" if x["cost_usd"] is None else usd(x["cost_usd"]))
        out.print(losses)
        for x in f["recoveries"]:  # a line each: a table cell would wrap the parts
            if report.parts_text(x):
                out.print(f"  {x['at_seconds']:.1f} s {x['cause'].replace('_', ' ')} {x['node']}: "
                          f"{recovery_time_text(x['seconds'])} = {report.parts_text(x)}", highlight=False)
    buckets = Table("where the time went", "time", "share", "what it holds",
                    title=f"goodput {f['goodput']:.1%} of {f['wall_seconds']:.1f} s", title_justify="left")
    for row in report.goodput_rows_of(f):
        buckets.add_row(*row)
    out.print(buckets)
    out.print("--json: the spec, the status and these figures as one JSON object", highlight=False)


@jobs_app.command("report")
def report_cmd(
    job_id: str,
    output: Path = typer.Option(Path("report.html"), "-o", "--output", help="where the HTML page goes"),
    heartbeats_database: Optional[str] = typer.Option(
        None, help="the Firestore database of the job's heartbeats (default: its node identity's while it holds "
                   "one, else the deployment's)"),
    project: Optional[str] = ProjectOpt,
    as_json: bool = typer.Option(False, "--json", help="print the figures as one JSON object as well"),
) -> None:
    """One self-contained HTML page of a job: every node life per zone and model, the step line of each, the
    recoveries, the goodput buckets and every event (docs/watching.md)."""

    def go() -> None:
        from . import report
        from .jobstore import NoSuchJob

        try:
            page, r = report.write(_store(project), job_id, output, heartbeats_database)
        except NoSuchJob:
            raise _no_such_job(job_id) from None
        except OSError as exc:
            raise CliError(f"--output {output}: cannot write it ({exc.strerror}); give a file in a folder that "
                           "exists", code=2) from None
        figures = report.describe(r)
        if as_json:
            print(json.dumps({"id": job_id, "state": r.state, "report": str(output.resolve()), **figures}))
            return
        back = len(figures["recovery_seconds"])  # the figures the page shows, in its words (report.BUCKET_WORDS)
        losses = f"{len(r.recoveries)} loss{'' if len(r.recoveries) == 1 else 'es'}"
        out.print(f"job {job_id} {r.state}: {len(r.lives)} node lives, {losses} ({back} recovered), "
                  f"goodput {figures['goodput']:.1%} of {figures['wall_seconds']:.0f} s")
        for words, took, share, _ in report.goodput_rows_of(figures):
            out.print(f"  {words}: {took} ({share})")
        out.print(f"report written to {output.resolve()}", highlight=False)

    run_reporting_errors(go)


@jobs_app.command("events")
def events(job_id: str, project: Optional[str] = ProjectOpt, limit: int = typer.Option(50, min=1)) -> None:
    """The job's lifecycle transitions, oldest first."""

    def go() -> None:
        from respawn import losswords

        table = Table("at", "from", "to", "cause", "says", "details")
        for ev in _store(project).job_events(job_id, limit):
            table.add_row(
                _fmt_time(ev.at), ev.from_state.value if ev.from_state else "-", ev.to_state.value, ev.cause,
                losswords.event_words(ev.details) or "",
                json.dumps(ev.details, default=str, ensure_ascii=False) if ev.details else "",
            )
        out.print(table)

    run_reporting_errors(go)


@jobs_app.command("logs")
def logs(
    job_id: str,
    attempt: Optional[int] = typer.Option(None, "--attempt", min=1, help="one attempt (node) only"),
    node: Optional[str] = typer.Option(None, "--node", help="one node only (NAME = JOB-ATTEMPT)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep polling for new chunks"),
    tail_lines: Optional[int] = typer.Option(None, "--tail", min=1, help="only the last K lines (then follow)"),
    agent: bool = typer.Option(False, "--agent", help="the agents' own JSON lines too"),
    project: Optional[str] = ProjectOpt,
) -> None:
    """What the job's setup and trainer printed, node by node, including nodes that are gone (docs/watching.md)."""

    def go() -> None:
        import time

        from respawn import contract, joblogs
        from . import codestore

        uri = (_store(project).job_document(job_id).get("spec") or {}).get("checkpoint_uri")
        try:
            contract.StoreUri.parse(uri)
        except ValueError:
            raise CliError(f"job {job_id!r} has no usable checkpoint_uri ({uri!r}), where its logs would be") from None
        base = contract.logs_uri(uri)
        prefix = contract.log_attempt_prefix(attempt) if attempt is not None else ""
        streams = (*joblogs.DEFAULT_STREAMS, "agent") if agent else joblogs.DEFAULT_STREAMS
        printed: dict[str, int] = {}  # chunk name → bytes of it shown (a re-sent chunk may grow)
        hosts: set[str] = set()
        written: dict[int, float] = {}  # attempt → when its newest chunk was written

        def listing(first: bool) -> list[joblogs.Listed]:
            if first or attempt is not None:
                return codestore.list_logs(base, prefix, project)
            # --follow on the whole job: its attempts (one short listing), then only those still writing or new
            live = joblogs.follow_attempts(codestore.log_attempts(base, project), written, time.time())
            return [item for a in live for item in codestore.list_logs(base, contract.log_attempt_prefix(a), project)]

        def show(first: bool) -> None:
            try:
                listed = listing(first)
                for item in listed:
                    if (c := contract.LogChunk.parse(item.name)) is not None:
                        written[c.attempt] = max(written.get(c.attempt, 0.0), item.updated)
                attempts = codestore.log_attempts(base, project) if attempt is not None and not listed else ()
                shown = joblogs.select(listed, job_id=job_id, where=base + prefix, attempt=attempt, node=node,
                                       streams=streams, attempts=attempts)
            except codestore.CodeStoreError as exc:
                raise CliError(str(exc)) from None
            except joblogs.NoLogs as exc:
                if first or not follow:
                    raise CliError(str(exc)) from None
                return
            fresh = [s for s in shown if printed.get(s.listed.name, 0) < s.listed.size]
            hosts.update(s.chunk.host for s in shown)

            def read(s: joblogs.Shown) -> bytes:
                try:
                    data = codestore.read_log(base, s.listed.name, project)
                except codestore.CodeStoreError as exc:
                    raise CliError(str(exc)) from None
                done, printed[s.listed.name] = printed.get(s.listed.name, 0), len(data)
                return data[done:]

            if first and tail_lines:  # read from the end only as far back as the last K lines go
                fresh = joblogs.last_chunks(fresh, read, tail_lines)
                for s in shown:
                    printed.setdefault(s.listed.name, s.listed.size)  # the older ones: skipped, not to be shown later
            text = joblogs.lines(joblogs.read_ahead(fresh, read) if len(fresh) > 1 else fresh, read, hosts=hosts)
            for line in joblogs.tail(text, tail_lines) if first and tail_lines else text:
                out.print(line, highlight=False)

        show(True)
        try:
            while follow:
                time.sleep(FOLLOW_POLL_S)
                show(False)
        except KeyboardInterrupt:
            pass

    run_reporting_errors(go)


@jobs_app.command("cancel")
def cancel(job_id: str, project: Optional[str] = ProjectOpt, sweep_topic: str = SweepTopicOpt) -> None:
    """Ask the controller to delete the job's node and mark it CANCELLED."""

    def go() -> None:
        from .jobstore import JobFinished

        store = _store(project)
        try:
            state = store.request_cancel(job_id)
        except JobFinished as exc:
            raise CliError(f"job {job_id!r} is already {exc.state.value}; nothing to cancel") from None
        woke = _wake_controller(store.project, sweep_topic, job_id)
        then = "the controller is deleting its node" if woke else "the next scheduled sweep deletes its node"
        out.print(Text.assemble("cancel requested for ", (job_id, "bold"), f" (was {state.value}); {then}"))

    run_reporting_errors(go)


@jobs_app.command("resume")
def resume(job_id: str, budget: float = typer.Option(..., "--budget", help="the new budget.max_usd, in USD"),
           project: Optional[str] = ProjectOpt, sweep_topic: str = SweepTopicOpt) -> None:
    """Raise the job's budget: a job stopped at its budget (BUDGET_EXHAUSTED) goes on from its newest committed
    checkpoint; a running job gets the new cap."""

    def go() -> None:
        from respawn import ledger, prices
        from .jobstore import JobFinished, NoSuchJob

        store = _store(project)
        try:
            status = schema.JobStatus.model_validate(store.job_document(job_id).get("status") or {})
        except NoSuchJob:
            raise _no_such_job(job_id) from None
        spent = ledger.spent(status, datetime.now(timezone.utc))[0]
        if budget <= spent:
            raise CliError(f"job {job_id!r} has cost {prices.usd(spent)} so far; a budget of {prices.usd(budget)} would stop it "
                           "again at once: give more than that")
        try:
            before = store.set_budget(job_id, budget)
        except JobFinished as exc:
            raise CliError(f"job {job_id!r} is {exc.state.value}: only a job stopped at its budget "
                           f"({schema.State.BUDGET_EXHAUSTED.value}) or still running can be given more") from None
        woke = _wake_controller(store.project, sweep_topic, job_id)
        what = ("resumes from its newest committed checkpoint" if before.state is schema.State.BUDGET_EXHAUSTED
                else "runs on under the new cap")
        when = "" if woke else " at the next scheduled sweep"
        out.print(Text.assemble("budget of ", (job_id, "bold"),
                                f" set to {prices.usd(budget)} ({prices.usd(spent)} spent); it {what}{when}"))

    run_reporting_errors(go)


def _wake_controller(project: str, topic: str, job_id: str) -> bool:
    """Nudge the controller's sweep for one job; without it the scheduled sweep acts within its period."""
    from .jobstore import nudge_sweep

    try:
        nudge_sweep(project, topic, job_id)
        return True
    except Exception as exc:  # noqa: BLE001 - the cancel itself is recorded; only the nudge failed
        from .endpoints import Unreachable

        said = str(exc) if isinstance(exc, Unreachable) else exc.__class__.__name__
        say("note", f"could not publish to topic {topic!r} ({said})")
        return False


@jobs_app.command("validate")
def validate(file: Path = typer.Argument(..., help="job spec, YAML or JSON")) -> None:
    """Validate a job spec without touching Firestore. A trainer.workdir that is a directory is packed (nothing is
    sent) to show the URI `jobs register` would record."""

    def go() -> None:
        data = _read_spec_data(file)
        trainer, written = _trainer_workdir(data)
        directory = _local_workdir(file, written)
        if directory is not None:
            packed = _pack(directory)
            try:
                trainer["workdir"] = workdir_uri(str(data.get("checkpoint_uri")), packed.sha256)
            except WorkdirError:
                trainer.pop("workdir")  # no URI without a valid checkpoint_uri, which the check below names
        spec = _parse_spec(file, data)
        if directory is not None:
            out.print(f"trainer.workdir: {directory} → {spec.trainer.workdir} (`{command()} jobs register` uploads it)",
                      highlight=False)
        out.print(Text.assemble(f"{file}: valid job spec for ", (spec.id, "bold")))

    run_reporting_errors(go)


def _observed_mtbp_hours(accelerator: str, project: str | None) -> float:
    """Spot node time per preemption, over every zone's statistics of `accelerator` (schema.ZoneStats)."""
    seen = [schema.ZoneStats.model_validate(by_model[m]) for by_model in _store(project).stats_of(accelerator)
            for m in ("spot", "preemptible") if m in by_model]
    preemptions = sum(s.preemptions for s in seen)
    if not preemptions:
        raise CliError(f"Respawn has seen no preemption of a Spot {accelerator} yet; give --mtbp-hours", code=2)
    hours = sum(s.life_seconds for s in seen) / preemptions / 3600
    err.print(f"mtbp_hours {hours:.2f}: {preemptions} preemptions in {sum(s.lives for s in seen)} Spot node lives of "
              f"{accelerator} that Respawn saw", highlight=False)
    return hours


def _parse_settings(pairs: list[str]) -> dict[str, float]:
    from dataclasses import fields

    from .plan import PlanInputs

    known = {f.name: f.type for f in fields(PlanInputs)}
    settings: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in known:
            raise CliError(f"--set {pair!r}: expected NAME=VALUE with NAME one of: {', '.join(known)}", code=2)
        # Whole-number inputs (runs, seed, nodes; min_nodes is `int | None`) parse as int, the rest as float.
        whole = known[name] is int or str(known[name]).startswith("int")
        try:
            settings[name] = int(value) if whole else float(value)
        except ValueError:
            raise CliError(f"--set {pair!r}: {value!r} is not a {'whole ' if whole else ''}number", code=2) from None
    return settings


def _plan_inputs_of(ctx: typer.Context, file: Path) -> dict[str, Any]:
    """What the job spec at `file` gives the plan (respawn.app.plan.from_spec), less what an option given on the
    command line sets (it overrides); each source said on stderr."""
    from .plan import from_spec

    data = _read_spec_data(file)
    trainer, written = _trainer_workdir(data)
    if trainer is not None and _local_workdir(file, written) is not None:
        trainer.pop("workdir")  # a directory to pack: nothing the plan reads
    got, said = from_spec(_parse_spec(file, data))
    # By name: typer carries a click of its own, whose ParameterSource is not click's.
    given = {name for name in ctx.params
             if getattr(ctx.get_parameter_source(name), "name", "") in ("COMMANDLINE", "ENVIRONMENT")}
    kept = {k: v for k, v in got.items() if k not in given}
    for line in said:
        err.print(f"{file}: {line}", markup=False, highlight=False)
    if set(got) - set(kept):
        err.print(f"{file}: overridden by the options given: {', '.join(sorted(set(got) - set(kept)))}",
                  markup=False, highlight=False)
    return kept


@app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    job_file: Optional[Path] = typer.Argument(
        None, metavar="[JOB.yaml]", help="a job spec: its nodes (on-demand, min, spare), notice and its node's prices "
                                         "an hour in its first zone's region; the options below still override"),
    job_hours: float = typer.Option(24.0, help="compute hours the job needs with all its nodes healthy"),
    mtbp_hours: float = typer.Option(6.0, help="mean hours between preemptions of one Spot node"),
    nodes: int = typer.Option(1, min=1, help="GPU VMs of the job (a job of N Spot nodes is interrupted N times as "
                                             "often)"),
    on_demand_nodes: int = typer.Option(0, min=0, help="of them on-demand: adds the hybrid strategy"),
    min_nodes: Optional[int] = typer.Option(None, min=1, help="train on this many while replacements boot: adds the "
                                                              "elastic strategy when below --nodes"),
    spare_nodes: int = typer.Option(0, min=0, help="warm spares (the spec's spare_nodes): adds the spares strategy "
                                                   "and what they cost and save"),
    state_gb: float = typer.Option(10.0, help="checkpoint size in GB"),
    checkpoint_interval_min: float = typer.Option(30.0, help="periodic checkpoint interval, minutes"),
    boot_s: float = typer.Option(90.0, help="seconds from create call to a training node"),
    notice_s: float = typer.Option(0.0, help="the job's notice_seconds: Compute Engine's preemption notice before "
                                             "the soft-off (0 or 120, GPU Spot VMs)"),
    spot_price: float = typer.Option(1.47, help="$/h on Spot"),
    on_demand_price: float = typer.Option(3.67, help="$/h on demand"),
    runs: int = typer.Option(500, min=1, help="simulated runs per strategy"),
    seed: int = typer.Option(0, help="random seed"),
    settings: list[str] = typer.Option([], "--set", help="any other input as NAME=VALUE (see docs/plan.md)"),
    bench_json: list[Path] = typer.Option(
        [], help="measured figures: `python -m bench.checkpoint --json` or `bench.controller --json` output (repeatable)"),
    plot: Optional[Path] = typer.Option(None, help="write an SVG chart here"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    from_stats: Optional[str] = typer.Option(
        None, "--from-stats", help="take the mean hours between preemptions from what Respawn's controller saw of Spot "
                                   "VMs of this accelerator in every zone (its capacity key: a GPU type, or the "
                                   "machine type of built-in GPUs such as g2-standard-8) instead of --mtbp-hours"),
    project: Optional[str] = ProjectOpt,
) -> None:
    """Goodput and cost of a Spot job under three recovery strategies, of the hybrid and elastic layouts of several
    nodes, and of warm spares; and its cost and finish under four ways of getting capacity (all Spot, Spot then
    flex-start, Spot then on-demand, all on-demand), by Monte Carlo simulation."""

    def go() -> None:
        from .plan import PlanInputs, plan, svg_chart, with_bench
        from .plan_model import max_emergency_state_gb

        if on_demand_nodes > nodes:
            raise CliError(f"--on-demand-nodes {on_demand_nodes} is more than --nodes ({nodes}): the on-demand nodes "
                           "are some of the job's nodes", code=2)
        if min_nodes is not None and min_nodes > nodes:
            raise CliError(f"--min-nodes {min_nodes} is more than --nodes ({nodes}): it is the fewest nodes the job "
                           "trains on while replacements boot", code=2)
        inputs = PlanInputs(
            job_hours=job_hours, mtbp_hours=mtbp_hours, state_gb=state_gb, checkpoint_interval_min=checkpoint_interval_min,
            boot_s=boot_s, notice_s=notice_s, spot_price=spot_price, on_demand_price=on_demand_price,
            runs=runs, seed=seed, nodes=nodes, on_demand_nodes=on_demand_nodes, min_nodes=min_nodes,
            spare_nodes=spare_nodes,
        )
        from dataclasses import replace

        if job_file is not None:
            inputs = replace(inputs, **_plan_inputs_of(ctx, job_file))
        inputs = replace(inputs, **_parse_settings(settings))
        if from_stats:
            inputs = replace(inputs, mtbp_hours=_observed_mtbp_hours(from_stats, project))
        for path in bench_json:
            try:
                inputs = with_bench(inputs, json.loads(path.read_text().strip().splitlines()[-1]))
            except (OSError, ValueError, IndexError, AttributeError, TypeError) as exc:
                raise CliError(f"{path}: not the --json output of bench.checkpoint or bench.controller ({exc})",
                               code=2) from None
        try:
            result = plan(inputs)
        except ValueError as exc:
            raise CliError(str(exc), code=2) from None
        if plot is not None:
            try:
                plot.write_text(svg_chart(result))
            except OSError as exc:
                raise CliError(f"--plot {plot}: cannot write it ({exc.strerror}); give a file in a folder that "
                               "exists", code=2) from None
        if as_json:
            print(json.dumps(result.to_json()))
            return
        planned = result.inputs  # min_nodes resolved
        layout = f" on {planned.nodes} nodes" if planned.nodes > 1 else ""
        variants = ([f"hybrid: {planned.on_demand_nodes} on-demand"] if planned.on_demand_nodes else []) + (
            [f"elastic: trains on {planned.min_nodes} or more"] if planned.min_nodes < planned.nodes else []) + (
            [f"spares: {planned.spare_nodes} warm"] if planned.spare_nodes else [])
        if variants:
            layout += f" ({'; '.join(variants)})"
        elastic = any(r.strategy == "elastic" for r in result.results)
        columns = ["strategy", "goodput", "wall h", "p90 wall h", "downtime h", *(["degraded h"] if elastic else []),
                   "redone h", "checkpoint h", "preemptions", "emergency saved", "cost $", "saved vs on-demand"]
        table = Table(*columns,
                      title=f"{inputs.job_hours:g} h job{layout}, a preemption every {inputs.mtbp_hours:g} h per "
                            f"Spot node, {inputs.state_gb:g} GB state, {inputs.runs} runs each")
        for r in result.results:
            table.add_row(
                r.strategy, f"{r.goodput:.1%}", f"{r.wall_hours:.2f}", f"{r.p90_wall_hours:.2f}", f"{r.downtime_hours:.2f}",
                *([f"{r.degraded_hours:.2f}"] if elastic else []),
                f"{r.redone_hours:.2f}", f"{r.checkpoint_hours:.2f}", f"{r.preemptions:.1f}", f"{r.emergency_saved:.0%}",
                # Saved against on demand: 1 − cost ÷ on demand, the report page's meaning (docs/watching.md).
                f"{r.cost:.2f}", f"{1 - r.cost_vs_on_demand:.0%}",
            )
        out.print(table)
        per_node = f"{planned.nodes} nodes × " if planned.nodes > 1 else ""
        out.print(f"on demand: {per_node}{inputs.job_hours:g} h at ${inputs.on_demand_price:g}/h = "
                  f"${result.on_demand_cost:.2f}")
        out.print(
            f"an emergency checkpoint fits the {inputs.notice_budget_s + inputs.notice_s:g} s notice budget for state "
            "up to "
            f"{max_emergency_state_gb(inputs):.1f} GB at this disk speed"
        )
        if result.provisioning:
            tiers = Table("provisioning", "wall h", "p90 wall h", "cost $", "saved vs on-demand", "Spot h",
                          "flex-start h", "on-demand h",
                          title=f"ways of getting capacity, with respawn's recovery: Spot dry in every zone after "
                                f"{planned.spot_dry_probability:.0%} of preemptions, {planned.spot_dry_hours:g} h on "
                                f"average; flex-start at ${planned.flex_price:g}/h, {planned.flex_run_hours:g} h runs "
                                f"(node hours)")
            for t in result.provisioning:
                tiers.add_row(t.policy, f"{t.wall_hours:.2f}", f"{t.p90_wall_hours:.2f}", f"{t.cost:.2f}",
                              f"{1 - t.cost_vs_on_demand:.0%}", f"{t.spot_hours:.1f}", f"{t.flex_start_hours:.1f}",
                              f"{t.on_demand_hours:.1f}")
            out.print(tiers)
            cheapest = min(result.provisioning, key=lambda t: t.cost)
            surest = min(result.provisioning, key=lambda t: t.p90_wall_hours)
            out.print(f"cheapest: {cheapest.policy}; surest finish (p90): {surest.policy} (docs/plan.md: when each "
                      "wins)")
        if result.spares is not None:
            s = result.spares
            out.print(f"spares: {s.spare_nodes} Spot node{'s'[:s.spare_nodes > 1]} all along: +${s.cost:.2f} (preempted "
                      f"{s.spare_preemptions:.1f} times, each replaced); a ready spare took {s.joined:.0%} of the "
                      f"losses, recovery −{s.recovery_saved_s / 60:.1f} min per loss: {s.downtime_saved_hours:.2f} h and "
                      f"${s.recovery_cost_saved:.2f} of node time saved; net {'+' if s.net >= 0 else '−'}"
                      f"${abs(s.net):.2f} against {s.against}")
        if plot is not None:
            out.print(f"chart written to {plot}")

    run_reporting_errors(go)


def chaos_command(gcloud: str, kind: str, node: str, zone: str, project: str) -> list[str]:
    """The gcloud command that simulates a host maintenance event on the node (docs/gcp-facts.md §23): a GPU VM is
    terminated (a Spot VM preempted), a TPU VM's workers go through maintenance. --async: the node may be gone
    (deleted) before gcloud would read it back; `respawn chaos` follows the job instead."""
    where = [node, f"--zone={zone}", f"--project={project}", "--async"]
    if kind == "tpu":
        return [gcloud, "alpha", "compute", "tpus", "tpu-vm", "simulate-maintenance-event", *where]
    return [gcloud, "compute", "instances", "simulate-maintenance-event", *where]


@app.command("chaos")
def chaos(
    job_id: str,
    node: Optional[str] = typer.Option(None, help="one of the job's current nodes (default: its master's)"),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    follow: bool = typer.Option(True, "--follow/--no-follow", help="follow the recovery until the job trains again"),
    timeout: float = typer.Option(1800.0, min=1, help="stop following after this many seconds"),
    gcloud: str = typer.Option("gcloud", help="the gcloud executable"),
    project: Optional[str] = ProjectOpt,
) -> None:
    """Interrupt one of a running job's nodes for real, with Compute Engine's (or Cloud TPU's) simulated host
    maintenance, and follow Respawn's recovery live. Not a real preemption: rate limited per project and region
    (docs/watching.md, testing on Google Cloud)."""

    def go() -> None:
        import shutil
        import subprocess
        import time

        from .jobstore import NoSuchJob

        store = _store(project)
        try:
            doc = store.job_document(job_id)
        except NoSuchJob:
            raise _no_such_job(job_id) from None
        status = schema.JobStatus.model_validate(doc.get("status") or {})
        if status.state is not schema.State.RUNNING:
            raise CliError(f"job {job_id} is {status.state.value}: only a RUNNING job's node can be interrupted", code=2)
        nodes = {m.node: m.zone for m in status.members if m.node and m.zone} or {status.node: status.zone}
        target = node or status.node
        if target not in nodes or not nodes[target]:
            raise CliError(f"{target} is not one of job {job_id}'s current nodes ({', '.join(map(str, nodes))})", code=2)
        kind = ((doc.get("spec") or {}).get("accelerator") or {}).get("kind", "gpu")
        if shutil.which(gcloud) is None:
            raise CliError(f"{gcloud} not found: install the Google Cloud CLI (https://cloud.google.com/sdk) or pass "
                           "--gcloud PATH", code=2)
        command = chaos_command(gcloud, kind, target, nodes[target], store.project)
        if not yes and not typer.confirm(f"This stops {target} in {nodes[target]} (project {store.project}) for real: "
                                         f"{' '.join(command[1:])}. Go on?", err=True):
            raise CliError("nothing done", code=1)
        seen = {(e.at, e.cause) for e in store.job_events(job_id, 50)}
        started = time.monotonic()
        err.print(f"interrupting {target}: {' '.join(command)}")
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise CliError(f"{' '.join(command)} failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}\n"
                           "check that you may call compute.instances.simulateMaintenanceEvent (tpu.nodes."
                           "simulateMaintenanceEvent) and the per-region rate limit "
                           "SimulateMaintenanceEventRequestsPerMinutePerProjectPerRegion")
        if not follow:
            return
        err.print(f"following job {job_id} (Ctrl-C stops following, not the job)")
        while time.monotonic() - started < timeout:
            for ev in store.job_events(job_id, 50):
                if (ev.at, ev.cause) in seen:
                    continue
                seen.add((ev.at, ev.cause))
                took = time.monotonic() - started
                details = json.dumps({k: v for k, v in ev.details.items() if k != "lost"}, default=str,
                                     ensure_ascii=False)
                out.print(f"{took:7.1f} s  {ev.from_state.value if ev.from_state else '-'} → {ev.to_state.value}: "
                          f"{ev.cause} {details}")
                if ev.cause == "recovered":
                    from respawn.control import recovery_time

                    out.print(f"job {job_id} {recovery_time.line(ev.details)}", markup=False, highlight=False)
                    return
                if ev.to_state.terminal:
                    raise CliError(f"job {job_id} ended {ev.to_state.value} instead of recovering")
            time.sleep(2.0)
        raise CliError(f"job {job_id} did not train again within {timeout:g} s; `{command()} jobs events {job_id}` "
                       "shows where it is")

    run_reporting_errors(go)


@app.command("zones")
def zones_cmd(
    accelerator: str = typer.Option(..., "--accelerator", help="the GPU, e.g. nvidia-l4"),
    machine_type: str = typer.Option(..., "--machine-type", help="e.g. g2-standard-8"),
    zones: Optional[str] = typer.Option(None, "--zones", help="comma-separated zones, e.g. us-central1-a,us-east4-c"),
    region: Optional[str] = typer.Option(None, "--region", help="every zone of this region"),
    count: int = typer.Option(1, "--count", min=1, help="GPUs per VM, for GPUs attached to a machine type (N1)"),
    project: Optional[str] = ProjectOpt,
) -> None:
    """Per zone: the quotas (limit/usage), Compute Engine's capacity advice for Spot VMs (obtainability, estimated
    uptime), the recent Spot preemption rate and price, and what Respawn's controller saw there itself."""

    def go() -> None:
        from respawn import advice
        from .compute_read import Reader, reader
        from .zonereport import Report, ZoneRow, add_seen, region_zones, report

        built_in = advice.Shape(machine_type).gpu
        if built_in is not None and built_in != accelerator:
            raise CliError(f"{machine_type} carries {built_in}, not {accelerator}", code=2)
        shape = advice.Shape(machine_type) if built_in else advice.Shape(machine_type, accelerator, count)
        look = reader(project)
        names = [z.strip() for z in (zones or "").split(",") if z.strip()]
        if bool(names) == bool(region):
            raise CliError("give --zones or --region (one of them)", code=2)
        for zone in names:
            if not schema._ZONE.match(zone):
                raise CliError(f"--zones: {zone!r} is not a zone name such as us-central1-a", code=2)
        if region and schema._ZONE.match(region):
            raise CliError(f"--region {region} is a zone: give its region ({advice.region_of(region)}) or --zones "
                           f"{region}", code=2)
        asked = isinstance(look, Reader) and look.project
        if region:
            found = region_zones(look, region) if asked else _not_asked(look)
            if isinstance(found, str):
                _say_offline_prices(shape, [region])
                raise CliError(f"could not list the zones of {region}: {found}; or name them with --zones")
            names = found
        rep = report(look, shape, names) if asked else Report([ZoneRow(z) for z in names],
                                                              [f"Compute Engine not asked: {_not_asked(look)}"])
        try:
            add_seen(rep.rows, _store(project).capacity_records(names, shape.capacity_key))
        except Exception as exc:  # noqa: BLE001 - the other columns stand without it
            rep.notes.append(f"Respawn's statistics: {exc}")
        out.print(_zones_table(rep, shape))
        for row in rep.rows:  # below the table: too long for a column
            out.print(f"Respawn saw in {row.zone}: {_seen(row)}", highlight=False)
        for note in rep.notes:
            say("note", f"not read: {note}")
        if not asked:
            _say_offline_prices(shape, list(dict.fromkeys(advice.region_of(z) for z in names)))

    run_reporting_errors(go)


def _not_asked(look: Any) -> str:
    """Why `respawn zones` cannot ask Compute Engine, and what to do about it."""
    if look is None:
        return (f"a local run (FIRESTORE_EMULATOR_HOST is set) with no Compute Engine stand-in at "
                f"{deployment.ENV_COMPUTE_ENDPOINT}")
    if isinstance(look, str):  # no credentials, or an endpoint that does not answer (which says what to do)
        return look if " does not answer " in look else f"{look}: run `gcloud auth application-default login` and give --project"
    return "no project: give --project or set GOOGLE_CLOUD_PROJECT"


def _say_offline_prices(shape: Any, regions: list[str]) -> None:
    """Offline, the dated offline table's price of the VM in each region (what Compute Engine's Spot price column
    would say), or that the table has none."""
    from .zonereport import offline_price

    for region in regions:
        found = offline_price(shape, region)
        say("note", f"{shape.machine_type} in {region}: {found}" if found else
            f"{shape.machine_type} in {region}: the offline price table has no price for it")


def _zones_table(rep: Any, shape: Any) -> Table:
    from respawn import advice
    from .zonereport import offline_spot

    spot, standard = (advice.quota_metric(shape.gpu, m) for m in ("spot", "standard"))
    table = Table("zone", f"{spot or 'Spot quota'} used/limit", f"{standard or 'on-demand quota'} used/limit",
                  "obtainability", "est. uptime", "preemption rate (7 d)", "Spot price")

    def quota(row, metric):
        q = row.quotas.get(metric or "")
        return f"{q.usage:g}/{q.limit:g}" if q else "—"

    for row in rep.rows:
        scores, history = row.scores, row.history
        rate = history.recent_rate() if history else None
        price = history.price if history else None
        table.add_row(row.zone, quota(row, spot), quota(row, standard),
                      f"{scores.obtainability:.2f}" if scores else "—",
                      _duration(scores.uptime_seconds) if scores and scores.uptime_seconds is not None else "—",
                      f"{rate:.0%}" if rate is not None else "—",
                      f"{price[0]:.3f} {price[1]}/h" if price else offline_spot(shape, row.zone) or "—")
    return table


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _seen(row: Any) -> str:
    """What the controller saw in the zone, per provisioning model, and a cooldown in force."""
    if not row.seen_read:
        return "—"
    parts = []
    for model, s in sorted(row.stats.items()):
        said = [f"{s.refusals} refused", f"{s.nodes} obtained"]
        if s.obtain_mean_seconds is not None:
            said[-1] += f" (mean {_duration(s.obtain_mean_seconds)})"
        said.append(f"{s.preemptions} preempted")
        if s.mtbi_seconds is not None:
            said.append(f"MTBI {_duration(s.mtbi_seconds)}")
        parts.append(f"{model}: " + ", ".join(said))
    if row.cooling_until is not None and row.cooling_until > datetime.now(timezone.utc):
        parts.append(f"cooling down until {row.cooling_until:%H:%M} UTC")
    return "; ".join(parts) or "nothing yet"


@app.command("doctor")
def doctor_cmd(
    project: Optional[str] = ProjectOpt,
    region: Optional[str] = typer.Option(None, "--region", envvar="RESPAWN_REGION",
                                         help="the functions' region: the scheduler job is checked there (without "
                                              "it, in us-central1) and the self-test runs it (without it, the next "
                                              "tick is waited for)"),
    job: Optional[Path] = typer.Option(None, "--job", help="a job spec: its machines, zones and quotas are checked"),
    timeout: float = typer.Option(SELFTEST_TIMEOUT_S, "--timeout", min=1,
                                  help="seconds each probe's answer is waited for"),
    node_identities: int = typer.Option(deployment.DEFAULT_NODE_IDENTITIES, "--node-identities", min=1,
                                        max=deployment.MAX_NODE_IDENTITIES,
                                        help="the build's _NODE_IDENTITIES: the node service accounts checked"),
    slack_secret: str = typer.Option(deployment.DEFAULT_SLACK_SECRET, "--slack-secret",
                                     help="the build's _SLACK_SECRET: the secret whose latest version is checked"),
    indexes: Optional[Path] = typer.Option(None, "--indexes", exists=True, dir_okay=False,
                                           help="the composite indexes file the build read (without it, the "
                                                "checkout's deploy/firestore/indexes.yaml): each is checked READY"),
    probes: bool = typer.Option(True, "--probes/--no-probes", help="send the self-test's probes"),
) -> None:
    """Check a deployment (a project, or the demo's stand-ins) and prove every path it relies on, one line a check."""
    from . import doctor, project_checks, selftest_run

    def go() -> None:
        name = project or _store(None).project
        checks = [doctor.firestore_check(name), *doctor.topic_checks(name), *project_checks.deployment_checks(
            name, region, identities=node_identities, slack_secret=slack_secret, indexes=indexes)]
        for check in checks:
            out.print(check.line, highlight=False)
        if job is not None:
            checks.append(_doctor_job(job, name))
            out.print(checks[-1].line, highlight=False)
        if probes and not checks[0].ok:
            checks.append(doctor.Check(False, "✗ the self-test's probes were not sent: they need Firestore (above)"))
            out.print(checks[-1].line, highlight=False)
        elif probes:
            checks += doctor.probe_checks(name, selftest_run.senders(name, region), timeout,
                                          lambda line: out.print(line, highlight=False))
        failed = [c for c in checks if not c.ok]
        if failed:
            raise CliError(f"doctor: {len(failed)} of {len(checks)} checks failed; the first: {failed[0].line[2:]}")
        out.print(f"doctor: all {len(checks)} checks passed", highlight=False)

    run_reporting_errors(go)


def _doctor_job(file: Path, project: str) -> Any:
    """The checks `jobs register` makes of a spec (its catalog, boot image, network and quotas), as one line."""
    from .doctor import Check

    try:
        spec = _parse_spec(file, _read_spec_data(file), _live_catalog(project))
        for check in (_check_image, _check_network, _check_quota):
            check(spec, project)
    except CliError as exc:
        return Check(False, f"✗ {file}: {exc}")
    return Check(True, f"✓ {file}: its machines, zones and quotas allow it")


@app.command("demo", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             add_help_option=False)
def demo(ctx: typer.Context) -> None:
    """Run the whole flow on this machine: emulators, sim, functions, agents, trainers; --job runs your own job spec."""
    # The demo and its stand-ins (sim/) live in the source checkout and are never installed: run them from there.
    checkout = deployment.source_root()
    if not (checkout / "sim" / "demo" / "__main__.py").is_file():
        err.print("respawn demo runs from a source checkout of Respawn (its local stand-ins for Google Cloud are not "
                  "installed): in the checkout, run `pip install -e '.[dev]' && respawn demo`", highlight=False)
        raise typer.Exit(2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])),
           "RESPAWN_COMMAND": command()}  # the demo's hints name respawn as it was started here
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "sim.demo", *ctx.args], env)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
