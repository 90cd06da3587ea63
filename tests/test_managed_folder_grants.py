"""A job's checkpoint-folder grant (functions/adapters/managed_folders.FolderGrants) on a managed folder whose IAM
policy has a conditional binding, against the sim's Cloud Storage JSON API (issue #36 D5): the policy is read at
optionsRequestedPolicyVersion 3 (Cloud Storage fails an older version's read of a policy with IAM Conditions:
"Required to be 3 or greater for managed folders with IAM Conditions", the managedFolders.getIamPolicy reference),
set as version 3, and the conditional binding is kept through grant and revoke."""

from __future__ import annotations

import pytest
import requests

from respawn.control import clients as factory
from respawn.control.adapters.managed_folders import FolderGrants
from sim.core import ApiError
from sim_fixtures import PROJECT, sim_factory, sim_server  # noqa: F401 - fixtures

NODE = "respawn-node-1@p.iam.gserviceaccount.com"
CONDITIONAL = {"role": "roles/storage.objectViewer", "members": ["group:auditors@example.com"],
               "condition": {"title": "until 2027", "expression": 'request.time < timestamp("2027-01-01T00:00:00Z")'}}


def test_a_grant_and_a_revoke_keep_a_conditional_binding(sim_server):
    folders = sim_server.storage_folders
    folders.insert("ckpt", "job-a/")
    folders.set_policy("ckpt", "job-a/", {"bindings": [CONDITIONAL], "version": 3})
    url = f"{sim_server.endpoint}/storage/v1/b/ckpt/managedFolders/job-a%2F/iam"
    assert requests.get(url, timeout=10).status_code == 400  # a version-1 read of it fails, as Cloud Storage's does

    grants = FolderGrants(factory.Clients(factory.Endpoints(PROJECT, storage=sim_server.endpoint)))
    grants.grant("gs://ckpt/job-a/", NODE)
    policy = requests.get(url, params={"optionsRequestedPolicyVersion": 3}, timeout=10).json()
    assert policy["version"] == 3
    assert CONDITIONAL in policy["bindings"]
    assert {"role": grants.role, "members": [f"serviceAccount:{NODE}"]} in policy["bindings"]
    assert folders.may(f"serviceAccount:{NODE}", grants.role, "ckpt", "job-a/step-1/weights")

    grants.revoke("gs://ckpt/job-a/", NODE)
    assert folders.get_policy("ckpt", "job-a/", 3)["bindings"] == [CONDITIONAL]


def test_the_sim_refuses_a_conditional_binding_set_as_version_1(sim_server):
    sim_server.storage_folders.insert("ckpt", "job-b/")
    r = requests.put(f"{sim_server.endpoint}/storage/v1/b/ckpt/managedFolders/job-b%2F/iam",
                     json={"bindings": [CONDITIONAL]}, timeout=10)
    assert r.status_code == 400 and "version 3" in r.json()["error"]["message"]
    sim_server.storage_folders.set_policy("ckpt", "job-b/", {"bindings": [CONDITIONAL], "version": 3})
    with pytest.raises(ApiError, match="optionsRequestedPolicyVersion must be 3"):
        sim_server.storage_folders.get_policy("ckpt", "job-b/")
