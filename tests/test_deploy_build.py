"""cloudbuild.yaml, run step by step against a recording stand-in for gcloud: valid, complete, and idempotent."""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import re
import shutil

import pytest
import yaml

from deploy import agent_zipapp, iam
from respawn import audit, deployment, schema, selftest
from respawn.contract import split_artifact
from tests.deploy_fixtures import (CLOUDBUILD, gcloud_parse_errors, PROJECT_NUMBER, ROOT, SELF_TEST_STEP, SINK_WRITER, Standin,
                                   SubstitutionError, calls, standin_steps,
                                   check_against_cli, cli_tree, copy_source, load_build, referenced, run_steps,
                                   seeded_state, substitute, substitutions)

PROJECT, BUCKET, BUILD_ID = "respawn-proj", "ckpt-bucket", "build-1"
# The node identity pool the build makes by default: respawn-node-1 … respawn-node-8.
NODES = [deployment.service_account_email(a, PROJECT)
         for a in deployment.node_identities(deployment.DEFAULT_NODE_IDENTITIES)]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """The build run twice on one stand-in state: (workspace, standin, calls of run 1, calls of run 2). Made once a
    session by whichever xdist worker asks first, in the session's shared temporary folder; the others wait for it
    and read the same (each worker that ran one of these tests built it anew: 70-90 s apiece under load)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # popen-gwN's parent: this session's, every worker's
    tmp = shared / "deploy-build"
    logs = [tmp / f"run{n}.jsonl" for n in (1, 2)]
    with open(shared / "deploy-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held by the builder until both runs are recorded
        if not (tmp / "built").exists():
            shutil.rmtree(tmp, ignore_errors=True)  # a builder that failed part-way
            build = load_build()
            subs = substitutions(build, PROJECT, BUCKET, BUILD_ID)
            workspace, standin = copy_source(tmp / "workspace"), Standin(tmp)
            for n, log in enumerate(logs, 1):
                results = run_steps(build, workspace, standin, subs, log)
                failed = [r for r in results if r.rc != 0]
                assert not failed, f"run {n}: step {failed[0].id} failed:\n{failed[0].stdout}\n{failed[0].stderr}"
                assert [r.id for r in results] == [s["id"] for s in standin_steps(build)]
            (tmp / "built").touch()
    return tmp / "workspace", Standin.left_in(tmp), calls(logs[0]), calls(logs[1])


def _mutations(run):
    return [c for c in run if c["verb"] not in ("describe", "list")]


def _one(run, group, verb, name):
    found = [c for c in run if c["group"] == group and c["verb"] == verb and c["name"] == name]
    assert len(found) == 1, f"expected one `gcloud {group} {verb} {name}`, got {len(found)}"
    return found[0]["argv"]


def _flag(argv, name):
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert values, f"--{name} missing from {argv}"
    return values


# ------------------------------------------------------------------------------------------------ the YAML itself


def test_yaml_is_a_valid_build_config():
    build = load_build()
    assert set(build) <= {"steps", "substitutions", "options", "timeout", "images", "artifacts", "tags",
                          "serviceAccount", "logsBucket", "availableSecrets"}
    ids = [s["id"] for s in build["steps"]]
    assert len(ids) == len(set(ids)), "step ids must be unique"
    for i, step in enumerate(build["steps"]):
        assert step["name"], f"step {step['id']} has no image"
        assert step.get("entrypoint") in ("bash", "gcloud"), f"step {step['id']}: entrypoint bash or gcloud"
        if step["entrypoint"] == "bash":
            assert step["args"][0] == "-c" and len(step["args"]) == 2, f"step {step['id']}: args must be [-c, SCRIPT]"
        # Running steps in file order must respect every waitFor (the local runner relies on it).
        for dep in step.get("waitFor", []):
            assert dep in ids[:i], f"step {step['id']} waits for {dep}, which is not an earlier step"
    assert build["options"]["logging"] == "CLOUD_LOGGING_ONLY"


def test_substitutions_are_all_defined_and_all_used():
    build = load_build()
    text = CLOUDBUILD.read_text()
    body = text.split("\nsteps:", 1)[1] + "\n".join((build["options"].get("env") or []))
    user = set(build["substitutions"])
    assert {"_PROJECT", "_REGION", "_CHECKPOINT_BUCKET", "_SLACK_SECRET"} <= user
    used = referenced(body)
    assert user <= used, f"substitutions defined but unused (Cloud Build rejects them): {user - used}"
    builtin = {"PROJECT_ID", "BUILD_ID", "PROJECT_NUMBER", "LOCATION"}
    assert used <= user | builtin, f"unknown substitutions (escape a shell $ as $$): {used - user - builtin}"
    # Every step's text substitutes cleanly.
    subs = substitutions(build, PROJECT, BUCKET, BUILD_ID)
    for step in build["steps"]:
        for arg in step["args"]:
            substitute(arg, subs)


def test_substitution_rejects_an_unescaped_shell_variable():
    with pytest.raises(SubstitutionError, match=r"write \$\$"):
        substitute('echo "$HOME"', {"_PROJECT": "p"})
    assert substitute('echo "$$HOME" ${_PROJECT}', {"_PROJECT": "p"}) == 'echo "$HOME" p'


# ----------------------------------------------------------------------------------------------- the first run


def test_every_gcloud_call_is_a_real_command_with_real_flags(deployed):
    _, _, run1, run2 = deployed
    tree = cli_tree()
    problems = sorted({p for c in run1 + run2 for p in check_against_cli(c["argv"], tree)})
    assert not problems, "\n".join(problems)


def test_cli_check_catches_a_wrong_flag():
    tree = cli_tree()
    assert check_against_cli(["functions", "deploy", "f", "--gen2", "--trigger-topc=t"], tree)
    assert check_against_cli(["functions", "deploy", "f", "--region", "r"], tree)  # value flag without =
    assert check_against_cli(["pubsub", "topicz", "create", "t"], tree)
    assert not check_against_cli(["pubsub", "topics", "create", "t", "--project=p"], tree)


def test_every_gcloud_call_parses_in_the_real_gcloud_values_included(deployed, tmp_path):
    """Values, required flags and flags that exclude each other: gcloud's own parser, offline (issue #48 item 4)."""
    workspace, _, run1, run2 = deployed
    shapes: dict[str, list[str]] = {}  # one call per shape: the node identities' grants differ only in a number
    for c in run1 + run2:
        shapes.setdefault(re.sub(r"\d+", "N", " ".join(c["argv"])), c["argv"])
    problems = gcloud_parse_errors(list(shapes.values()), tmp_path / "gcloud", cwd=workspace)  # its -from-file files
    assert not problems, "\n".join(problems)


