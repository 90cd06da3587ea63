"""Cloud Storage managed folders and their IAM policies, as the controller uses them (the JSON API's
managedFolders.insert / getIamPolicy / setIamPolicy, gcp-facts §16): where it grants a job's node identity that
job's checkpoint folder. Kept in memory by the sim; `may` answers whether a member holds a role on an object, so a
test can ask who may reach what. Bindings with an IAM condition are kept as set; as Cloud Storage does, a policy
that has one is read only at optionsRequestedPolicyVersion 3 and set only as version 3 (gcp-facts §16).
"""

from __future__ import annotations

import threading

from sim.core import ApiError, compute_error, rfc3339


class StorageFolders:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.folders: dict[tuple[str, str], dict] = {}  # (bucket, folder name "a/b/") → {"policy": {...}, "etag": n}
        self.forbidden: set[str] = set()  # buckets the controller holds no grant on (forbid())

    def forbid(self, bucket: str) -> None:
        """Answer every call on `bucket` as Cloud Storage answers a caller without the permission (403)."""
        self.forbidden.add(bucket)

    def _check(self, bucket: str, permission: str) -> None:
        if bucket in self.forbidden:
            raise compute_error(403, "forbidden", f"respawn-controller@sim.iam.gserviceaccount.com does not have "
                                                  f"{permission} access to the Google Cloud Storage bucket. "
                                                  "Permission denied on resource (or it may not exist).")

    def insert(self, bucket: str, name: str) -> dict:
        self._check(bucket, "storage.managedFolders.create")
        if not name.endswith("/") or name.startswith("/"):
            raise compute_error(400, "invalid", f"Invalid managed folder name {name!r}: a path ending in /")
        with self._lock:
            if (bucket, name) in self.folders:
                raise compute_error(409, "conflict", f"The managed folder {name} already exists.")
            self.folders[(bucket, name)] = {"bindings": [], "etag": 1, "created": rfc3339()}
        return {"kind": "storage#managedFolder", "id": f"{bucket}/{name}", "name": name, "bucket": bucket,
                "createTime": self.folders[(bucket, name)]["created"], "metageneration": "1"}

    def _get(self, bucket: str, name: str) -> dict:
        folder = self.folders.get((bucket, name))
        if folder is None:
            raise compute_error(404, "notFound", f"The managed folder {name} does not exist.")
        return folder

    def get_policy(self, bucket: str, name: str, version: int = 1) -> dict:
        """The folder's policy at the requested version (optionsRequestedPolicyVersion, 1 when not given)."""
        self._check(bucket, "storage.managedFolders.getIamPolicy")
        with self._lock:
            folder = self._get(bucket, name)
            if version < 3 and any("condition" in b for b in folder["bindings"]):
                raise compute_error(400, "invalid", f"The IAM policy of managed folder {name} has IAM Conditions: "
                                                    "optionsRequestedPolicyVersion must be 3 or greater.")
            return {"kind": "storage#policy", "resourceId": f"projects/_/buckets/{bucket}/managedFolders/{name}",
                    "bindings": [_copy(b) for b in folder["bindings"]], "etag": _etag(folder["etag"]),
                    "version": version}

    def set_policy(self, bucket: str, name: str, policy: dict) -> dict:
        self._check(bucket, "storage.managedFolders.setIamPolicy")
        bindings = [_copy(b) for b in policy.get("bindings", [])]
        version = int(policy.get("version") or 1)
        if version < 3 and any("condition" in b for b in bindings):
            raise compute_error(400, "invalid", "A policy with IAM Conditions must be set as version 3.")
        with self._lock:
            folder = self._get(bucket, name)
            if policy.get("etag") not in (None, _etag(folder["etag"])):
                raise ApiError(412, {"error": {"code": 412, "message": "Precondition Failed: the policy's etag "
                                                                       "does not match"}})
            folder["bindings"] = bindings
            folder["etag"] += 1
        return self.get_policy(bucket, name, version)

    def may(self, member: str, role: str, bucket: str, obj: str) -> bool:
        """Whether `member` holds `role` on object `obj` through a managed folder that contains it."""
        with self._lock:
            return any(b["role"] == role and member in b["members"]
                       for (bk, name), folder in self.folders.items() if bk == bucket and obj.startswith(name)
                       for b in folder["bindings"])


def _copy(binding: dict) -> dict:
    """A binding as the policy holds it: role, members and, if it has one, its condition."""
    out = {"role": binding["role"], "members": list(binding["members"])}
    if binding.get("condition"):
        out["condition"] = dict(binding["condition"])
    return out


def _etag(n: int) -> str:
    return f"CA{n}="
