"""The function source as uploaded (deploy/stage.py): it imports from itself alone, declares what it imports, and
serves events through the Functions Framework."""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from deploy import stage
from respawn import deployment
from tests.deploy_fixtures import ROOT

# Runs in a fresh interpreter whose working directory is elsewhere, as the Functions Framework would: loads the
# staged main.py, serves one CloudEvent, and reports where every Respawn module came from.
SERVE = r"""
import base64, json, sys
import functions_framework
source, target, body = sys.argv[1], sys.argv[2], sys.argv[3]
app = functions_framework.create_app(target=target, source=source, signature_type="cloudevent")
event = {"specversion": "1.0", "type": "google.cloud.pubsub.topic.v1.messagePublished", "source": "//pubsub/test",
         "id": "evt-1", "datacontenttype": "application/json",
         "data": {"message": {"data": base64.b64encode(body.encode()).decode(), "messageId": "1"},
                  "subscription": "projects/p/subscriptions/s"}}
r = app.test_client().post("/", json=event, headers={"ce-specversion": "1.0"})
mods = {n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())
        if n.split(".")[0] in ("functions", "respawn") and getattr(m, "__file__", None)}
print(json.dumps({"status": r.status_code, "modules": mods}))
"""


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    return stage.stage(ROOT, tmp_path_factory.mktemp("source") / "function-source")


def _serve(staged: Path, target: str, body: dict, env: dict[str, str], cwd: Path) -> dict:
    p = subprocess.run([sys.executable, "-c", SERVE, str(staged / "main.py"), target, json.dumps(body)],
                       cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.strip().splitlines()[-1])
    outside = {n: f for n, f in result["modules"].items() if not Path(f).resolve().is_relative_to(staged.resolve())}
    assert not outside, f"modules loaded from outside the uploaded source: {outside}"
    return result | {"log": p.stdout + p.stderr}


def test_staged_layout(staged):
    assert (staged / "main.py").is_file() and (staged / "requirements.txt").is_file()
    for rel in ("respawn/control/main.py", "respawn/control/adapters/compute.py", "respawn/schema.py", deployment.STARTUP_SCRIPT):
        assert (staged / rel).is_file(), rel
    assert not list(staged.rglob("__pycache__"))
    # The node side and the CLI are not part of the control plane's upload.
    assert not (staged / "respawn" / "agent").exists() and not (staged / "respawn" / "app").exists()
    tree = ast.parse((staged / "main.py").read_text())
    exported = {a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert exported == {f.entry_point for f in deployment.FUNCTIONS}


def test_startup_script_travels_with_the_control_plane(staged):
    code = "from respawn import deployment; print(deployment.startup_script())"
    p = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(staged)!r}); {code}"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == (ROOT / deployment.STARTUP_SCRIPT).read_text().strip()


class _Slack(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        self.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def test_uploaded_source_serves_an_alert_to_slack(staged, tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _Slack)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {"PATH": "/usr/bin:/bin", "SLACK_WEBHOOK_URL": f"http://127.0.0.1:{server.server_port}/hook",
               "RESPAWN_PROJECT": "respawn-test"}
        alert = {"type": "recovered", "severity": "info", "job_id": "llm-7b", "at": "2025-01-01T00:00:00+00:00",
                 "message": "recovered in us-central1-b", "attempt": 2, "restarts": 1, "cause": "preempted"}
        result = _serve(staged, "on_alert", alert, env, tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert result["status"] == 200, result["log"]
    assert len(_Slack.received) == 1 and "llm-7b" in json.dumps(_Slack.received[0])


def test_uploaded_source_serves_a_sweep_against_firestore(staged, tmp_path, firestore_emulator, project):
    env = {"PATH": "/usr/bin:/bin", "FIRESTORE_EMULATOR_HOST": firestore_emulator, "RESPAWN_PROJECT": project}
    result = _serve(staged, "on_sweep", {"task": "sweep"}, env, tmp_path)
    assert result["status"] == 200, result["log"]
    # The sweep reached the store adapter: the lazily imported parts of the control plane are in the upload too.
    assert "respawn.control.adapters.firestore_store" in result["modules"]


# ------------------------------------------------------------------------------ requirements.txt covers imports


def _third_party_imports(source: Path) -> set[str]:
    local = {p.name for p in source.iterdir() if p.is_dir()} | {"main"}
    names = set()
    for path in source.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from google.cloud import firestore`: the imported name may itself be the module.
                names.update(_module_of(node.module, a.name) for a in node.names)
    return {n for n in names if n.split(".")[0] not in local and n.split(".")[0] not in sys.stdlib_module_names}


def _module_of(package: str, name: str) -> str:
    try:
        spec = importlib.util.find_spec(f"{package}.{name}")
    except (ImportError, ValueError):
        spec = None
    return f"{package}.{name}" if spec and spec.origin else package


def _distribution_of(module: str, owners: dict[str, list[str]]) -> str:
    spec = importlib.util.find_spec(module)
    assert spec and spec.origin, f"{module} is not installed here"
    origin = Path(spec.origin).resolve()
    candidates = owners.get(module.split(".")[0], [])
    if len(candidates) == 1:
        return _norm(candidates[0])
    for name in candidates:  # a namespace package (google.*): the distribution that holds the file
        dist = md.distribution(name)
        if any(Path(dist.locate_file(f)).resolve() == origin for f in dist.files or ()):
            return _norm(name)
    raise AssertionError(f"no installed distribution owns {origin} ({module})")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(requirements: list[str]) -> set[str]:
    todo = [_norm(re.split(r"[\s\[<>=!~;@]", r, maxsplit=1)[0]) for r in requirements]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:  # a dependency behind an environment marker that excludes this Python
            continue
        for req in requires:
            if "extra ==" not in req:
                todo.append(_norm(re.split(r"[\s\[<>=!~;(]", req, maxsplit=1)[0]))
    return seen


def test_requirements_cover_every_import_of_the_uploaded_source(staged):
    requirements = [r for r in (staged / "requirements.txt").read_text().splitlines() if r.strip()]
    installed = _closure(requirements)
    missing = {}
    owners = md.packages_distributions()
    for module in sorted(_third_party_imports(staged)):
        dist = _distribution_of(module, owners)
        if dist not in installed:
            missing[module] = dist
    assert not missing, f"imported by the function source but not in requirements.txt (pyproject `functions` extra " \
                        f"or base dependencies): {missing}"


def test_stage_names_a_missing_file(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    with pytest.raises(stage.StageError, match="pyproject.toml is missing"):
        stage.stage(repo, tmp_path / "out")
    (repo / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for rel in ("respawn/__init__.py", "respawn/deployment.py", "functions/__init__.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("")
    with pytest.raises(stage.StageError, match="respawn.control.main is missing"):
        stage.stage(repo, tmp_path / "out")

