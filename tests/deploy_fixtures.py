"""Running cloudbuild.yaml without a cloud: a recording stand-in for `gcloud`, and a runner for the build's steps.

The stand-in (tests/gcloud_standin.py run as a script, through a `gcloud` wrapper put first on PATH) appends each
invocation to a JSON-lines log, and keeps a small state file so that `describe`/`list` answer from what earlier calls
created: a second build run sees what the first made. `create` of something that exists fails with ALREADY_EXISTS,
like the real API. The runner reads cloudbuild.yaml, applies Cloud Build's substitutions (`$$` is a literal `$`, any
other `$NAME` must be a known substitution), and runs each step's entrypoint and args with the step's environment.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.gcloud_standin import PROJECT_NUMBER, SINK_WRITER  # noqa: F401 - the tests' too

ROOT = Path(__file__).resolve().parent.parent
CLOUDBUILD = ROOT / "cloudbuild.yaml"
STANDIN = ROOT / "tests" / "gcloud_standin.py"
SELF_TEST_STEP = "self-test"

# ------------------------------------------------------------------------------------------------ the runner


class SubstitutionError(ValueError):
    pass


_REF = re.compile(r"\$(\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def substitute(text: str, subs: dict[str, str]) -> str:
    """Cloud Build's substitution: `$$` → `$`; `$NAME` / `${NAME}` → its value; any other `$` use is an error."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if text[i] == "$":
            m = _REF.match(text, i)
            name = m and (m.group(2) or m.group(3))
            if not name or name not in subs:
                raise SubstitutionError(f"unescaped or unknown substitution at {text[i:i + 30]!r}: write $$ for a "
                                        "literal $ (Cloud Build rejects unknown substitutions)")
            out.append(subs[name])
            i = m.end()
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def referenced(text: str) -> set[str]:
    names = set()
    for m in _REF.finditer(text.replace("$$", "")):
        names.add(m.group(2) or m.group(3))
    return names


def load_build() -> dict:
    import yaml

    return yaml.safe_load(CLOUDBUILD.read_text())


def substitutions(build: dict, project: str, bucket: str, build_id: str, **overrides: str) -> dict[str, str]:
    subs = {"PROJECT_ID": project, "BUILD_ID": build_id, "LOCATION": "global", "PROJECT_NUMBER": PROJECT_NUMBER}
    user = dict(build.get("substitutions") or {})
    user["_CHECKPOINT_BUCKET"] = bucket
    user.update(overrides)
    for key, value in user.items():  # dynamicSubstitutions: user values may reference built-ins
        subs[key] = substitute(str(value), subs)
    return subs


@dataclass
class StepResult:
    id: str
    rc: int
    stdout: str
    stderr: str


class Standin:
    """A workspace (a copy of the uploaded source) plus the stand-in's bin dir, state and logs."""

    def __init__(self, tmp: Path, state: dict | None = None):
        self._at(tmp)
        self.bin.mkdir(parents=True, exist_ok=True)
        self.state_path.write_text(json.dumps(state if state is not None else seeded_state()))
        wrapper = self.bin / "gcloud"
        # -S: no site module (the venv's .pth files, the editable install's finder: two thirds of a call's CPU, and a
        # build makes some 190 calls); the stand-in imports the standard library only, and adds the site itself for
        # the one call kind that reads YAML
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -S {STANDIN} \"$@\"\n")
        wrapper.chmod(0o755)

    def _at(self, tmp: Path) -> None:
        self.tmp = Path(tmp)
        self.bin, self.state_path = self.tmp / "bin", self.tmp / "gcloud-state.json"

    @classmethod
    def left_in(cls, tmp: Path) -> "Standin":
        """The stand-in an earlier one left in `tmp`, its state as the calls made to it left it."""
        standin = cls.__new__(cls)
        standin._at(tmp)
        return standin

    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def env(self, log: Path, step_env: list[str]) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        env = {"PATH": f"{self.bin}:{venv_bin}:/usr/bin:/bin", "HOME": str(self.tmp / "home"),
               "STANDIN_STATE": str(self.state_path), "STANDIN_LOG": str(log), "LANG": "C.UTF-8"}
        for item in step_env:
            key, _, value = item.partition("=")
            env[key] = value
        return env


