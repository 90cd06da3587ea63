"""respawn.app.workdir: what is packed (git's ignore rules, .respawnignore, .git), and that the archive is
byte-reproducible and holds only what the node's unpacker accepts."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest

from respawn import contract, schema
from respawn.app.workdir import (LARGE_ARCHIVE_BYTES, MEMBER_MTIME, WorkdirError, pack, parse_rule, scan,
                             workdir_uri)

GIT = shutil.which("git")


def make_tree(root: Path, files: dict[str, str | None]) -> None:
    """Paths ending in "/" are directories; others are files with that text (None: empty)."""
    for rel, text in files.items():
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text or "")


def packed_files(root: Path) -> set[str]:
    return {m.path for m in scan(root).members if m.kind != "dir"}


def git_untracked(root: Path) -> set[str]:
    """What git itself would add: untracked files not ignored, with no global or system configuration."""
    env = {"PATH": os.environ["PATH"], "HOME": str(root.parent), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull}
    subprocess.run(["git", "init", "-q", "--template=", str(root)], check=True, env=env)
    listing = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--others", "--exclude-standard"],
                             check=True, env=env, capture_output=True).stdout
    return {os.fsdecode(p) for p in listing.split(b"\0") if p}


# Each case: the tree (ignore files included), and the files that are packed. Without a .respawnignore, git
# itself (when installed) is asked too and must agree.
IGNORE_CASES = {
    "blank lines and comments match nothing": (
        {".gitignore": "# *.py\n\n   \n", "a.py": "", "# b": ""},
        {".gitignore", "a.py", "# b"}),
    "an escaped hash is a pattern": (
        {".gitignore": "\\#notes\n", "#notes": "", "notes": ""},
        {".gitignore", "notes"}),
    "trailing spaces are dropped unless escaped": (
        {".gitignore": "a.txt   \nb\\ \n", "a.txt": "", "b ": "", "b": ""},
        {".gitignore", "b"}),
    "a name without a slash matches at any depth": (
        {".gitignore": "*.log\n", "a.log": "", "sub/deep/b.log": "", "sub/c.txt": "", "log": ""},
        {".gitignore", "sub/c.txt", "log"}),
    "? is one character, never a slash": (
        {".gitignore": "?.tmp\na?b\n", "x.tmp": "", "xy.tmp": "", "a/b": "", "axb": ""},
        {".gitignore", "xy.tmp", "a/b"}),
    "brackets: sets, ranges, negation, classes": (
        {".gitignore": "[ab].c\n[!ab].d\n[0-9].e\n[[:upper:]].f\n",
         "a.c": "", "b.c": "", "c.c": "", "a.d": "", "c.d": "", "7.e": "", "x.e": "", "Q.f": "", "q.f": ""},
        {".gitignore", "c.c", "a.d", "x.e", "q.f"}),
    "a trailing slash matches directories only": (
        {".gitignore": "build/\n", "build/out.o": "", "src/build/x.o": "", "other/build": ""},
        {".gitignore", "other/build"}),
    "a leading slash anchors to the .gitignore's directory": (
        {".gitignore": "/top.txt\n", "top.txt": "", "sub/top.txt": ""},
        {".gitignore", "sub/top.txt"}),
    "an inner slash anchors too, and * stays within one directory": (
        {".gitignore": "docs/*.md\n", "docs/a.md": "", "docs/sub/b.md": "", "x/docs/a.md": "", "docs/c.txt": ""},
        {".gitignore", "docs/sub/b.md", "x/docs/a.md", "docs/c.txt"}),
    "leading **/ matches in every directory": (
        {".gitignore": "**/cache\n", "cache/a": "", "a/cache/b": "", "a/b/cache": "", "a/cached": ""},
        {".gitignore", "a/cached"}),
    "trailing /** matches everything inside": (
        {".gitignore": "logs/**\n", "logs/a": "", "logs/x/b": "", "sub/logs/c": ""},
        {".gitignore", "sub/logs/c"}),
    "inner /**/ matches zero or more directories": (
        {".gitignore": "a/**/b\n", "a/b": "", "a/x/b": "", "a/x/y/b": "", "c/a/b": "", "a/bb": ""},
        {".gitignore", "c/a/b", "a/bb"}),
    "** not beside slashes is a plain *": (
        {".gitignore": "foo**bar\n", "fooXbar": "", "foo/bar": "", "foobar": ""},
        {".gitignore", "foo/bar"}),
    "! re-includes what an earlier line excluded": (
        {".gitignore": "*.log\n!keep.log\n", "a.log": "", "keep.log": "", "sub/keep.log": "", "sub/b.log": ""},
        {".gitignore", "keep.log", "sub/keep.log"}),
    "the last matching line wins": (
        {".gitignore": "!keep.log\n*.log\n", "keep.log": "", "a.txt": ""},
        {".gitignore", "a.txt"}),
    "nothing under an excluded directory can be re-included": (
        {".gitignore": "data/\n!data/keep.txt\n", "data/keep.txt": "", "data/big.bin": "", "run.py": ""},
        {".gitignore", "run.py"}),
    "excluding a directory's contents allows re-including some": (
        {".gitignore": "data/*\n!data/keep.txt\n", "data/keep.txt": "", "data/big.bin": ""},
        {".gitignore", "data/keep.txt"}),
    "! of a directory under an anchored *": (
        {".gitignore": "/*\n!/src\n!/.gitignore\n", "src/a.py": "", "notes.md": "", "out/x": ""},
        {".gitignore", "src/a.py"}),
    "an escaped ! is a pattern": (
        {".gitignore": "\\!important\n", "!important": "", "important": ""},
        {".gitignore", "important"}),
    "a nested .gitignore overrides its parents, relative to its own directory": (
        {".gitignore": "*.log\nx.txt\n", "a.log": "",
         "sub/.gitignore": "!important.log\n/only-here.txt\n", "sub/important.log": "", "sub/other.log": "",
         "sub/only-here.txt": "", "sub/deeper/only-here.txt": "", "only-here.txt": "", "sub/x.txt": ""},
        {".gitignore", "sub/.gitignore", "sub/important.log", "sub/deeper/only-here.txt", "only-here.txt"}),
    "a .gitignore inside an excluded directory is never read": (
        {".gitignore": "vendor/\n", "vendor/.gitignore": "!*\n", "vendor/lib.py": "", "main.py": ""},
        {".gitignore", "main.py"}),
    ".git is always left out, at any depth": (
        {".git/config": "", "sub/.git": "gitdir: ../elsewhere\n", "sub/a.py": "", ".gitkeep": ""},
        {"sub/a.py", ".gitkeep"}),
    ".respawnignore excludes what .gitignore keeps": (
        {".gitignore": "*.pyc\n", ".respawnignore": "data/\n*.ckpt\n", "data/x.bin": "", "model.ckpt": "",
         "a.pyc": "", "train.py": ""},
        {".gitignore", ".respawnignore", "train.py"}),
    ".respawnignore's ! overrides every .gitignore": (
        {".gitignore": "*.json\n", "sub/.gitignore": "config.json\n", ".respawnignore": "!config.json\n",
         "config.json": "", "sub/config.json": "", "other.json": ""},
        {".gitignore", "sub/.gitignore", ".respawnignore", "config.json", "sub/config.json"}),
    ".respawnignore cannot reach under a directory .gitignore excluded": (
        {".gitignore": "vendor/\n", ".respawnignore": "!vendor/keep.py\n", "vendor/keep.py": ""},
        {".gitignore", ".respawnignore"}),
}


@pytest.mark.parametrize("case", list(IGNORE_CASES))
def test_ignore_rules(case, tmp_path):
    files, expected = IGNORE_CASES[case]
    root = tmp_path / "w"
    make_tree(root, files)
    assert packed_files(root) == expected
    if GIT and ".respawnignore" not in files and ".git/config" not in files and "sub/.git" not in files:
        assert git_untracked(root) == expected, "git disagrees with the expected result of this case"


def test_git_is_there_to_check_the_table():
    # The table's cross-check with git is what keeps the expectations honest; CI images carry git.
    assert GIT, "git is not installed: the ignore-rule table is checked against git itself"


@pytest.mark.parametrize("line, regex_matches, regex_misses", [
    ("[z-a]", [], ["a", "z", "m"]),  # a reversed range matches nothing, as in git
    ("[abc", [], ["a", "[abc"]),  # an unclosed bracket matches nothing, as in git
    ("[[:nope:]]", [], ["n", ":"]),  # an unknown class matches nothing, as in git
    ("a\\*b", ["a*b"], ["axb"]),
    ("[]]x", ["]x"], ["ax"]),
])
def test_malformed_and_escaped_patterns(line, regex_matches, regex_misses):
    rule = parse_rule(line)
    assert rule is not None
    for name in regex_matches:
        assert rule.matches(name, name, False), name
    for name in regex_misses:
        assert not rule.matches(name, name, False), name


# ---- the archive ------------------------------------------------------------------------------------------

TREE = {
    "train.py": "print('train')\n",
    "run.sh": "#!/bin/sh\nexec python train.py\n",
    "pkg/__init__.py": "",
    "pkg/model.py": "W = 1\n",
    "données/é.txt": "unicode names\n",
    "a" * 60 + "/" + "b" * 60 + ".py": "a path over tar's 100 characters\n",
    "empty/": None,
    ".gitignore": "__pycache__/\n*.pyc\n",
    "__pycache__/x.pyc": "",
}


def build(root: Path, mtime: float, reverse: bool = False) -> Path:
    items = list(TREE.items())
    make_tree(root, dict(reversed(items) if reverse else items))
    (root / "run.sh").chmod(0o755)
    (root / "train.py").chmod(0o664)  # a group-writable umask must not change the archive
    (root / "lib").symlink_to("pkg")
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (mtime, mtime), follow_symlinks=False)
    return root


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def test_two_packs_of_one_tree_with_different_mtimes_are_byte_identical(tmp_path):
    first = pack(build(tmp_path / "one", 1_000_000_000))
    second = pack(build(tmp_path / "two", 1_700_000_000, reverse=True))
    assert first.sha256 == second.sha256
    assert first.data == second.data
    assert first.sha256 == hashlib.sha256(first.data).hexdigest()
    assert first.object_name == f"sha256-{first.sha256}.tar.gz"
    assert contract.workdir_digest(first.object_name) == first.sha256
    (tmp_path / "two" / "pkg" / "model.py").write_text("W = 2\n")
    assert pack(tmp_path / "two").sha256 != first.sha256, "a changed file must change the digest"


def test_the_archive_holds_only_what_the_node_unpacks(tmp_path):
    packed = pack(build(tmp_path / "w", 1_234_567_890))
    assert packed.data[4:8] == b"\0\0\0\0", "the gzip header's mtime must be 0"
    assert gzip.decompress(packed.data)  # one valid gzip stream
    got = members(packed.data)
    assert set(got) == {"train.py", "run.sh", "pkg", "pkg/__init__.py", "pkg/model.py", "données", "données/é.txt",
                        "a" * 60, "a" * 60 + "/" + "b" * 60 + ".py", "empty", ".gitignore", "lib"}
    assert packed.files == 8  # files and symlinks, not directories
    for name, info in got.items():
        assert not name.startswith("/") and ".." not in name.split("/"), name
        assert info.isfile() or info.isdir() or info.issym(), name
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname) == (MEMBER_MTIME, 0, 0, "", ""), name
    assert got["lib"].issym() and got["lib"].linkname == "pkg"
    assert got["pkg"].isdir() and got["empty"].isdir()


def test_the_executable_bit_is_kept(tmp_path):
    packed = pack(build(tmp_path / "w", 1_234_567_890))
    got = members(packed.data)
    assert got["run.sh"].mode == 0o755
    assert got["train.py"].mode == 0o644
    assert got["pkg"].mode == 0o755
    out = tmp_path / "out"
    with tarfile.open(fileobj=io.BytesIO(packed.data), mode="r:gz") as tar:
        tar.extractall(out, filter="tar")
    assert os.access(out / "run.sh", os.X_OK) and not os.access(out / "train.py", os.X_OK)
    assert (out / "train.py").read_text() == TREE["train.py"]
    assert (out / "lib" / "model.py").read_text() == TREE["pkg/model.py"]


def test_progress_is_reported_up_to_every_file_byte(tmp_path):
    root = tmp_path / "w"
    make_tree(root, {"a.bin": "x" * 300_000, "b/c.bin": "y" * 200_000})
    seen: list[tuple[int, int]] = []
    pack(root, lambda done, total: seen.append((done, total)))
    assert len(seen) > 2
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert {t for _, t in seen} == {500_000}
    assert seen[-1] == (500_000, 500_000)


@pytest.mark.parametrize("target", ["/etc/passwd", "../../outside", "../..", "../../w/../outside"])
def test_a_symlink_leaving_the_tree_is_refused_naming_it(tmp_path, target):
    root = tmp_path / "w"
    make_tree(root, {"train.py": "", "sub/": None})
    (tmp_path / "outside").write_text("secret")
    (root / "sub" / "escape").symlink_to(target)
    with pytest.raises(WorkdirError) as err:
        pack(root)
    message = str(err.value)
    assert "sub/escape" in message and target in message and ".respawnignore" in message


def test_a_symlink_through_an_inner_link_that_leaves_the_tree_is_refused(tmp_path):
    # Lexically inside (hop/../x stays in w), really outside: hop points two levels up.
    root = tmp_path / "w"
    make_tree(root, {"train.py": "", "d/e/": None})
    (root / "d" / "e" / "hop").symlink_to("..")  # inside: w/d
    (root / "out").symlink_to("d/e/hop/../../..")  # lexically w/.., really beyond
    with pytest.raises(WorkdirError, match="symlink out -> "):
        pack(root)


def test_an_ignored_escaping_symlink_is_no_error(tmp_path):
    root = tmp_path / "w"
    make_tree(root, {"train.py": "", ".gitignore": ".venv/\n", ".venv/": None})
    (root / ".venv" / "python").symlink_to("/usr/bin/python3")
    assert packed_files(root) == {"train.py", ".gitignore"}


def test_a_dangling_link_inside_the_tree_is_kept(tmp_path):
    root = tmp_path / "w"
    make_tree(root, {"train.py": ""})
    (root / "later").symlink_to("not-yet")
    assert members(pack(root).data)["later"].linkname == "not-yet"


def test_a_missing_a_file_and_an_empty_directory_are_named(tmp_path):
    with pytest.raises(WorkdirError, match=r"workdir .*nope does not exist"):
        pack(tmp_path / "nope")
    (tmp_path / "f").write_text("")
    with pytest.raises(WorkdirError, match=r"workdir .*/f is not a directory"):
        pack(tmp_path / "f")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkdirError, match="has no files to pack .it is empty."):
        pack(tmp_path / "empty")
    make_tree(tmp_path / "all-ignored", {".respawnignore": "*\n", "a.py": "", "data/x": ""})
    with pytest.raises(WorkdirError) as err:
        pack(tmp_path / "all-ignored")
    assert "has no files to pack after exclusions" in str(err.value)
    assert ".respawnignore" in str(err.value) and "data/" in str(err.value)


def test_a_fifo_or_socket_is_refused_naming_it(tmp_path):
    root = tmp_path / "w"
    make_tree(root, {"train.py": ""})
    os.mkfifo(root / "pipe")
    with pytest.raises(WorkdirError, match="pipe is neither a regular file.*respawnignore"):
        pack(root)
    os.remove(root / "pipe")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(root / "sock"))
        with pytest.raises(WorkdirError, match="sock is neither"):
            pack(root)


def test_a_file_that_shrinks_while_packing_is_named(tmp_path):
    root = tmp_path / "w"
    make_tree(root, {"a.bin": "x" * 100_000, "b.bin": "y" * 100_000})

    def truncate_b(done, total):  # runs while a.bin is read, after the scan took b.bin's size
        with open(root / "b.bin", "w"):
            pass

    with pytest.raises(WorkdirError, match=r"cannot read .*/b.bin: it shrank while it was packed.*respawnignore"):
        pack(root, truncate_b)


def test_a_large_archive_warns_naming_the_biggest_files(tmp_path):
    root = tmp_path / "w"
    make_tree(root, {"small.py": "x", "data/big.bin": "", "data/mid.bin": ""})
    (root / "data" / "big.bin").write_bytes(os.urandom(60_000))
    (root / "data" / "mid.bin").write_bytes(os.urandom(30_000))
    packed = pack(root)
    assert packed.size_warning() is None and packed.size < LARGE_ARCHIVE_BYTES
    warning = packed.size_warning(threshold=50_000)
    assert warning is not None
    assert warning.index("data/big.bin") < warning.index("data/mid.bin") < warning.index("small.py")
    assert "every new node downloads it" in warning and ".respawnignore" in warning


@pytest.mark.parametrize("checkpoint_uri, expected", [
    ("gs://ckpt-bucket/jobs/a", "gs://ckpt-bucket/respawn/workdirs/sha256-{d}.tar.gz"),
    ("gs://ckpt-bucket", "gs://ckpt-bucket/respawn/workdirs/sha256-{d}.tar.gz"),
    ("file:///var/respawn/ckpt/job-a", "file:///var/respawn/ckpt/respawn-workdirs/sha256-{d}.tar.gz"),
    ("file:///var/respawn/ckpt/../job-a", "file:///var/respawn/respawn-workdirs/sha256-{d}.tar.gz"),
])
def test_where_the_archive_goes(checkpoint_uri, expected):
    digest = "0123456789abcdef" * 4
    uri = workdir_uri(checkpoint_uri, digest)
    assert uri == expected.format(d=digest)
    assert contract.workdir_digest(uri) == digest
    spec = schema.parse_spec({
        "id": "j", "accelerator": {"kind": "gpu", "machine_type": "g2-standard-8"}, "zones": ["us-central1-a"],
        "trainer": {"command": ["python", "train.py"], "workdir": uri}, "checkpoint_uri": checkpoint_uri})
    assert spec.trainer.workdir == uri
