"""What the build makes in the project beyond what the other modules play: Service Usage's enabled APIs, IAM's
service accounts, Resource Manager's project (its number and IAM policy), Secret Manager's Slack secret and the
Firestore Admin API's composite indexes — REST v1 services.list/enable/disable;
projects.serviceAccounts.get/create/delete; projects.get/getIamPolicy/setIamPolicy;
projects.secrets.versions.get/enable/disable; projects.databases.collectionGroups.indexes.list/create/get/delete.

`ProjectRecord.as_built` records what the build would have made, from the definitions the build reads itself:
respawn.deployment.APIS (the `apis` step), respawn.deployment.service_accounts (`service-accounts`),
deploy.render.project_bindings and the Pub/Sub service agent's grant (`bindings`), the Slack secret with one
enabled version (what docs/deploy.md step 3 makes and the `preconditions` step requires), and the composite indexes
of deploy/firestore/indexes.yaml (deploy.render.indexes, the `firestore` step), READY in the jobs' database
`(default)`. Breaking one through these methods is what `respawn doctor` finds (tests/test_selftest.py).

A record only: the stand-ins do not obey it. A disabled API still answers, a deleted service account's nodes still
run, a binding removed refuses nothing, and the functions get the Slack webhook from their environment, not from
the secret. The Firestore emulator neither serves the Admin API nor enforces composite indexes (a query that
would need a missing one is answered all the same), so an index deleted here, or one still CREATING, fails no
query: only `respawn doctor` sees it (docs/gcp-facts.md §32). Deleting a service account turns its members in the policy into `deleted:serviceAccount:EMAIL?uid=ID`,
and an account made again with the same email is another principal, bound to nothing, as IAM does
(docs/gcp-facts.md §31).
"""

from __future__ import annotations

import base64
import copy
import itertools
import threading
import time

from respawn import deployment
from sim.core import rfc3339, rpc_error

PROJECT_NUMBER = "123456789012"  # the sim's project number (as sim/metadata.py's numeric-project-id)
ENABLED, DISABLED = "ENABLED", "DISABLED"
CREATING, READY = "CREATING", "READY"  # an index's states the sim plays (Google's also has NEEDS_REPAIR)
JOBS_DATABASE = "(default)"  # where the build's `firestore` step creates the composite indexes