def test_the_parse_check_catches_a_wrong_value_and_a_missing_flag(tmp_path):
    problems = gcloud_parse_errors([["pubsub", "topics", "create", "t", "--project=p",
                                     "--message-retention-duration=a-week"],
                                    ["scheduler", "jobs", "create", "pubsub", "j", "--project=p", "--topic=t",
                                     "--message-body=x"],  # --schedule is required
                                    ["pubsub", "topics", "create", "t", "--project=p"]], tmp_path / "gcloud")
    assert len(problems) == 2, problems
    assert "message-retention-duration" in problems[0] and "--schedule" in problems[1]


def test_topics_sink_and_writer_grant(deployed):
    _, standin, run1, _ = deployed
    state = standin.state()
    assert set(state["pubsub topics"]) == {deployment.LOG_EVENTS_TOPIC, deployment.ALERTS_TOPIC, deployment.SWEEP_TOPIC}
    argv = _one(run1, "logging sinks", "create", deployment.SINK)
    assert f"pubsub.googleapis.com/projects/{PROJECT}/topics/{deployment.LOG_EVENTS_TOPIC}" in argv
    # The filter is the single definition's, verbatim.
    assert _flag(argv, "log-filter") == [audit.sink_filter(PROJECT)]
    assert ["pubsub topics", deployment.LOG_EVENTS_TOPIC, SINK_WRITER, "roles/pubsub.publisher"] in state["bindings"]


