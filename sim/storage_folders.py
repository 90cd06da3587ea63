"""Cloud Storage managed folders and their IAM policies, as the controller uses them (the JSON API's
managedFolders.insert / getIamPolicy / setIamPolicy, gcp-facts §16): where it grants a job's node identity that
job's checkpoint folder. Kept in memory by the sim; `may` answers whether a member holds a role on an object, so a
test can ask who may reach what.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from sim.core import ApiError, compute_error, rfc3339

if TYPE_CHECKING:
    from sim.server import SimServer


class StorageFolders:
    def __init__(self, sim: "SimServer") -> None:
        self.sim = sim
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

    def get_policy(self, bucket: str, name: str) -> dict:
        self._check(bucket, "storage.managedFolders.getIamPolicy")
        with self._lock:
            folder = self._get(bucket, name)
            return {"kind": "storage#policy", "resourceId": f"projects/_/buckets/{bucket}/managedFolders/{name}",
                    "bindings": [dict(b, members=list(b["members"])) for b in folder["bindings"]],
                    "etag": _etag(folder["etag"]), "version": 1}

    def set_policy(self, bucket: str, name: str, policy: dict) -> dict:
        self._check(bucket, "storage.managedFolders.setIamPolicy")
        with self._lock:
            folder = self._get(bucket, name)
            if policy.get("etag") not in (None, _etag(folder["etag"])):
                raise ApiError(412, {"error": {"code": 412, "message": "Precondition Failed: the policy's etag "
                                                                       "does not match"}})
            folder["bindings"] = [{"role": b["role"], "members": list(b["members"])} for b in policy.get("bindings", [])]
            folder["etag"] += 1
        return self.get_policy(bucket, name)

    def may(self, member: str, role: str, bucket: str, obj: str) -> bool:
        """Whether `member` holds `role` on object `obj` through a managed folder that contains it."""
        with self._lock:
            return any(b["role"] == role and member in b["members"]
                       for (bk, name), folder in self.folders.items() if bk == bucket and obj.startswith(name)
                       for b in folder["bindings"])


def _etag(n: int) -> str:
    return f"CA{n}="
