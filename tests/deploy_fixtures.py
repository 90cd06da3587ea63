"""Running cloudbuild.yaml without a cloud: a recording stand-in for `gcloud`, and a runner for the build's steps.

The stand-in (this file run as a script, through a `gcloud` wrapper put first on PATH) appends each invocation to a
JSON-lines log, and keeps a small state file so that `describe`/`list` answer from what earlier calls created: a
second build run sees what the first made. `create` of something that exists fails with ALREADY_EXISTS, like the
real API. The runner reads cloudbuild.yaml, applies Cloud Build's substitutions (`$$` is a literal `$`, any other
`$NAME` must be a known substitution), and runs each step's entrypoint and args with the step's environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLOUDBUILD = ROOT / "cloudbuild.yaml"
SINK_WRITER = "serviceAccount:service-123456789@gcp-sa-logging.iam.gserviceaccount.com"
PROJECT_NUMBER = "123456789"  # the stand-in project's number (Cloud Build's $PROJECT_NUMBER too)
SELF_TEST_STEP = "self-test"

# The verbs the stand-in understands. A verb that changes nothing is "read"; the rest are recorded as mutations.
READ_VERBS = {"describe", "list"}
CREATE_OR_UPDATE_VERBS = {"deploy", "update", "enable", "undelete", "add-iam-policy-binding",
                          "add-invoker-policy-binding", "cp"}
VERBS = READ_VERBS | CREATE_OR_UPDATE_VERBS | {"create", "delete", "remove-iam-policy-binding"}


# ---------------------------------------------------------------------------------------------- the stand-in


@dataclass
class Call:
    argv: list[str]
    group: str  # e.g. "pubsub topics"
    verb: str
    name: str  # the resource the call is about
    flags: dict[str, list[str]] = field(default_factory=dict)
    positionals: list[str] = field(default_factory=list)


def parse(argv: list[str]) -> Call:
    positionals = [a for a in argv if not a.startswith("-")]
    flags: dict[str, list[str]] = {}
    for a in argv:
        if a.startswith("--"):
            key, _, value = a[2:].partition("=")
            flags.setdefault(key, []).append(value)
    verb_at = next((i for i, a in enumerate(positionals) if a in VERBS), None)
    if verb_at is None:
        raise SystemExit(f"gcloud stand-in: no known verb in {argv}")
    group, verb, rest = " ".join(positionals[:verb_at]), positionals[verb_at], positionals[verb_at + 1:]
    if group == "scheduler jobs" and verb in ("create", "update") and rest[:1] == ["pubsub"]:
        rest = rest[1:]
    name = rest[0] if rest else ""
    if group == "iam service-accounts":
        name = name.split("@")[0]
    if group == "firestore databases":
        name = (flags.get("database") or ["(default)"])[0]
    if group == "firestore indexes composite" and verb == "create":
        name = json.dumps([flags.get("collection-group", [""])[0], flags.get("field-config", [])])
    if group == "monitoring dashboards" and verb == "create":  # Cloud Monitoring names it; the stand-in by its title
        name = json.loads(Path(flags["config-from-file"][-1]).read_text())["displayName"]
    return Call(argv, group, verb, name, flags, rest)


def _value(resource: dict, fmt: str) -> str:
    m = re.fullmatch(r"value\((\w+)\)", fmt)
    if not m:
        return json.dumps(resource)
    value = resource.get(m.group(1), "")
    return str(value) if value not in (None, False) else ""


def standin(argv: list[str]) -> int:
    state_path, log_path = Path(os.environ["STANDIN_STATE"]), Path(os.environ["STANDIN_LOG"])
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    call = parse(argv)
    kind = state.setdefault(call.group, {})
    existed = call.name in kind and not kind[call.name].get("deleted")
    with open(log_path, "a") as log:
        log.write(json.dumps({"argv": argv, "group": call.group, "verb": call.verb, "name": call.name,
                              "existed": existed}) + "\n")
    rc, out, err = 0, "", ""
    flags = {k: v[-1] for k, v in call.flags.items()}
    if call.verb == "describe":
        if call.name in kind:
            out = _value(kind[call.name], flags.get("format", ""))
        else:
            rc, err = 1, f"ERROR: (gcloud.{call.group.replace(' ', '.')}.describe) NOT_FOUND: {call.name}"
    elif call.verb == "list":
        if call.group == "firestore indexes composite":
            out = json.dumps([{"name": f"projects/p/databases/(default)/collectionGroups/{json.loads(n)[0]}/indexes/i{i}",
                               "fields": r["fields"]} for i, (n, r) in enumerate(kind.items())])
        elif flags.get("format") == "value(name)":
            out = "\n".join(n for n, r in kind.items() if not r.get("deleted"))
        else:
            out = json.dumps(list(kind))
    elif call.verb == "create":
        if existed or call.name in kind:
            rc, err = 1, f"ERROR: (gcloud.{call.group.replace(' ', '.')}.create) ALREADY_EXISTS: {call.name}"
        else:
            kind[call.name] = {"flags": flags}
            if call.group == "firestore indexes composite":
                kind[call.name]["fields"] = [
                    {"fieldPath": c["field-path"], "order": c.get("order", "ascending").upper()}
                    for c in (dict(kv.split("=", 1) for kv in fc.split(",")) for fc in call.flags["field-config"])]
            if call.group == "logging sinks":
                kind[call.name]["writerIdentity"] = SINK_WRITER
    elif call.verb == "delete":
        kind.pop(call.name, None)
    elif call.verb == "cp":
        src, dst = call.positionals[0], call.positionals[1]
        if not Path(src).is_file():
            rc, err = 1, f"ERROR: (gcloud.storage.cp) {src} not found"
        else:
            state.setdefault("storage objects", {})[dst] = {"size": Path(src).stat().st_size}
    elif call.verb in ("update", "undelete") and call.group in ("iam roles", "logging sinks", "scheduler jobs") \
            and call.name not in kind:
        rc, err = 1, f"ERROR: (gcloud.{call.group.replace(' ', '.')}.{call.verb}) NOT_FOUND: {call.name}"
    elif call.verb == "undelete":
        kind[call.name]["deleted"] = False
    elif call.verb in ("add-iam-policy-binding", "add-invoker-policy-binding"):
        if call.group not in ("projects",) and call.name not in kind and call.group != "functions":
            rc, err = 1, f"ERROR: (gcloud.{call.group.replace(' ', '.')}.{call.verb}) NOT_FOUND: {call.name}"
        else:
            bindings = state.setdefault("bindings", [])
            entry = [call.group, call.name, flags.get("member", ""), flags.get("role", "roles/run.invoker")]
            if flags.get("condition-from-file"):  # a conditioned binding: the condition's expression goes with it
                entry.append(yaml.safe_load(Path(flags["condition-from-file"]).read_text())["expression"])
            if entry not in bindings:
                bindings.append(entry)
    elif call.verb == "remove-iam-policy-binding":
        entry = [call.group, call.name, flags.get("member", ""), flags.get("role", "")]
        bindings = state.setdefault("bindings", [])
        if entry in bindings:  # --condition=None: the unconditioned binding only
            bindings.remove(entry)
        else:
            rc, err = 1, "ERROR: Policy binding with the specified principal, role, and condition not found!"
    else:  # deploy, update, enable, ttls update: create or update
        kind.setdefault(call.name, {})["flags"] = flags
    state_path.write_text(json.dumps(state, indent=1))
    if out:
        print(out)
    if err:
        print(err, file=sys.stderr)
    return rc


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
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
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


def cli_tree() -> dict:
    """gcloud's own static command tree (commands and their flags), shipped with the Google Cloud CLI."""
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