def test_functions_match_the_single_definition_and_their_triggers_exist(deployed):
    _, standin, run1, _ = deployed
    main_src = (ROOT / "functions" / "main.py").read_text()
    defined = {n.name for n in ast.parse(main_src).body if isinstance(n, ast.FunctionDef)}
    topics_created = {c["name"] for c in run1 if c["group"] == "pubsub topics" and c["verb"] == "create"}
    assert {f.name for f in deployment.FUNCTIONS} == set(standin.state()["functions"])
    for fn in deployment.FUNCTIONS:
        argv = _one(run1, "functions", "deploy", fn.name)
        assert "--gen2" in argv and "--retry" in argv, f"{fn.name}: 2nd gen with retries on"
        assert _flag(argv, "entry-point") == [fn.entry_point]
        assert fn.entry_point in defined, f"functions/main.py has no {fn.entry_point}"
        assert _flag(argv, "service-account") == [deployment.service_account_email(fn.service_account, PROJECT)]
        assert _flag(argv, "trigger-service-account") == [deployment.service_account_email(deployment.TRIGGER_SA, PROJECT)]
        for setting in ("memory", "timeout", "concurrency", "max-instances"):
            _flag(argv, setting)
        source = _flag(argv, "source")[0]
        assert source == ".respawn-build/function-source"
        if fn.trigger == "firestore":
            filters = _flag(argv, "trigger-event-filters")
            assert f"type={deployment.JOB_CREATED_EVENT}" in filters and "database=(default)" in filters
            assert _flag(argv, "trigger-event-filters-path-pattern") == [f"document={deployment.JOB_DOCUMENT_PATTERN}"]
            assert deployment.JOB_DOCUMENT_PATTERN.split("/")[0] == schema.JOBS
            assert _flag(argv, "trigger-location") == ["nam5"]  # the database's own location
        else:
            assert _flag(argv, "trigger-topic") == [fn.trigger]
            assert fn.trigger in topics_created
        _one(run1, "functions", "add-invoker-policy-binding", fn.name)
    alert = _one(run1, "functions", "deploy", "respawn-on-alert")
    assert _flag(alert, "set-secrets") == ["SLACK_WEBHOOK_URL=respawn-slack-webhook:latest"]
    assert deployment.ENV_SLACK_WEBHOOK_URL == "SLACK_WEBHOOK_URL"


def test_function_environment(deployed):
    workspace, standin, _, _ = deployed
    env = yaml.safe_load((workspace / ".respawn-build" / "function-env.yaml").read_text())
    assert env[deployment.ENV_PROJECT] == PROJECT
    assert env[deployment.ENV_ALERTS_TOPIC] == deployment.ALERTS_TOPIC
    assert env[deployment.ENV_SWEEP_TOPIC] == deployment.SWEEP_TOPIC  # where the sweep fans out, back to on_sweep
    assert env[deployment.ENV_NODE_IDENTITIES] == ",".join(NODES)
    assert all(isinstance(v, str) for v in env.values()), "env vars files take strings only"
    # The agent zipapp and the wheel, built side by side, uploaded to this build's release folder, and named to
    # the nodes with the digest of exactly the bytes uploaded.
    dist = workspace / ".respawn-build" / "dist"
    uploaded = standin.state()["storage objects"]
    for variable, name in ((deployment.ENV_AGENT, f"respawn-agent-{agent_zipapp.version()}.pyz"),
                           (deployment.ENV_LIBRARY, "respawn-0.1.0-py3-none-any.whl")):
        uri, digest = split_artifact(env[variable])
        assert uri == f"gs://{BUCKET}/{deployment.RELEASES_PREFIX}/{BUILD_ID}/{name}"
        assert digest == hashlib.sha256((dist / name).read_bytes()).hexdigest()
        assert uploaded[uri]["size"] == (dist / name).stat().st_size
    # The build's zipapp is the one deploy/agent_zipapp.py makes from the checkout (the same bytes).
    assert (dist / f"respawn-agent-{agent_zipapp.version()}.pyz").read_bytes() == \
        agent_zipapp.archive_bytes(agent_zipapp.entries())


