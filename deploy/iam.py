"""Reads deploy/iam/permissions.yaml: the custom roles Respawn creates, where each is bound, and for which member."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

PERMISSIONS_FILE = Path(__file__).resolve().parent / "iam" / "permissions.yaml"
# Where a role may be bound (the build knows how to bind on each of these).
SCOPES = ("project", "node-service-account", "alerts-topic", "sweep-topic", "checkpoint-bucket")


@dataclass(frozen=True)
class Role:
    id: str
    title: str
    description: str
    member: str  # a service account key: controller | notifier | trigger | node
    scope: str  # one of SCOPES
    methods: dict[str, tuple[str, ...]]  # API method -> the permissions it needs

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
        out.append(Role(role_id, r["title"], r["description"], r["member"], r["scope"],
                        {m: tuple(p) for m, p in r["methods"].items()}))
    return out


def granted_methods(member: str, data: dict | None = None) -> set[str]:
    return {m for role in roles(data) if role.member == member for m in role.methods}
