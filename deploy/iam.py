"""Reads deploy/iam/permissions.yaml: the custom roles Respawn creates, where each is bound, for which member, and
under which IAM condition; and answers, from that data, who may do what on which resource (Policy)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from respawn import deployment, selftest
from respawn.app.workdir import GCS_PREFIX as WORKDIRS_PREFIX

PERMISSIONS_FILE = Path(__file__).resolve().parent / "iam" / "permissions.yaml"
# Where a role may be bound (the build knows how to bind on each of these).
SCOPES = ("project", "node-service-account", "alerts-topic", "sweep-topic", "checkpoint-bucket", "job-folder")


@dataclass(frozen=True)
class Role:
    id: str
    title: str
    description: str
    member: str  # a service account key: controller | notifier | trigger | node
    scope: str  # one of SCOPES
    methods: dict[str, tuple[str, ...]]  # API method -> the permissions it needs
    condition: str | None = None  # a key of CONDITIONS: the binding admits only the resources it admits

    @property
    def permissions(self) -> list[str]:
        return sorted({p for perms in self.methods.values() for p in perms})

    def definition(self) -> dict:
        """The body of `gcloud iam roles create|update --file`."""
        return {"title": self.title, "description": self.description, "stage": "GA",
                "includedPermissions": self.permissions}


def load(path: Path = PERMISSIONS_FILE) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def roles(data: dict | None = None) -> list[Role]:
    data = load() if data is None else data
    out = []
    for role_id, r in data["roles"].items():
        if r["scope"] not in SCOPES:
            raise ValueError(f"{PERMISSIONS_FILE}: role {role_id} is bound on {r['scope']!r}; use one of {', '.join(SCOPES)}")
        if r.get("condition") is not None and r["condition"] not in CONDITIONS:
            raise ValueError(f"{PERMISSIONS_FILE}: role {role_id} names condition {r['condition']!r}; use one of "
                             f"{', '.join(CONDITIONS)}")
        out.append(Role(role_id, r["title"], r["description"], r["member"], r["scope"],
                        {m: tuple(p) for m, p in r["methods"].items()}, r.get("condition")))
    return out


def granted_methods(member: str, data: dict | None = None) -> set[str]:
    return {m for role in roles(data) if role.member == member for m in role.methods}


# ---- IAM conditions: each one's CEL expression (what IAM evaluates) and the same test in Python (what Policy and
# the tests evaluate), made from the same names so that the two cannot say different things.

@dataclass(frozen=True)
class Condition:
    title: str
    description: str
    expression: str
    admits: Callable[[str], bool]  # resource name (as IAM conditions see it) -> does the binding apply

    def definition(self) -> dict:
        """The body of gcloud's --condition-from-file."""
        return {"title": self.title, "description": self.description, "expression": self.expression}


def _database(project: str, bucket: str, identity: str | None) -> Condition:
    database = deployment.heartbeat_database(identity)
    name = f"projects/{project}/databases/{database}"
    return Condition(f"respawn heartbeats {database}", f"only the Firestore database {database}",
                     f'resource.name == "{name}"', lambda r: r == name)


def _object_prefixes(bucket: str, prefixes: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"projects/_/buckets/{bucket}/objects/{p.rstrip('/')}/" for p in prefixes)


def _release(project: str, bucket: str, identity: str | None) -> Condition:
    prefixes = _object_prefixes(bucket, (deployment.RELEASES_PREFIX, WORKDIRS_PREFIX))
    return Condition("respawn release and workdirs", "only the objects of the release and the workdir archives",
                     " || ".join(f'resource.name.startsWith("{p}")' for p in prefixes),
                     lambda r: r.startswith(prefixes))


def _selftest_database(project: str, bucket: str, identity: str | None) -> Condition:
    name = f"projects/{project}/databases/{selftest.DATABASE}"
    return Condition("respawn self-test", f"only the Firestore database {selftest.DATABASE}",
                     f'resource.name == "{name}"', lambda r: r == name)


# name → (project, bucket, the node identity the binding is for, if any) → Condition
CONDITIONS: dict[str, Callable[[str, str, str | None], Condition]] = {
    "nodes-database": _database, "release": _release, "selftest-database": _selftest_database}


# ---- who may do what on which resource, from the bindings the build makes and those the controller makes at run time
# (a job's folder for the identity it holds). Custom roles only: the predefined ones are Google's platform plumbing,
# listed in permissions.yaml `predefined`, none of them for a node.

def _covers(scope: str, project: str, bucket: str, identity: str | None, folder: str | None, resource: str) -> bool:
    """Whether a binding of `scope` applies to `resource`: a project-wide binding to everything in the project (its
    buckets too), any other to the one resource it is set on and what lies under it. `identity`: the node identity
    the binding is for; `folder`: the checkpoint folder (gs://B/PREFIX/) it holds, if any."""
    if scope == "project":
        return resource.startswith((f"projects/{project}/", "projects/_/buckets/"))
    if scope == "job-folder":
        if folder is None:
            return False
        bucket_name, _, prefix = folder.removeprefix("gs://").partition("/")
        return resource.startswith(f"projects/_/buckets/{bucket_name}/objects/{prefix}")
    where = {"node-service-account": f"projects/{project}/serviceAccounts/{identity}",
             "alerts-topic": f"projects/{project}/topics/{deployment.ALERTS_TOPIC}",
             "sweep-topic": f"projects/{project}/topics/{deployment.SWEEP_TOPIC}",
             "checkpoint-bucket": f"projects/_/buckets/{bucket}"}[scope]
    return resource == where or resource.startswith(where + "/")


@dataclass(frozen=True)
class Policy:
    project: str
    bucket: str
    identities: tuple[str, ...]  # the node pool's emails
    folders: dict[str, str]  # node identity → the checkpoint folder of the job that holds it

    def may(self, who: str, permission: str, resource: str) -> bool:
        """Whether `who` (controller | notifier | trigger, or a node identity's email) holds `permission` on
        `resource`, a resource name as IAM conditions see it: projects/P/databases/D, projects/_/buckets/B,
        projects/_/buckets/B/objects/O, projects/P/topics/T, projects/P/serviceAccounts/EMAIL."""
        for role in roles():
            if permission not in role.permissions:
                continue
            if role.member == "node":
                if who not in self.identities:
                    continue
                targets = [(who, self.folders.get(who))]
            elif role.member == who:
                # the controller's act-as: one binding on each identity
                targets = [(i, None) for i in self.identities] if role.scope == "node-service-account" else [(None, None)]
            else:
                continue
            for identity, folder in targets:
                if _covers(role.scope, self.project, self.bucket, identity, folder, resource) and (
                        role.condition is None
                        or CONDITIONS[role.condition](self.project, self.bucket, identity).admits(resource)):
                    return True
        return False