def seeded_state(bucket: str = "ckpt-bucket", secret: str = "respawn-slack-webhook",
                 project: str = "respawn-proj") -> dict:
    """What the user creates by hand before the build (docs/deploy.md): the project, Firestore, the bucket, the Slack
    secret."""
    return {"projects": {project: {"projectNumber": PROJECT_NUMBER}},
            "firestore databases": {"(default)": {"locationId": "nam5"}},
            "storage buckets": {f"gs://{bucket}": {"uniform_bucket_level_access": True}},
            "secrets": {secret: {}}}


def copy_source(dst: Path) -> Path:
    """What `gcloud builds submit` uploads: the files git tracks or would track (.gitignore applies)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def standin_steps(build: dict) -> list[dict]:
    """Every step but the self-test, which probes the deployed services themselves (its part in the tests is
    `respawn doctor` against the local stand-ins: tests/test_selftest.py)."""
    return [s for s in build["steps"] if s["id"] != SELF_TEST_STEP]


def run_steps(build: dict, workspace: Path, standin: Standin, subs: dict[str, str], log: Path,
              only: set[str] | None = None) -> list[StepResult]:
    """Run the steps in file order (a valid order: waitFor only names earlier steps); stop at the first failure."""
    results = []
    global_env = [substitute(e, subs) for e in (build.get("options") or {}).get("env", [])]
    for step in standin_steps(build):
        if only is not None and step["id"] not in only:
            continue
        args = [substitute(a, subs) for a in step.get("args", [])]
        entry = step.get("entrypoint") or "gcloud"
        env = standin.env(log, global_env + [substitute(e, subs) for e in step.get("env", [])])
        cmd = ["bash", *args] if entry == "bash" else [str(standin.bin / "gcloud"), *args]
        p = subprocess.run(cmd, cwd=workspace, env=env, capture_output=True, text=True, timeout=300)
        results.append(StepResult(step["id"], p.returncode, p.stdout, p.stderr))
        if p.returncode != 0:
            break
    return results


def calls(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------- the real CLI's surface


@functools.cache
def cli_tree() -> dict:
    """gcloud's own static command tree (commands and their flags), shipped with the Google Cloud CLI: read once a
    process (a 6 MB Python file, a second to compile); the callers only read it."""
    gcloud = shutil.which("gcloud")
    if not gcloud:
        raise RuntimeError("gcloud is not on PATH: install the Google Cloud CLI (google-cloud-cli) to check the build")
    sdk = Path(os.path.realpath(gcloud)).parent.parent
    path = sdk / "data" / "cli" / "gcloud_completions.py"
    if not path.exists():
        raise RuntimeError(f"{path} is missing: the Google Cloud CLI install lacks its static command tree")
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["STATIC_COMPLETION_CLI_TREE"]


def check_against_cli(argv: list[str], tree: dict) -> list[str]:
    """Problems with one invocation: an unknown command, an unknown flag, or a value flag without `=value`."""
    node, path = tree, []
    global_flags = dict(tree.get("flags", {}))
    positionals = [a for a in argv if not a.startswith("-")]
    for word in positionals:
        if word in node.get("commands", {}):
            node = node["commands"][word]
            path.append(word)
            global_flags.update({k: v for k, v in node.get("flags", {}).items()})
        else:
            break
    problems = []
    if node.get("commands") or not path:
        problems.append(f"`gcloud {' '.join(positionals[:len(path) + 1])}` is not a complete gcloud command")
    flags = {**tree.get("flags", {}), **node.get("flags", {})}
    for a in argv:
        if not a.startswith("--"):
            continue
        key, eq, _ = a.partition("=")
        if key not in flags:
            problems.append(f"gcloud {' '.join(path)}: unknown flag {key}")
        elif flags[key] != "bool" and not eq:
            problems.append(f"gcloud {' '.join(path)}: {key} takes a value; pass it as {key}=VALUE")
    return problems


# Run by the real `gcloud` wrapper in place of its lib/gcloud.py (CLOUDSDK_PYTHON_ARGS="-S -m ..."): the same
# interpreter, flags and environment the wrapper gives gcloud, and gcloud's own main() once per command line, in one
# process (each command's surface is loaded once, not once per call). Each command's stderr follows its marker line.
_PARSE_DRIVER = """import json, runpy, sys
gcloud_py, todo = sys.argv[1], sys.argv[2]
sys.argv = [gcloud_py]
g = runpy.run_path(gcloud_py, run_name="gcloud")  # its module body: sys.path as gcloud.py sets it
sys.path = g["reorder_sys_path"](sys.path)
g["_fix_google_module"]()
from googlecloudsdk import gcloud_main
cli = gcloud_main.CreateCLI([])
codes = []
for i, argv in enumerate(json.loads(open(todo).read())):
    sys.stdout.flush()
    sys.stderr.write(MARK.format(i))
    sys.stderr.flush()
    sys.argv = [gcloud_py, *argv]
    try:
        gcloud_main.main(gcloud_cli=cli)
        codes.append(0)
    except SystemExit as exc:
        codes.append(exc.code if isinstance(exc.code, int) else int(exc.code is not None))
    sys.stdout.flush()
    sys.stderr.flush()