class ProjectRecord:
    """The project's enabled APIs, service accounts, IAM policy and secrets, as their APIs serve them."""

    def __init__(self, project: str, number: str = PROJECT_NUMBER) -> None:
        self.project, self.number = project, number
        self.services: dict[str, str] = {}  # API → ENABLED | DISABLED
        self.accounts: dict[str, dict] = {}  # email → ServiceAccount
        self.bindings: list[dict] = []  # the policy's bindings (version 3: a condition makes a binding of its own)
        self.secrets: dict[str, list[dict]] = {}  # secret id → its versions, oldest first
        # database → index id → {"group", "scope", "fields" (with __name__ last), "ready_at"}
        self.indexes: dict[str, dict[str, dict]] = {}
        # How long an index made through indexes.create stays CREATING, in seconds; read when it is listed, so
        # setting it to 0 finishes every build (Google's take minutes, and longer the more documents there are).
        self.index_build_s = 0.0
        self._index_ids = itertools.count(1)
        self._etag = 1
        self._ids = itertools.count(int(number) * 10**9 + 1)
        self._lock = threading.Lock()

    @classmethod
    def as_built(cls, project: str, identities: int = deployment.DEFAULT_NODE_IDENTITIES,
                 slack_secret: str = deployment.DEFAULT_SLACK_SECRET,
                 indexes: list[dict] | None = None) -> "ProjectRecord":
        """What cloudbuild.yaml's steps make, from the same definitions (`indexes`: deploy.render.indexes()'s form,
        deploy/firestore/indexes.yaml's by default)."""
        from deploy import render  # the checkout's: the build's bindings come from deploy/iam/permissions.yaml

        made = cls(project)
        made.services = {api: ENABLED for api in deployment.APIS}
        for account in deployment.service_accounts(identities):
            made._create_account(account, f"Respawn {account}")
        for member, role, condition in render.project_bindings(project, identities):
            made._bind(member, role, condition)
        made._bind(f"serviceAccount:{deployment.pubsub_service_agent(made.number)}", deployment.PUBSUB_AGENT_ROLE,
                   None)
        made.secrets[slack_secret] = [{"state": ENABLED, "created": time.time()}]
        for ix in render.indexes() if indexes is None else indexes:
            fields = []
            for config in ix["field_config"]:  # field-path=F,order=O (deploy/render.py)
                parts = dict(p.split("=", 1) for p in config.split(","))
                fields.append({"fieldPath": parts["field-path"], "order": parts.get("order", "ascending").upper()})
            made._create_index(JOBS_DATABASE, ix["collection_group"], {"queryScope": "COLLECTION", "fields": fields},
                               ready_at=0.0)
        return made

    # --- Service Usage ---
    def _service(self, name: str) -> dict:
        return {"name": f"projects/{self.number}/services/{name}", "parent": f"projects/{self.number}",
                "config": {"name": name}, "state": self.services.get(name, DISABLED)}

    def list_services(self, filter_: str | None, page_size: int, page_token: str | None) -> dict:
        with self._lock:
            names = sorted(self.services)
            if filter_:
                if filter_.replace(" ", "") not in ("state:ENABLED", "state:DISABLED"):
                    raise rpc_error(400, f"Invalid filter: {filter_!r} (the sim takes state:ENABLED|DISABLED)")
                names = [n for n in names if self.services[n] == filter_.split(":")[1].strip()]
            start = int(page_token or 0)
            page = names[start:start + page_size]
            out: dict = {"services": [self._service(n) for n in page]}
        if start + page_size < len(names):
            out["nextPageToken"] = str(start + page_size)
        return out

    def set_service(self, name: str, state: str) -> dict:
        with self._lock:
            self.services[name] = state
            service = self._service(name)
        verb = "Enable" if state == ENABLED else "Disable"
        return {"name": "operations/noop.DONE_OPERATION", "done": True,
                "response": {"@type": f"type.googleapis.com/google.api.serviceusage.v1.{verb}ServiceResponse",
                             "service": service}}

    # --- IAM's service accounts ---
    def _create_account(self, account_id: str, display_name: str) -> dict:
        email = deployment.service_account_email(account_id, self.project)
        if email in self.accounts:
            raise rpc_error(409, f"Service account {account_id} already exists within project "
                                 f"projects/{self.project}.")
        uid = str(next(self._ids))
        self.accounts[email] = {"name": f"projects/{self.project}/serviceAccounts/{email}",
                                "projectId": self.project, "uniqueId": uid, "email": email,
                                "displayName": display_name, "etag": "MDEwMjE5MjA=", "oauth2ClientId": uid}
        return dict(self.accounts[email])

    def _account(self, email: str) -> dict:
        found = self.accounts.get(email)
        if found is None:
            raise rpc_error(404, f"Unknown service account {email}", "NOT_FOUND")
        return found

    def get_account(self, email: str) -> dict:
        with self._lock:
            return dict(self._account(email))

    def create_account(self, body: dict) -> dict:
        with self._lock:
            return self._create_account(body["accountId"], (body.get("serviceAccount") or {}).get("displayName", ""))

    def delete_account(self, email: str) -> dict:
        """Gone; its bindings stay, naming the deleted principal (IAM purges them within 60 days)."""
        with self._lock:
            account = self._account(email)
            del self.accounts[email]
            member, deleted = f"serviceAccount:{email}", f"deleted:serviceAccount:{email}?uid={account['uniqueId']}"
            for binding in self.bindings:
                binding["members"] = [deleted if m == member else m for m in binding["members"]]
            self._etag += 1
        return {}

    # --- Resource Manager's project and its IAM policy ---
    def get_project(self) -> dict:
        return {"projectNumber": self.number, "projectId": self.project, "name": self.project,
                "lifecycleState": "ACTIVE", "createTime": "2026-01-05T10:00:00.000Z"}

    def _bind(self, member: str, role: str, condition: dict | None) -> None:
        for binding in self.bindings:
            if binding["role"] == role and binding.get("condition") == condition:
                if member not in binding["members"]:
                    binding["members"].append(member)
                return
        self.bindings.append({"role": role, "members": [member], **({"condition": condition} if condition else {})})

    def _policy(self) -> dict:
        etag = base64.b64encode(f"BwY{self._etag:08d}".encode()).decode()
        return {"version": 3, "etag": etag, "bindings": copy.deepcopy(self.bindings)}

    def get_policy(self) -> dict:
        with self._lock:
            return self._policy()

    def set_policy(self, body: dict) -> dict:
        """The policy replaced whole; refused when its etag is not the current one (a concurrent change)."""
        policy = body["policy"]
        with self._lock:
            if policy.get("etag") and policy["etag"] != self._policy()["etag"]:
                raise rpc_error(409, "There were concurrent policy changes. Please retry the whole read-modify-write "
                                     "with exponential backoff.", "ABORTED")
            self.bindings = [{"role": b["role"], "members": list(b["members"]),
                              **({"condition": dict(b["condition"])} if b.get("condition") else {})}
                             for b in policy.get("bindings", []) if b.get("members")]
            self._etag += 1
            return self._policy()

    # --- Secret Manager's versions ---
    def _versions(self, secret: str) -> list[dict]:
        versions = self.secrets.get(secret)
        if not versions:
            raise rpc_error(404, f"Secret [projects/{self.number}/secrets/{secret}] not found or has no versions.",
                            "NOT_FOUND")
        return versions

    def _version(self, secret: str, version: str) -> tuple[int, dict]:
        versions = self._versions(secret)
        if version == "latest":  # an alias to the most recently created version, whatever its state
            return len(versions), versions[-1]
        if not version.isdigit() or not 1 <= int(version) <= len(versions):
            raise rpc_error(404, f"Secret Version [projects/{self.number}/secrets/{secret}/versions/{version}] not "
                                 "found.", "NOT_FOUND")
        return int(version), versions[int(version) - 1]

    def _version_resource(self, secret: str, n: int, v: dict) -> dict:
        return {"name": f"projects/{self.number}/secrets/{secret}/versions/{n}", "createTime": rfc3339(v["created"]),
                "state": v["state"], "etag": f'"{n}{v["state"][0]}"'}

    def get_version(self, secret: str, version: str) -> dict:
        with self._lock:
            n, v = self._version(secret, version)
            return self._version_resource(secret, n, v)

    def set_version(self, secret: str, version: str, state: str) -> dict:
        with self._lock:
            n, v = self._version(secret, version)
            v["state"] = state
            return self._version_resource(secret, n, v)

    # --- the Firestore Admin API's composite indexes ---
    def _index_resource(self, database: str, index_id: str, ix: dict) -> dict:
        return {"name": f"projects/{self.project}/databases/{database}/collectionGroups/{ix['group']}/indexes/"
                        f"{index_id}",
                "queryScope": ix["scope"], "apiScope": "ANY_API", "density": "SPARSE_ALL",
                "fields": copy.deepcopy(ix["fields"]),
                "state": READY if time.time() >= ix["ready_at"] + self.index_build_s else CREATING}

    def _create_index(self, database: str, group: str, body: dict, ready_at: float | None = None) -> str:
        fields = [dict(f) for f in body.get("fields") or []]
        if not fields or any(not f.get("fieldPath") for f in fields):
            raise rpc_error(400, "An index must have at least one field, each with a fieldPath.")
        if fields[-1]["fieldPath"] != "__name__":  # added with the last field's direction (the Index resource's doc)
            fields.append({"fieldPath": "__name__", "order": fields[-1].get("order") or "ASCENDING"})
        scope = body.get("queryScope") or "COLLECTION"
        made = self.indexes.setdefault(database, {})
        for ix in made.values():
            if (ix["group"], ix["scope"], ix["fields"]) == (group, scope, fields):
                raise rpc_error(409, "index already exists", "ALREADY_EXISTS")
        index_id = "CICAgJ" + base64.b32encode(next(self._index_ids).to_bytes(5, "big")).decode()  # Google's: CICAgJim14AK
        made[index_id] = {"group": group, "scope": scope, "fields": fields,
                          "ready_at": time.time() if ready_at is None else ready_at}
        return index_id

    def _index(self, database: str, group: str, index_id: str) -> dict:
        found = self.indexes.get(database, {}).get(index_id)
        if found is None or group not in ("-", found["group"]):
            raise rpc_error(404, f"Index projects/{self.project}/databases/{database}/collectionGroups/{group}/"
                                 f"indexes/{index_id} not found.", "NOT_FOUND")
        return found

    def list_indexes(self, database: str, group: str, page_size: int, page_token: str | None) -> dict:
        """A collection group's composite indexes; `-` for every group (as gcloud lists them)."""
        with self._lock:
            found = [self._index_resource(database, i, ix) for i, ix in sorted(self.indexes.get(database, {}).items())
                     if group in ("-", ix["group"])]
        start = int(page_token or 0)
        out: dict = {"indexes": found[start:start + page_size]}
        if start + page_size < len(found):
            out["nextPageToken"] = str(start + page_size)
        return out

    def create_index(self, database: str, group: str, body: dict) -> dict:
        """`gcloud firestore indexes composite create`: a long-running operation; the index is CREATING for
        index_build_s, then READY."""
        with self._lock:
            index_id = self._create_index(database, group, body)
            index = self._index_resource(database, index_id, self.indexes[database][index_id])
        return {"name": f"projects/{self.project}/databases/{database}/operations/{index_id}op",
                "metadata": {"@type": "type.googleapis.com/google.firestore.admin.v1.IndexOperationMetadata",
                             "startTime": rfc3339(time.time()), "index": index["name"], "state": "PROCESSING"}}

    def get_index(self, database: str, group: str, index_id: str) -> dict:
        with self._lock:
            return self._index_resource(database, index_id, self._index(database, group, index_id))

    def delete_index(self, database: str, group: str, index_id: str) -> dict:
        """`gcloud firestore indexes composite delete ID`."""
        with self._lock:
            self._index(database, group, index_id)
            del self.indexes[database][index_id]
        return {}
