"""Every `respawn` subcommand given bad arguments, paths and files, run as a real process: exit 2, a line (or a short
list) naming what is wrong and what to do, the user's own words kept (no Rich markup eaten), never a traceback. A job
id that names no job is a lookup that found nothing, not a malformed input: exit 1, as for a cloud call that failed.

Most cases run as processes forked from one that has imported the CLI (tests/respawn_forks.py); a sample of every
kind (click's usage errors, a spec file's, the top-level hint, the demo's own process, the emulator's lookups) also
runs as `python -m respawn` itself, and must say exactly what the forked one said."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from respawn import schema
from tests.respawn_forks import respawn_forks  # noqa: F401 - a fixture

SPEC = {
    "id": "err-job",
    "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"},
    "zones": ["us-central1-a"],
    "trainer": {"command": ["python", "train.py"]},
    "checkpoint_uri": "gs://ckpt-bucket/err-job",
}

# (case, argv, what stderr must say): the files named are made by `workspace` below.
OFFLINE = [
    # Usage errors (click's): what is wrong, and `--help`.
    ("no subcommand argument", ["jobs", "describe"], ["Missing argument", "--help"]),
    ("unknown option", ["jobs", "list", "--bogus"], ["No such option: --bogus", "--help"]),
    ("not a number", ["jobs", "resume", "j", "--budget", "lots"], ["Invalid value for '--budget'", "--help"]),
    ("out of range", ["jobs", "logs", "j", "--attempt", "0"],
     ["Invalid value for '--attempt': Input should be greater than or equal to 1", "--help"]),
    ("events limit", ["jobs", "events", "j", "--limit", "0"], ["Invalid value for '--limit'"]),
    ("chaos timeout", ["chaos", "j", "--timeout", "0"], ["Invalid value for '--timeout'"]),
    ("doctor timeout", ["doctor", "--timeout", "0"], ["Invalid value for '--timeout'"]),
    ("report option value missing", ["jobs", "report", "j", "--output"], ["requires an argument"]),
    ("cancel extra argument", ["jobs", "cancel", "a", "b"], ["unexpected extra argument(s) (b)"]),
    # Spec files: validate and register read them the same way, before any cloud call.
    *[(f"{cmd} {what}", ["jobs", cmd, path], said) for cmd in ("validate", "register") for what, path, said in (
        ("missing file", "missing.yaml", ["cannot read missing.yaml: No such file or directory"]),
        ("directory", "folder", ["cannot read folder: Is a directory"]),
        ("YAML syntax error", "syntax.yaml", ["syntax.yaml is neither valid YAML nor JSON", "line 3, column 4",
                                              "zones: [us-central1-a, us-central1-b\n", "^",
                                              "expected ',' or ']', but got ':'"]),
        ("schema error", "schema.yaml", ["schema.yaml: invalid job spec", "max_restart: unknown field",
                                         "zones[0]: 'US-CENTRAL1-A' is not a zone name such as us-central1-a"]),
        ("shell-string command", "shell.yaml", ["trainer.command: must be an argv list such as [python, train.py], "
                                                "not a shell string"]),
        ("not a mapping", "list.yaml", ["list.yaml: invalid job spec"]),
        ("binary file", "binary.yaml", ["binary.yaml is not UTF-8 text (byte 0): give a YAML or JSON job spec"]),
        ("empty file", "empty.yaml", ["empty.yaml is empty: a job spec is a mapping of fields"]),
        ("nodes over the platform's limits", "labels.yaml", [
            "labels.yaml: invalid job spec", "labels: 63 labels: a node carries at most 64, and Respawn writes 2"]),
    )],
    ("pack missing directory", ["jobs", "pack", "missing"], ["workdir missing does not exist"]),
    ("pack a file", ["jobs", "pack", "afile"], ["workdir afile is not a directory"]),
    ("pack output under a file", ["jobs", "pack", "folder", "-o", "afile/out.tar.gz"],
     ["cannot write afile/out.tar.gz: Not a directory"]),
    ("plan bad --set", ["plan", "--set", "speed=3"], ["--set 'speed=3': expected NAME=VALUE with NAME one of"]),
    ("plan bad --bench-json", ["plan", "--bench-json", "missing.json"], ["missing.json: not the --json output"]),
    ("plan nodes", ["plan", "--nodes", "2", "--min-nodes", "3"], ["--min-nodes 3 is more than --nodes (2)"]),
    ("plan plot under a file", ["plan", "--runs", "1", "--plot", "afile/chart.svg"],
     ["--plot afile/chart.svg: cannot write it (Not a directory)"]),
    ("zones neither zones nor region", ["zones", "--accelerator", "nvidia-l4", "--machine-type", "g2-standard-8"],
     ["give --zones or --region (one of them)"]),
    ("zones wrong GPU", ["zones", "--accelerator", "nvidia-tesla-t4", "--machine-type", "g2-standard-8",
                         "--zones", "us-central1-a"], ["g2-standard-8 carries nvidia-l4, not nvidia-tesla-t4"]),
    ("zones unknown zone form", ["zones", "--accelerator", "nvidia-l4", "--machine-type", "g2-standard-8",
                                 "--zones", "us-central1-a,US-EAST1"],
     ["--zones: 'US-EAST1' is not a zone name such as us-central1-a"]),
    ("zones a zone as region", ["zones", "--accelerator", "nvidia-l4", "--machine-type", "g2-standard-8",
                                "--region", "us-central1-a"],
     ["--region us-central1-a is a zone: give its region (us-central1) or --zones us-central1-a"]),
    ("demo binary scenario", ["demo", "--scenario", "binary.yaml"], ["binary.yaml: invalid scenario",
                                                                     "not UTF-8 text (byte 0)"]),
    ("demo --job shell-string command", ["demo", "--job", "shell.yaml"],
     ["trainer.command: must be an argv list such as [python, train.py], not a shell string"]),
    ("demo missing scenario", ["demo", "--scenario", "missing.yaml"], ["missing.yaml: invalid scenario",
                                                                       "cannot read: No such file or directory"]),
    ("demo scenario YAML error", ["demo", "--scenario", "syntax.yaml"], ["not valid YAML", "line 3, column 4", "^"]),
    ("demo bad scenario", ["demo", "--scenario", "scenario.yaml"], ["scenario.yaml: invalid scenario",
                                                                    "zones[0]: Input should be"]),
    ("demo --out under a file", ["demo", "--out", "afile/out"],
     ["afile/out: cannot make that folder (Not a directory)"]),
    ("demo --out of an earlier run", ["demo", "--out", "earlier-run"],
     ["earlier-run: an earlier run's output is there (checkpoints, summary.json), and this run would resume its "
      "checkpoints: give a new folder, or remove that one"]),
    ("demo bad project", ["demo", "--project", "Not_A_Project"], ["--project 'Not_A_Project' is not a project ID"]),
    ("demo --out at a file", ["demo", "--out", "afile"], ["afile is a file: give a folder (a new or empty one)"]),
    # A `jobs` subcommand given at the top is pointed at, as it can be run (`python -m respawn` here).
    *[(f"top-level {name}", [name, "x"], [f"no command {name!r} at the top: it is `{sys.executable} -m respawn jobs "
                                          f"{name}`"]) for name in ("validate", "describe", "list")],
]


def offline_env(tmp_path: Path) -> dict[str, str]:
    """No credentials and no emulator: whatever would reach Google Cloud fails at once, and says so."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "FIRESTORE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")}
    env.update({"CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "HOME": str(tmp_path), "NO_GCE_CHECK": "True",
                "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "COLUMNS": "200"})
    return env


def respawn(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "respawn", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


def respawn_each(argvs: list[list[str]], cwd: Path, env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """Each command line, a few processes at a time (each mostly waits on its imports)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda argv: respawn(argv, cwd, env), argvs))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("bad-inputs")
    (where / "folder").mkdir()
    (where / "folder" / "train.py").write_text("print('hi')\n")
    (where / "afile").write_text("a regular file\n")
    (where / "earlier-run" / "checkpoints").mkdir(parents=True)
    (where / "earlier-run" / "summary.json").write_text("{}")
    (where / "syntax.yaml").write_text("id: err-job\nzones: [us-central1-a, us-central1-b\n  x: y\n")
    (where / "schema.yaml").write_text(yaml.safe_dump({**SPEC, "zones": ["US-CENTRAL1-A"], "max_restart": 3}))
    shell = yaml.safe_dump({**SPEC, "trainer": {"command": "python train.py --lr [0.1]"}})
    (where / "shell.yaml").write_text(shell)
    (where / "list.yaml").write_text("- a\n- b\n")
    (where / "binary.yaml").write_bytes(b"\xff\xfe\x00not text")
    (where / "empty.yaml").write_text("# nothing yet\n")
    (where / "scenario.yaml").write_text("name: s\nzones: [3]\n")
    (where / "labels.yaml").write_text(yaml.safe_dump({**SPEC, "labels": {f"k{i}": "v" for i in range(63)}}))
    return where


def forked_each(forks, argvs: list[list[str]], cwd: Path, env: dict[str, str]) -> list[subprocess.CompletedProcess]:
    """Each command line as a process forked from the fork server, a few at a time."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda argv: forks.run(argv, cwd, env), argvs))


@pytest.fixture(scope="module")
def offline_env_home(tmp_path_factory) -> dict[str, str]:
    return offline_env(tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def offline_runs(workspace, offline_env_home, respawn_forks) -> dict[str, subprocess.CompletedProcess]:  # noqa: F811
    runs = forked_each(respawn_forks, [argv for _, argv, _ in OFFLINE], workspace, offline_env_home)
    return {case[0]: r for case, r in zip(OFFLINE, runs)}


# One case of each kind, run as `python -m respawn` itself: a click usage error, a spec file's, the hint at the top,
# the demo (a process of its own, sim.demo, that respawn execs), a rejected path, plan's, chaos's and doctor's own.
REAL = ["no subcommand argument", "validate schema error", "top-level validate", "demo bad scenario",
        "pack output under a file", "plan nodes", "chaos timeout", "doctor timeout"]


def test_a_forked_run_says_what_python_m_respawn_says(offline_runs, workspace, offline_env_home):
    for case, real in zip(REAL, respawn_each([next(c[1] for c in OFFLINE if c[0] == case) for case in REAL],
                                             workspace, offline_env_home)):
        forked = offline_runs[case]
        assert (real.returncode, real.stdout, real.stderr) == (forked.returncode, forked.stdout, forked.stderr), case


def assert_told(r: subprocess.CompletedProcess, said: list[str], code: int = 2) -> None:
    told = r.stdout + r.stderr
    assert "Traceback" not in told, told
    assert r.returncode == code, told
    for words in said:
        assert words in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 12, r.stderr  # a line or a short list, not a page


@pytest.mark.parametrize("case", [c[0] for c in OFFLINE])
def test_bad_input_is_named_in_a_line_with_exit_2(offline_runs, case):
    said = next(c[2] for c in OFFLINE if c[0] == case)
    assert_told(offline_runs[case], said)


def test_every_subcommand_is_driven_with_bad_input():
    from typer.main import get_command

    from respawn.app.cli import app

    root = get_command(app)
    commands = {f"jobs {n}" for n in root.commands["jobs"].commands} | {n for n in root.commands if n != "jobs"}
    driven = {" ".join(argv[:2]) if argv[0] == "jobs" else argv[0] for _, argv, _ in OFFLINE}
    assert commands <= driven, commands - driven


def test_a_shell_string_command_keeps_its_example_when_registered_too(offline_runs):
    # Rich would read "[python, train.py]" as markup and print "such as , not a shell string".
    assert "such as , not" not in offline_runs["register shell-string command"].stderr


def test_help_is_readable_at_80_columns(workspace, tmp_path, respawn_forks):  # noqa: F811
    env = {**offline_env(tmp_path), "COLUMNS": "80"}
    from typer.main import get_command

    from respawn.app.cli import app

    root = get_command(app)
    argvs = [["plan"], ["zones"], ["chaos"], ["doctor"], *(["jobs", n] for n in root.commands["jobs"].commands)]
    for argv, r in zip(argvs, forked_each(respawn_forks, [[*argv, "--help"] for argv in argvs], workspace, env)):
        assert r.returncode == 0, r.stderr
        assert "…" not in r.stdout, r.stdout  # an option name cut short
        assert max(map(len, r.stdout.splitlines())) <= 80, r.stdout
        params = root.commands[argv[0]]
        for name in argv[1:]:
            params = params.commands[name]
        for option in (o for p in params.params for o in p.opts if o.startswith("--")):
            assert option in r.stdout, (argv, option)


def test_a_scenarios_zones_may_be_names_alone():
    from sim.demo.scenario import parse_scenario

    sc = parse_scenario({"name": "s", "zones": ["us-central1-a", {"name": "us-central1-b", "capacity": []}]})
    assert [(z.name, z.capacity) for z in sc.zones] == [("us-central1-a", []), ("us-central1-b", [])]


def test_zones_offline_says_what_to_do_and_the_offline_price(workspace, tmp_path):
    r = respawn(["zones", "--accelerator", "nvidia-l4", "--machine-type", "g2-standard-8", "--region", "us-central1"],
                workspace, offline_env(tmp_path))
    assert "Traceback" not in r.stderr and r.returncode == 1
    assert ("could not list the zones of us-central1: no Google Cloud credentials to look with: run `gcloud auth "
            "application-default login` and give --project; or name them with --zones") in r.stderr
    assert "g2-standard-8 in us-central1: Spot $" in r.stderr and "/h (offline table of " in r.stderr
    r = respawn(["zones", "--accelerator", "nvidia-l4", "--machine-type", "g2-standard-8", "--zones",
                 "us-central1-a"], workspace, offline_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "g2-standard-8 in us-central1: Spot $" in r.stderr
    # The table's Spot price column shows the price the note gives, marked as the offline table's, not "—".
    price = r.stderr.split("g2-standard-8 in us-central1: Spot ")[1].split("/h")[0]
    row = next(line for line in r.stdout.splitlines() if "us-central1-a" in line)
    assert f"{price}/h (offline table)" in row, r.stdout


def test_unknown_jobs_and_an_unwritable_report_on_the_emulator(firestore_db, project, workspace,
                                                               respawn_forks):  # noqa: F811
    env = {**os.environ, "COLUMNS": "200"}
    argvs = [["jobs", "describe", "nope"], ["jobs", "events", "nope"], ["jobs", "cancel", "nope"],
             ["jobs", "report", "nope"], ["jobs", "logs", "nope"], ["jobs", "resume", "nope", "--budget", "5"],
             ["chaos", "nope", "--yes"]]
    runs = forked_each(respawn_forks, [[*argv, "--project", project] for argv in argvs], workspace, env)
    for r in runs:
        # The hint names respawn as this test started it, so that it can be run as printed.
        assert_told(r, [f"no job 'nope'; `{sys.executable} -m respawn jobs list` shows the registered jobs"], code=1)
    real = respawn([*argvs[0], "--project", project], workspace, env)  # a lookup as `python -m respawn` itself
    assert (real.returncode, real.stdout, real.stderr) == (runs[0].returncode, runs[0].stdout, runs[0].stderr)
    (workspace / "job.yaml").write_text(yaml.safe_dump(SPEC))

    def forked(argv: list[str]) -> subprocess.CompletedProcess:
        return respawn_forks.run([*argv, "--project", project], workspace, env)

    assert forked(["jobs", "register", "job.yaml"]).returncode == 0
    assert_told(forked(["jobs", "report", "err-job", "-o", "afile/report.html"]),
                ["--output afile/report.html: cannot write it (Not a directory)"])
    # The default ./report.html: where it went, said whole.
    r = forked(["jobs", "report", "err-job"])
    assert r.returncode == 0, r.stderr
    assert f"report written to {workspace / 'report.html'}\n" in r.stdout and (workspace / "report.html").is_file()
    assert firestore_db.collection(schema.JOBS).document("err-job").get().exists


def test_describe_prints_real_characters(firestore_db, project, workspace, respawn_forks):  # noqa: F811
    env = {**os.environ, "COLUMNS": "200"}
    (workspace / "job.yaml").write_text(yaml.safe_dump(SPEC))
    assert respawn_forks.run(["jobs", "register", "job.yaml", "--project", project], workspace, env).returncode == 0
    r = respawn_forks.run(["jobs", "describe", "err-job", "--project", project], workspace, env)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^recovery strategy +restart_in_place → next_zone *$", r.stdout, re.M), r.stdout
    assert "\\u2192" not in r.stdout