def test_scheduler_sweep(deployed):
    _, _, run1, _ = deployed
    argv = _one(run1, "scheduler jobs", "create", deployment.SCHEDULER_JOB)
    assert argv[:4] == ["scheduler", "jobs", "create", "pubsub"]
    assert _flag(argv, "topic") == [deployment.SWEEP_TOPIC]
    assert json.loads(_flag(argv, "message-body")[0]) == {"task": "sweep"}
    assert _flag(argv, "schedule") == [deployment.SWEEP_SCHEDULE]


def test_the_last_step_proves_every_path_the_build_made_with_respawn_doctor(deployed):
    _, standin, run1, _ = deployed
    build = load_build()
    step = build["steps"][-1]
    assert step["id"] == SELF_TEST_STEP
    makers = {"sink", "firestore", "scheduler", *(f"fn-{fn.entry_point.replace('_', '-')}" for fn in deployment.FUNCTIONS)}
    assert set(step["waitFor"]) == makers and makers <= {s["id"] for s in build["steps"]}
    script = substitute(step["args"][-1], substitutions(build, PROJECT, BUCKET, BUILD_ID))
    # The build's own wheel, in an environment of its own; then the doctor, its probes waited for long enough.
    assert re.search(r"pip install .*\.respawn-build/dist/\*\.whl", script)
    assert re.search(rf"respawn doctor --project='{PROJECT}' --region='us-central1' --timeout=(\d+)", script)
    # …checking the pool and the secret this build made; the project's roles it reads from the checkout's deploy/.
    assert f"--node-identities='{deployment.DEFAULT_NODE_IDENTITIES}'" in script
    assert f"--slack-secret='{deployment.DEFAULT_SLACK_SECRET}'" in script
    assert "cp -r deploy /tmp/definitions/" in script and "PYTHONPATH=/tmp/definitions " in script
    # The APIs it checks are the ones the apis step enabled: respawn.deployment.APIS, the one list.
    [enabled] = [c["argv"] for c in run1 if c["group"] == "services" and c["verb"] == "enable"]
    assert [a for a in enabled if a.endswith(".googleapis.com")] == list(deployment.APIS)
    assert "--no-probes" not in script
    # Where the functions acknowledge: the self-test's database, which the notifier may write and nothing else.
    _one(run1, "firestore databases", "create", selftest.DATABASE)
    [binding] = [b for b in standin.state()["bindings"] if b[3].endswith("/respawnNotifierSelfTest")]
    assert binding[2] == f"serviceAccount:{deployment.service_account_email(deployment.NOTIFIER_SA, PROJECT)}"
    assert binding[4] == f'resource.name == "projects/{PROJECT}/databases/{selftest.DATABASE}"'


def test_the_sweep_fans_out_to_as_many_invocations_as_the_event_path(deployed):
    _, standin, run1, _ = deployed

    def slots(name: str) -> int:
        argv = _one(run1, "functions", "deploy", name)
        return int(_flag(argv, "concurrency")[0]) * int(_flag(argv, "max-instances")[0])

    # Each job's sweep message is a reconcile of its own on respawn-on-sweep: as many at once as events get, so a
    # job waiting on a slow operation takes one slot, not the sweep.
    assert slots("respawn-on-sweep") >= slots("respawn-on-log-event") >= 80
    # The tick publishes those messages: the controller may publish to the sweep topic, and nowhere else but alerts.
    controller = f"serviceAccount:{deployment.service_account_email(deployment.CONTROLLER_SA, PROJECT)}"
    topics = {b[1] for b in standin.state()["bindings"] if b[0] == "pubsub topics" and b[2] == controller}
    assert topics == {deployment.SWEEP_TOPIC, deployment.ALERTS_TOPIC}
    # A node whose trainer or setup fails wakes the controller there (node_agent/nudge.py): each node identity may
    # publish to the sweep topic, on that topic alone.
    for email in NODES:
        node = f"serviceAccount:{email}"
        assert [b for b in standin.state()["bindings"] if b[0] == "pubsub topics" and b[2] == node] == [
            ["pubsub topics", deployment.SWEEP_TOPIC, node, f"projects/{PROJECT}/roles/respawnNodeSweep"]]


