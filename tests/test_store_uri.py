"""respawn.contract.StoreUri: the one parser of checkpoint, log and workdir locations (gs://BUCKET/PATH, file:///PATH)."""

from __future__ import annotations

import dataclasses

import pytest

from respawn.contract import StoreUri, split_artifact


@pytest.mark.parametrize("text, scheme, bucket, path", [
    ("gs://b/ckpt/run-1", "gs", "b", "ckpt/run-1"),
    ("gs://ckpt-bucket/jobs/a/", "gs", "ckpt-bucket", "jobs/a/"),  # a listing prefix keeps its slash
    ("gs://ckpt-bucket", "gs", "ckpt-bucket", ""),
    ("gs://b/sha256-ab.tar.gz", "gs", "b", "sha256-ab.tar.gz"),
    ("gs://b//x", "gs", "b", "/x"),  # as written: not normalised
    ("file:///var/ckpt", "file", "", "/var/ckpt"),
    ("file:///var/ckpt/.respawn-logs/", "file", "", "/var/ckpt/.respawn-logs/"),
    ("file:///", "file", "", "/"),
])
def test_the_parts_of_a_uri_and_the_same_text_back(text, scheme, bucket, path):
    uri = StoreUri.parse(text)
    assert (uri.scheme, uri.bucket, uri.path) == (scheme, bucket, path)
    assert str(uri) == text
    assert StoreUri.parse(str(uri)) == uri


def test_a_bare_buckets_trailing_slash_is_not_kept():
    assert str(StoreUri.parse("gs://b/")) == "gs://b"
    assert StoreUri.parse("gs://b/") == StoreUri.parse("gs://b")


def test_only_a_file_uri_has_a_local_path():
    assert StoreUri.parse("file:///mnt/ckpt/job/").local_path == "/mnt/ckpt/job/"
    assert StoreUri.parse("gs://b/mnt/ckpt").local_path is None


@pytest.mark.parametrize("text, message", [
    ("s3://bucket/x", "'s3://bucket/x' is not a store URI: expected gs://BUCKET/PREFIX, or file:///ABSOLUTE/PATH "
                      "for local runs"),
    ("/var/ckpt", "'/var/ckpt' is not a store URI: expected gs://BUCKET/PREFIX"),
    ("", "'' is not a store URI"),
    ("GS://b/x", "'GS://b/x' is not a store URI"),
    ("gs:/b/x", "'gs:/b/x' is not a store URI"),
    (None, "None is not a store URI"),
    (3, "3 is not a store URI"),
    ("gs://", "'gs://' names no bucket: expected gs://BUCKET/PREFIX"),
    ("gs:///x", "'gs:///x' names no bucket: expected gs://BUCKET/PREFIX"),
    ("file://relative", "'file://relative' is not an absolute path: expected file:///ABSOLUTE/PATH (three slashes)"),
    ("file://localhost/var/ckpt", "'file://localhost/var/ckpt' is not an absolute path"),
    ("file://", "'file://' is not an absolute path"),
])
def test_what_is_refused_is_named_in_one_line(text, message):
    with pytest.raises(ValueError) as caught:
        StoreUri.parse(text)
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("base, child, expected", [
    ("gs://b/ckpt", "step_1", "gs://b/ckpt/step_1"),
    ("gs://b/ckpt/", "step_1", "gs://b/ckpt/step_1"),
    ("gs://b", "respawn/workdirs/x.tar.gz", "gs://b/respawn/workdirs/x.tar.gz"),
    ("gs://b/", ".respawn-logs/", "gs://b/.respawn-logs/"),
    ("file:///var/ckpt", "step_1", "file:///var/ckpt/step_1"),
    ("file:///var/ckpt//", "step_1", "file:///var/ckpt/step_1"),
    ("file:///", "step_1", "file:///step_1"),
])
def test_a_child_is_joined_with_one_slash(base, child, expected):
    joined = StoreUri.parse(base).join(child)
    assert str(joined) == expected
    assert joined == StoreUri.parse(expected)


def test_it_is_immutable_and_a_value():
    uri = StoreUri.parse("gs://b/p")
    with pytest.raises(dataclasses.FrozenInstanceError):
        uri.path = "q"  # type: ignore[misc]
    assert uri == StoreUri(StoreUri.GS, "b", "p") and hash(uri) == hash(StoreUri(StoreUri.GS, "b", "p"))
    assert {uri, StoreUri.parse("gs://b/p")} == {uri}


@pytest.mark.parametrize("parts, message", [
    (("gs", "", "p"), "names no bucket"),
    (("gs", "a/b", "p"), "has a / in its bucket name"),
    (("file", "b", "/p"), "has a bucket"),
    (("file", "", "p"), "is not an absolute path"),
    (("s3", "b", "p"), "is not a store URI"),
])
def test_one_built_from_parts_is_checked_as_a_parsed_one_is(parts, message):
    with pytest.raises(ValueError, match=message):
        StoreUri(*parts)


def test_an_artifact_reference_needs_a_store_uri():
    digest = "ab" * 32
    assert split_artifact(f"gs://b/respawn/releases/1/agent.pyz#sha256={digest}") == (
        "gs://b/respawn/releases/1/agent.pyz", digest)
    assert split_artifact(f"file:///opt/agent.pyz#sha256={digest}") == ("file:///opt/agent.pyz", digest)
    for uri in ("https://example.com/agent.pyz", "file://opt/agent.pyz", "gs:///agent.pyz"):
        with pytest.raises(ValueError, match="expected a gs:// or file:/// URI"):
            split_artifact(f"{uri}#sha256={digest}")