print(MARK.format("codes") + json.dumps(codes))
"""
_PARSE_MARK = "\n@@gcloud-parse {}@@\n"


def gcloud_parse_errors(argvs: list[list[str]], config_dir: Path, cwd: Path | None = None) -> list[str]:
    """Each invocation through the real gcloud's own argument parsing, offline: with no account and no metadata
    server to ask, a command whose arguments parse stops at the missing credentials (exit 1) before any request;
    one that does not parse exits 2 naming the argument (a -from-file flag's file is read while parsing). One line
    per invocation that does not parse. All of them in one gcloud process (_PARSE_DRIVER)."""
    gcloud = shutil.which("gcloud")
    if not gcloud:
        raise RuntimeError("gcloud is not on PATH: install the Google Cloud CLI (google-cloud-cli) to check the build")
    config_dir.mkdir(parents=True, exist_ok=True)
    driver = config_dir / "parse-driver"
    driver.mkdir(exist_ok=True)
    (driver / "gcloud_parse_driver.py").write_text(f"MARK = {_PARSE_MARK!r}\n{_PARSE_DRIVER}")
    todo = driver / "argvs.json"
    todo.write_text(json.dumps(argvs))
    env = {**os.environ, "CLOUDSDK_CONFIG": str(config_dir), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
           "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false", "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1",
           "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
           "CLOUDSDK_PYTHON_ARGS": "-S -m gcloud_parse_driver", "PYTHONPATH": str(driver)}
    for name in ("CLOUDSDK_CORE_ACCOUNT", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", "GOOGLE_APPLICATION_CREDENTIALS"):
        env.pop(name, None)
    work = cwd or config_dir  # where the calls' relative paths (--config-from-file, --source) are read
    p = subprocess.run([gcloud, str(todo)], cwd=work, env=env, capture_output=True, text=True,
                       timeout=120 + 10 * len(argvs), stdin=subprocess.DEVNULL)
    done = p.stdout.rpartition(_PARSE_MARK.format("codes"))[2]
    if p.returncode != 0 or not done.strip():
        raise RuntimeError(f"the gcloud parse driver failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    codes = json.loads(done)
    told = p.stderr.split("@@gcloud-parse ")
    stderrs = {int(part.split("@@", 1)[0]): part.split("@@\n", 1)[1] for part in told[1:]}
    assert len(codes) == len(argvs) == len(stderrs), (len(codes), len(argvs), len(stderrs))
    problems = []
    for i, (argv, code) in enumerate(zip(argvs, codes)):
        if code == 2:
            lines = stderrs[i].splitlines()
            error = next((ln for ln in lines if ln.startswith("ERROR:")), stderrs[i].strip()[-300:])
            problems.append(f"gcloud {' '.join(argv)}: {error}")
    return problems