def test_firestore_ttl_on_event_history(deployed):
    _, _, run1, _ = deployed
    argv = _one(run1, "firestore fields ttls", "update", deployment.TTL_FIELD)
    assert _flag(argv, "collection-group") == [schema.EVENTS] and "--enable-ttl" in argv
    assert deployment.TTL_FIELD in schema.JobEvent.model_fields


def test_roles_and_bindings(deployed):
    _, standin, run1, _ = deployed
    state = standin.state()
    for role in iam.roles():
        argv = _one(run1, "iam roles", "create", role.id)
        body = yaml.safe_load((deployed[0] / _flag(argv, "file")[0]).read_text())
        assert body["includedPermissions"] == role.permissions
        bound = [b for b in state["bindings"] if b[3] == f"projects/{PROJECT}/roles/{role.id}"]
        if role.scope == "job-folder":  # the controller grants it on a job's folder when the job takes an identity
            assert bound == [], f"{role.id} is the controller's to grant, on one job's folder; the build bound {bound}"
            continue
        expected = {"project": ("projects", PROJECT), "alerts-topic": ("pubsub topics", deployment.ALERTS_TOPIC),
                    "sweep-topic": ("pubsub topics", deployment.SWEEP_TOPIC),
                    "checkpoint-bucket": ("storage buckets", f"gs://{BUCKET}")}
        own = f"serviceAccount:{deployment.service_account_email(getattr(deployment, role.member.upper() + '_SA'), PROJECT)}" \
            if role.member != "node" else None
        def condition(identity=None):
            return [iam.CONDITIONS[role.condition](PROJECT, BUCKET, identity).expression] if role.condition else []

        if role.scope == "node-service-account":  # on each identity's own account, for the controller
            want = [["iam service-accounts", e.split("@")[0], own, b[3]] for e, b in zip(NODES, bound)]
        elif role.member == "node":  # once for each identity of the pool, under its own condition only
            want = [[*expected[role.scope], f"serviceAccount:{e}", bound[0][3], *condition(e)] for e in NODES]
        else:
            want = [[*expected[role.scope], own, bound[0][3] if bound else None, *condition()]]
        assert sorted(bound) == sorted(want), f"{role.id} ({role.scope}): {bound}"
    # Nothing but Respawn's own roles and the listed predefined ones is ever granted.
    predefined = {p["role"] for p in iam.load()["predefined"]}
    for group, _name, _member, role, *_condition in state["bindings"]:
        assert role.startswith(f"projects/{PROJECT}/roles/") or role in predefined, f"unexpected grant {role}"
    assert ["secrets", "respawn-slack-webhook", f"serviceAccount:respawn-notifier@{PROJECT}.iam.gserviceaccount.com",
            "roles/secretmanager.secretAccessor"] in state["bindings"]
    # Audit 4: the Pub/Sub service agent may mint the push identity's tokens (projects older than 2021-04-08).
    assert ["projects", PROJECT, f"serviceAccount:service-{PROJECT_NUMBER}@gcp-sa-pubsub.iam.gserviceaccount.com",
            "roles/iam.serviceAccountTokenCreator"] in state["bindings"]


