"""Checkpoint folders and who may use them: Cloud Storage managed folders (gcp-facts §16), each job's
checkpoint_uri one folder whose IAM policy names the node identity the job holds (respawn.control.identities).

ManagedFoldersApi is the JSON API's managedFolders.insert / getIamPolicy / setIamPolicy over an authorized
session (respawn.control.clients builds it; local runs: the sim at RESPAWN_STORAGE_ENDPOINT). FolderGrants is the
port's adapter: grant and revoke one member's role on one folder, read-modify-write under the policy's etag.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from google.api_core import exceptions as gexc

from respawn import deployment
from respawn.contract import StoreUri

from .jsonapi import checked

PRODUCTION = "https://storage.googleapis.com"
# The IAM policy version read and written: a policy with a conditional binding is read only at 3 (an older version
# fails the request) and must be set as 3 (gcp-facts §16).
POLICY_VERSION = 3
TIMEOUT_S = 30
ETAG_ATTEMPTS = 5  # a concurrent change of the policy (another grant) makes the write fail on its etag: read again


class StorageJsonApi:
    """Calls of the Cloud Storage JSON API over a session; an error status raises the google.api_core exception of
    that status, with Cloud Storage's message (adapters/logstore.py's LogObjectsApi is one too)."""

    def __init__(self, session: Any, endpoint: str | None = None):
        self.session = session
        self.base = f"{(endpoint or PRODUCTION).rstrip('/')}/storage/v1/b"

    def _call(self, method: str, url: str, body: dict | None = None, params: dict | None = None) -> dict:
        return checked(self.session.request(method, url, json=body, params=params, timeout=TIMEOUT_S), method, url)


class ManagedFoldersApi(StorageJsonApi):
    def _folder(self, bucket: str, folder: str) -> str:
        return f"{self.base}/{quote(bucket, safe='')}/managedFolders/{quote(folder, safe='')}"

    def insert(self, bucket: str, folder: str) -> dict:
        return self._call("POST", f"{self.base}/{quote(bucket, safe='')}/managedFolders", {"name": folder})

    def get_iam_policy(self, bucket: str, folder: str) -> dict:
        return self._call("GET", self._folder(bucket, folder) + "/iam",
                          params={"optionsRequestedPolicyVersion": POLICY_VERSION})

    def set_iam_policy(self, bucket: str, folder: str, policy: dict) -> dict:
        return self._call("PUT", self._folder(bucket, folder) + "/iam", policy)


def split(folder: str) -> tuple[str, str]:
    """gs://BUCKET/PREFIX/ → (BUCKET, PREFIX/)."""
    uri = StoreUri.parse(folder)
    return uri.bucket, uri.path.rstrip("/") + "/"


class FolderGrants:
    """Grants a job's node identity the custom role JOB_DATA_ROLE on the job's checkpoint folder."""

    def __init__(self, clients: Any):
        self.clients = clients
        self.role = f"projects/{clients.project}/roles/{deployment.JOB_DATA_ROLE}"

    def grant(self, folder: str, member: str) -> None:
        bucket, prefix = split(folder)
        try:
            self.clients.managed_folders().insert(bucket, prefix)
        except gexc.Conflict:
            pass  # the folder is there already (an earlier node of the job, or the user made it)
        self._change(bucket, prefix, f"serviceAccount:{member}", add=True)

    def revoke(self, folder: str, member: str) -> None:
        bucket, prefix = split(folder)
        try:
            self._change(bucket, prefix, f"serviceAccount:{member}", add=False)
        except gexc.NotFound:
            return

    def _change(self, bucket: str, prefix: str, member: str, *, add: bool) -> None:
        api = self.clients.managed_folders()
        for _ in range(ETAG_ATTEMPTS):
            policy = api.get_iam_policy(bucket, prefix)
            bindings = [b for b in policy.get("bindings", []) if not b.get("condition")]
            others = [b for b in policy.get("bindings", []) if b.get("condition")]
            ours = next((b for b in bindings if b.get("role") == self.role), None)
            has = ours is not None and member in ours.get("members", [])
            if has == add:
                return
            if add:
                if ours is None:
                    bindings.append({"role": self.role, "members": [member]})
                else:
                    ours["members"] = [*ours["members"], member]
            else:
                ours["members"] = [m for m in ours["members"] if m != member]
                bindings = [b for b in bindings if b.get("members")]
            try:
                api.set_iam_policy(bucket, prefix, {"bindings": bindings + others, "etag": policy.get("etag"),
                                                    "version": POLICY_VERSION})
                return
            except gexc.PreconditionFailed:
                continue
        raise gexc.Aborted(f"the IAM policy of gs://{bucket}/{prefix} kept changing under {ETAG_ATTEMPTS} attempts "
                           f"to {'grant' if add else 'revoke'} {member}")
