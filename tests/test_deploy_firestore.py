"""The Firestore indexes the control plane's queries need (deploy/firestore/indexes.yaml), the event-history TTL,
and the build's index diff."""

from __future__ import annotations

import ast

from deploy import firestore_indexes, render
from respawn import deployment, schema
from tests.deploy_fixtures import ROOT

RANGE_OPS = {"<", "<=", ">", ">=", "!=", "not-in"}


def queries(path):
    """Each query chain in a file: [(field, op)] of its where(filter=FieldFilter(...)) and order_by(...) calls."""
    tree = ast.parse(path.read_text())
    chains = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in ("stream", "get") or not isinstance(node.func.value, (ast.Call, ast.Name)):
            continue
        terms, cur = [], node.func.value
        while isinstance(cur, ast.Call) and isinstance(cur.func, ast.Attribute):
            if cur.func.attr == "where":
                for arg in [*cur.args, *(k.value for k in cur.keywords)]:
                    if isinstance(arg, ast.Call) and getattr(arg.func, "id", getattr(arg.func, "attr", "")) == "FieldFilter":
                        field, op = (a.value if isinstance(a, ast.Constant) else None for a in arg.args[:2])
                        terms.append((field, op))
            elif cur.func.attr == "order_by" and cur.args and isinstance(cur.args[0], ast.Constant):
                terms.append((cur.args[0].value, "order"))
            cur = cur.func.value
        if terms:
            chains.append(terms)
    # Also chains built on a local name: `query = ...where(...)`; `query.select(...).stream()`.
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            src = ast.unparse(node.value)
            if ".where(" in src:
                terms = [(c.args[0].value, c.args[1].value) for c in ast.walk(node.value)
                         if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "FieldFilter"
                         and all(isinstance(a, ast.Constant) for a in c.args[:2])]
                chains.append(terms)
    return chains


def needs_composite(terms) -> bool:
    fields = {f for f, _ in terms}
    return len(fields) > 1 and any(op in RANGE_OPS | {"order", "in", "array-contains-any"} for _, op in terms)


def test_every_multi_field_query_has_an_index():
    wanted = {(ix["collection_group"], tuple(c.split(",")[0].split("=", 1)[1] for c in ix["field_config"]))
              for ix in render.indexes()}
    found = []
    for path in sorted((ROOT / "functions").rglob("*.py")):
        for terms in queries(path):
            found.append(terms)
            if needs_composite(terms):
                fields = tuple(f for f, _ in terms)
                assert any(set(fields) <= set(f) for _, f in wanted), (
                    f"{path.relative_to(ROOT)} queries {terms}: add a composite index on {fields} to "
                    "deploy/firestore/indexes.yaml")
    assert found, "the scan found no Firestore query in functions/: it would prove nothing"


def test_multi_field_range_query_is_recognised():
    assert needs_composite([("status.state", "=="), ("status.next_attempt_at", "<")])
    assert not needs_composite([("status.state", "in")])


def test_ttl_targets_the_event_history_field():
    assert deployment.TTL_COLLECTION_GROUP == schema.EVENTS
    event = schema.JobEvent.new(None, schema.State.PENDING, "created")
    assert getattr(event, deployment.TTL_FIELD) - event.at == schema.EVENT_RETENTION


def test_index_diff_creates_only_what_is_missing():
    wanted = [{"collection_group": "jobs", "field_config": ["field-path=status.state,order=ascending",
                                                            "field-path=status.next_attempt_at,order=ascending"]}]
    assert firestore_indexes.missing(wanted, []) == [[
        "--collection-group=jobs", "--field-config=field-path=status.state,order=ascending",
        "--field-config=field-path=status.next_attempt_at,order=ascending"]]
    listed = [{"name": "projects/p/databases/(default)/collectionGroups/jobs/indexes/CICAgJim14AK",
               "fields": [{"fieldPath": "status.state", "order": "ASCENDING"},
                          {"fieldPath": "status.next_attempt_at", "order": "ASCENDING"},
                          {"fieldPath": "__name__", "order": "ASCENDING"}]}]
    assert firestore_indexes.missing(wanted, listed) == []