def test_the_nodes_database_and_the_firewall_rule(deployed):
    _, standin, run1, _ = deployed
    # One heartbeats' database per identity, where (default) is; the heartbeat grant of identity K names K's only.
    for email in NODES:
        argv = _one(run1, "firestore databases", "create", deployment.heartbeat_database(email))
        assert _flag(argv, "location") == ["nam5"]
        [binding] = [b for b in standin.state()["bindings"]
                     if b[2] == f"serviceAccount:{email}" and b[3].endswith("/respawnNodeHeartbeat")]
        assert binding[4] == f'resource.name == "projects/{PROJECT}/databases/{deployment.heartbeat_database(email)}"'
    # One ingress rule per identity, from it to itself: a job's nodes reach each other, not another job's.
    for i, node in enumerate(NODES, start=1):
        argv = _one(run1, "compute firewall-rules", "create", deployment.node_firewall_rule(i))
        assert (_flag(argv, "network"), _flag(argv, "direction"), _flag(argv, "action"), _flag(argv, "rules")) == (
            [deployment.DEFAULT_NETWORK], ["INGRESS"], ["ALLOW"], ["all"])
        assert _flag(argv, "source-service-accounts") == _flag(argv, "target-service-accounts") == [node]


def test_an_earlier_unconditioned_node_grant_is_replaced_by_the_conditioned_one(deployed, tmp_path):
    # A grant once made without a condition (the nodes' Firestore grant, before the heartbeats had a database of
    # their own) and now made with one: a build over such a project must leave only the conditioned binding.
    node = f"serviceAccount:{NODES[0]}"
    old = [["projects", PROJECT, node, f"projects/{PROJECT}/roles/respawnNodeHeartbeat"],
           ["storage buckets", f"gs://{BUCKET}", node, f"projects/{PROJECT}/roles/respawnRelease"]]
    state = {**seeded_state(), "bindings": [list(b) for b in old],
             "iam service-accounts": {a: {} for a in (deployment.CONTROLLER_SA, deployment.NOTIFIER_SA,
                                                      deployment.TRIGGER_SA, *deployment.node_identities(8))},
             "pubsub topics": {t: {} for t in (deployment.LOG_EVENTS_TOPIC, deployment.ALERTS_TOPIC,
                                               deployment.SWEEP_TOPIC)}}
    results, standin = _run_only(deployed, tmp_path, state, {"bindings"})
    assert results[-1].rc == 0, results[-1].stderr
    bindings = standin.state()["bindings"]
    for entry in old:
        assert entry not in bindings
        assert [b for b in bindings if b[:4] == entry and len(b) == 5], f"{entry[3]} is not bound under its condition"


# ---------------------------------------------------------------------------------------------- the second run


def test_second_run_only_creates_or_updates(deployed):
    _, _, run1, run2 = deployed
    for n, run in ((1, run1), (2, run2)):
        deletes = [c["argv"] for c in run if c["verb"] == "delete"]
        assert not deletes, f"run {n} deleted something: {deletes}"
        recreated = [c["argv"] for c in run if c["verb"] == "create" and c["existed"]]
        assert not recreated, f"run {n} created what already existed: {recreated}"
    creates = [c["argv"] for c in run2 if c["verb"] == "create"]
    assert not creates, f"the second run must find everything in place, yet created: {creates}"
    # The same resources are touched both times (updates keep them in step with the repository).
    assert {(c["group"], c["name"]) for c in _mutations(run1)} <= {(c["group"], c["name"]) for c in run2}


# ------------------------------------------------------------------------------------- failing early, by name


def _run_only(deployed, tmp_path, state, steps):
    workspace = shutil.copytree(deployed[0], tmp_path / "workspace", symlinks=True)  # the shared one stays as built
    standin = Standin(tmp_path, state)
    build = load_build()
    return run_steps(build, workspace, standin, substitutions(build, PROJECT, BUCKET, BUILD_ID),
                     tmp_path / "log.jsonl", only=steps), standin


@pytest.mark.parametrize("missing, hint", [
    ("storage buckets", "gcloud storage buckets create gs://ckpt-bucket"),
    ("firestore databases", "gcloud firestore databases create"),
    ("secrets", "gcloud secrets create respawn-slack-webhook"),
])
def test_missing_prerequisite_fails_with_the_command_that_fixes_it(deployed, tmp_path, missing, hint):
    state = seeded_state()
    del state[missing]
    results, _ = _run_only(deployed, tmp_path, state, {"preconditions"})
    assert results[-1].rc != 0
    assert hint in results[-1].stderr