def gcloud_parse_errors(argvs: list[list[str]], config_dir: Path, cwd: Path | None = None) -> list[str]:
    """Each invocation through the real gcloud's own argument parsing, offline: with no account and no metadata
    server to ask, a command whose arguments parse stops at the missing credentials (exit 1) before any request;
    one that does not parse exits 2 naming the argument (a -from-file flag's file is read while parsing). One line
    per invocation that does not parse."""
    gcloud = shutil.which("gcloud")
    if not gcloud:
        raise RuntimeError("gcloud is not on PATH: install the Google Cloud CLI (google-cloud-cli) to check the build")
    env = {**os.environ, "CLOUDSDK_CONFIG": str(config_dir), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
           "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false", "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1",
           "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1"}
    for name in ("CLOUDSDK_CORE_ACCOUNT", "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE", "GOOGLE_APPLICATION_CREDENTIALS"):
        env.pop(name, None)
    config_dir.mkdir(parents=True, exist_ok=True)
    work = cwd or config_dir  # where the calls' relative paths (--config-from-file, --source) are read

    def parse(argv: list[str]) -> str | None:
        p = subprocess.run([gcloud, *argv], cwd=work, env=env, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        if p.returncode != 2:
            return None
        error = next((ln for ln in p.stderr.splitlines() if ln.startswith("ERROR:")), p.stderr.strip()[-300:])
        return f"gcloud {' '.join(argv)}: {error}"

    with ThreadPoolExecutor(max_workers=2) as pool:
        return [e for e in pool.map(parse, argvs) if e]


if __name__ == "__main__":
    sys.exit(standin(sys.argv[1:]))