def test_a_bucket_without_uniform_access_fails_with_the_command_that_fixes_it(deployed, tmp_path):
    state = seeded_state()
    state["storage buckets"][f"gs://{BUCKET}"]["uniform_bucket_level_access"] = False
    results, _ = _run_only(deployed, tmp_path, state, {"preconditions"})
    assert results[-1].rc != 0
    assert f"gcloud storage buckets update gs://{BUCKET} --uniform-bucket-level-access" in results[-1].stderr


def test_a_recently_deleted_role_is_undeleted_not_recreated(deployed, tmp_path):
    state = seeded_state()
    state["iam roles"] = {"respawnController": {"deleted": True}}
    results, standin = _run_only(deployed, tmp_path, state, {"roles"})
    assert results[-1].rc == 0, results[-1].stderr
    log = calls(tmp_path / "log.jsonl")
    assert [c["verb"] for c in log if c["name"] == "respawnController"] == ["describe", "undelete", "update"]


def test_render_names_the_missing_bucket(tmp_path):
    from deploy import render

    with pytest.raises(render.RenderError, match="_CHECKPOINT_BUCKET"):
        render.render(PROJECT, "us-central1", "", "s", "b", tmp_path, tmp_path / "out")



# ------------------------------------------------------------------------------------ docs/deploy.md, step 4

RECORDER = """import json, os, sys
argv = sys.argv[1:]
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps(argv) + "\\n")
if argv[:2] == ["builds", "get-default-service-account"]:
    print(os.environ["DEFAULT_SA"])
"""


def _run_builder_block(tmp_path, default_sa: str):
    """Run step 4's shell block with a `gcloud` that records its argv and answers the default-account question."""
    import subprocess
    import sys

    text = (ROOT / "docs" / "deploy.md").read_text()
    block = text.split("## 4. ", 1)[1].split("\n## ", 1)[0].split("```bash\n", 1)[1].split("```", 1)[0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "recorder.py").write_text(RECORDER)
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "recorder.py"} "$@"\n')
    gcloud.chmod(0o755)
    record = tmp_path / "calls.jsonl"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PROJECT": PROJECT, "RECORD": str(record), "DEFAULT_SA": default_sa}
    p = subprocess.run(["bash", "-c", block], env=env, capture_output=True, text=True, timeout=60)
    return p, [json.loads(line) for line in record.read_text().splitlines()]


@pytest.mark.parametrize("answer,email", [
    # What `gcloud builds get-default-service-account --format=value(serviceAccountEmail)` prints (gcp-facts §11).
    ("projects/respawn-proj/serviceAccounts/123456789012-compute@developer.gserviceaccount.com",
     "123456789012-compute@developer.gserviceaccount.com"),
    ("projects/respawn-proj/serviceAccounts/123456789012@cloudbuild.gserviceaccount.com",
     "123456789012@cloudbuild.gserviceaccount.com"),
    ("123456789012-compute@developer.gserviceaccount.com", "123456789012-compute@developer.gserviceaccount.com"),
])
def test_docs_grant_the_build_roles_to_the_default_build_account(tmp_path, answer, email):
    p, argvs = _run_builder_block(tmp_path, answer)
    assert p.returncode == 0, p.stderr
    # Every call is a real command with real flags of the installed Google Cloud CLI.
    tree = cli_tree()
    assert not sorted({q for a in argvs for q in check_against_cli(a, tree)})
    assert argvs[0][:2] == ["builds", "get-default-service-account"]
    grants = argvs[1:]
    assert grants and all(a[:2] == ["projects", "add-iam-policy-binding"] for a in grants)
    assert {_flag(a, "member")[0] for a in grants} == {f"serviceAccount:{email}"}
    assert {_flag(a, "role")[0] for a in grants} >= {"roles/cloudfunctions.developer", "roles/iam.roleAdmin"}


def test_docs_stop_when_the_project_has_no_default_build_account(tmp_path):
    p, argvs = _run_builder_block(tmp_path, "")
    assert p.returncode != 0 and "your own service account" in p.stderr
    assert [a[:2] for a in argvs] == [["builds", "get-default-service-account"]]
