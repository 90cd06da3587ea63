"""Pack a directory of user code into the workdir archive a node unpacks as the trainer's working directory.

The archive is a gzip'd tar whose bytes depend only on the packed tree: entries in a fixed order, every member's
mtime, owner and group fixed, modes normalised as git does (0755 when the owner may execute, else 0644; 0755 for
directories), and the gzip header's mtime 0. Its name is the sha256 of those bytes (`sha256-HEX.tar.gz`,
respawn.contract.workdir_digest), so one tree gives one name and one upload, whichever machine packs it (the zlib
of the packing Python aside).

What is left out, as git would leave it out of a commit (git semantics, https://git-scm.com/docs/gitignore):
every `.git` entry; what the root's and nested `.gitignore` files exclude (a deeper file overrides a shallower
one; within a file the last matching line decides); then the root's `.respawnignore`, same syntax, which
overrides them all. A directory left out is not entered, so nothing under it can be re-included. The
repository's .git/info/exclude, core.excludesFile and .gitignore files above DIR are not read.

Symlinks are kept as links if they are relative and stay inside DIR; any other is refused, naming it. Only
regular files, directories and such symlinks are packed (what the node's unpacker accepts).

Standard library only (and respawn.contract): the upload is respawn.app.codestore's.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import re
import stat
import tarfile
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterable, Literal

from respawn.contract import WORKDIR_SUFFIX, StoreUri
from respawn.deployment import RESPAWN_PREFIX

IGNORE_FILE = ".gitignore"
RESPAWN_IGNORE_FILE = ".respawnignore"  # at DIR's root only; applied after (over) every .gitignore
ALWAYS_EXCLUDED = ".git"  # a directory, or a file in worktrees and submodules
# 2000-01-01T00:00:00Z: fixed, and after 1980, the floor of zip timestamps (a setup step building a wheel from the
# unpacked tree would fail on older files).
MEMBER_MTIME = 946684800
COMPRESS_LEVEL = 6  # nearly level 9's size, several times faster on code and data files
# Every fresh node downloads the archive before the trainer starts: above this, the CLI warns.
LARGE_ARCHIVE_BYTES = 200_000_000
# Where a job's archives go: gs://BUCKET/respawn/workdirs/ in the bucket of its checkpoint_uri, or, for a
# file:///PATH checkpoint_uri, the directory respawn-workdirs beside PATH.
GCS_PREFIX = f"{RESPAWN_PREFIX}/workdirs"
LOCAL_DIR = "respawn-workdirs"

Progress = Callable[[int, int], None]  # (bytes done, bytes in all)


class WorkdirError(Exception):
    """A directory that cannot be packed; the message names the path and what to do."""


# ---- ignore rules -----------------------------------------------------------------------------------------

_POSIX_CLASSES = {
    "alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": " \\t", "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9",
    "graph": "\\x21-\\x7e", "lower": "a-z", "print": "\\x20-\\x7e", "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    "space": " \\t\\n\\r\\f\\v", "upper": "A-Z", "xdigit": "0-9A-Fa-f",
}
_NEVER = "(?!)"  # git's wildmatch aborts on a malformed bracket: the line matches nothing


def _bracket(pattern: str, i: int) -> tuple[str, int]:
    """The regex of the bracket expression opening at pattern[i] == "[", and the index after it."""
    j = i + 1
    negate = j < len(pattern) and pattern[j] in "!^"
    if negate:
        j += 1
    items: list[str] = []
    first = True
    while j < len(pattern):
        c = pattern[j]
        if c == "]" and not first:
            body = "".join(items)
            # Under git's WM_PATHNAME a bracket never matches "/".
            return (f"[^/{body}]" if negate else f"(?!/)[{body}]"), j + 1
        first = False
        if c == "[" and pattern.startswith("[:", j):
            end = pattern.find(":]", j + 2)
            if end < 0:
                return _NEVER, len(pattern)
            cls = _POSIX_CLASSES.get(pattern[j + 2:end])
            if cls is None:
                return _NEVER, len(pattern)
            items.append(cls)
            j = end + 2
            continue
        if c == "\\" and j + 1 < len(pattern):
            j += 1
            c = pattern[j]
        lo = c
        j += 1
        if j + 1 < len(pattern) and pattern[j] == "-" and pattern[j + 1] != "]":
            hi = pattern[j + 1]
            j += 2
            if hi == "\\" and j < len(pattern):
                hi = pattern[j]
                j += 1
            if hi < lo:
                return _NEVER, len(pattern)
            items.append(f"{re.escape(lo)}-{re.escape(hi)}")
        else:
            items.append(re.escape(lo))
    return _NEVER, len(pattern)  # no closing "]"


def _translate(pattern: str) -> str:
    """A gitignore glob (without its "!", trailing "/" and leading "/") as a regex over a "/"-separated path."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            at_start = i == 0 or pattern[i - 1] == "/"
            if j - i >= 2 and at_start and j == n:
                out.append(".*")  # trailing "/**": everything inside
            elif j - i >= 2 and at_start and pattern[j] == "/":
                out.append("(?:.*/)?")  # "**/": zero or more directories
                j += 1
            else:
                out.append("[^/]*")  # "*", and "**" not between slashes
            i = j
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            regex, i = _bracket(pattern, i)
            out.append(regex)
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class Rule:
    line: str  # as written, for messages
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    basename: bool  # no "/" but a trailing one: matched against the entry's name at any depth

    def matches(self, rel: str, name: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        return bool(self.regex.fullmatch(name if self.basename else rel))


def parse_rule(line: str) -> Rule | None:
    """One line of a .gitignore, or None for a blank line or a comment."""
    text = line.rstrip("\r\n")
    # Trailing spaces are dropped unless escaped with a backslash.
    end = len(text)
    while end > 0 and text[end - 1] == " " and not (end >= 2 and text[end - 2] == "\\"):
        end -= 1
    text = text[:end]
    if not text or text.startswith("#"):
        return None
    negate = text.startswith("!")
    if negate:
        text = text[1:]
    dir_only = text.endswith("/")
    if dir_only:
        text = text[:-1]
    if not text:
        return None
    basename = "/" not in text
    if text.startswith("/"):
        text = text[1:]
    return Rule(line.rstrip("\r\n"), re.compile(_translate(text), re.DOTALL), negate, dir_only, basename)


def parse_rules(text: str) -> list[Rule]:
    return [r for r in (parse_rule(line) for line in text.lstrip("\ufeff").splitlines()) if r is not None]


@dataclass(frozen=True)
class RuleFile:
    """The rules of one ignore file, and the directory (relative to DIR, "" for DIR) they are relative to."""

    path: str  # relative to DIR, for messages
    base: str
    rules: tuple[Rule, ...]

    def decide(self, rel: str, name: str, is_dir: bool) -> bool | None:
        """True: excluded, False: re-included by a "!" line, None: no line matches."""
        sub = rel if not self.base else rel[len(self.base) + 1:]
        for rule in reversed(self.rules):
            if rule.matches(sub, name, is_dir):
                return not rule.negate
        return None


def excluded(rel: str, is_dir: bool, gitignores: Iterable[RuleFile], respawnignore: RuleFile | None) -> bool:
    """Whether the entry at `rel` (relative to DIR, "/"-separated) is left out. `gitignores` are the .gitignore
    files of the entry's ancestors, shallowest first."""
    name = rel.rsplit("/", 1)[-1]
    if name == ALWAYS_EXCLUDED:
        return True
    for rules in ([respawnignore] if respawnignore else []) + list(reversed(list(gitignores))):
        verdict = rules.decide(rel, name, is_dir)
        if verdict is not None:
            return verdict
    return False


def _read_rules(path: str, rel: str, base: str) -> RuleFile | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):  # as git: a symlinked ignore file is not followed
        return None
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise WorkdirError(f"cannot read {path}: {exc.strerror}") from None
    return RuleFile(rel, base, tuple(parse_rules(text)))


# ---- the walk ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Member:
    path: str  # relative to DIR, "/"-separated
    kind: Literal["file", "dir", "symlink"]
    size: int = 0  # bytes of a regular file
    mode: int = 0o644  # as packed
    target: str = ""  # of a symlink

    @property
    def executable(self) -> bool:
        return self.kind == "file" and bool(self.mode & 0o100)


@dataclass(frozen=True)
class Scan:
    root: str  # absolute
    members: tuple[Member, ...]  # in archive order
    excluded: tuple[str, ...]  # the outermost entries left out, directories ending in "/"

    @property
    def files(self) -> int:
        """Regular files and symlinks (directories are not counted)."""
        return sum(1 for m in self.members if m.kind != "dir")

    @property
    def content_bytes(self) -> int:
        return sum(m.size for m in self.members)


def _inside(rel_link: str, target: str) -> bool:
    """Whether a relative symlink at rel_link resolves, lexically, inside the tree."""
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel_link), target))
    return resolved != ".." and not resolved.startswith("../") and not resolved.startswith("/")


def _check_link(root: str, rel: str, full: str) -> str:
    target = os.readlink(full)
    hint = (f"the node unpacks only relative symlinks that stay inside the directory: add {rel!r} (or its "
            f"directory) to {RESPAWN_IGNORE_FILE}, or replace the link with a copy of what it points to")
    if os.path.isabs(target):
        raise WorkdirError(f"symlink {rel} -> {target} is absolute; {hint}")
    real = os.path.realpath(full)
    if not _inside(rel, target) or not (real == root or real.startswith(root + os.sep)):
        raise WorkdirError(f"symlink {rel} -> {target} points outside {root}; {hint}")
    return target


def scan(root: str | os.PathLike[str]) -> Scan:
    """The entries of `root` that would be packed, in archive order, and the outermost ones left out."""
    top = os.path.realpath(os.fspath(root))
    if not os.path.exists(top):
        raise WorkdirError(f"workdir {os.fspath(root)} does not exist; pass the directory that holds your "
                           "training code")
    if not os.path.isdir(top):
        raise WorkdirError(f"workdir {os.fspath(root)} is not a directory; pass the directory that holds your "
                           "training code")
    respawnignore = _read_rules(os.path.join(top, RESPAWN_IGNORE_FILE), RESPAWN_IGNORE_FILE, "")
    members: list[Member] = []
    left_out: list[str] = []

    def walk(dir_rel: str, gitignores: list[RuleFile]) -> None:
        full_dir = os.path.join(top, *dir_rel.split("/")) if dir_rel else top
        here = _read_rules(os.path.join(full_dir, IGNORE_FILE), posixpath.join(dir_rel, IGNORE_FILE), dir_rel)
        rules = gitignores + [here] if here else gitignores
        try:
            names = sorted(os.listdir(full_dir))
        except OSError as exc:
            raise WorkdirError(f"cannot list {full_dir}: {exc.strerror}; fix its permissions or add it to "
                               f"{RESPAWN_IGNORE_FILE}") from None
        for name in names:
            rel = f"{dir_rel}/{name}" if dir_rel else name
            full = os.path.join(full_dir, name)
            st = os.lstat(full)
            is_dir = stat.S_ISDIR(st.st_mode)
            if excluded(rel, is_dir, rules, respawnignore):
                left_out.append(rel + "/" if is_dir else rel)
                continue
            if is_dir:
                members.append(Member(rel, "dir", mode=0o755))
                walk(rel, rules)
            elif stat.S_ISLNK(st.st_mode):
                members.append(Member(rel, "symlink", mode=0o777, target=_check_link(top, rel, full)))
            elif stat.S_ISREG(st.st_mode):
                members.append(Member(rel, "file", st.st_size, 0o755 if st.st_mode & stat.S_IXUSR else 0o644))
            else:
                raise WorkdirError(f"{rel} is neither a regular file, a directory nor a symlink (a socket, FIFO "
                                   f"or device); add it to {RESPAWN_IGNORE_FILE}")

    walk("", [])
    result = Scan(top, tuple(members), tuple(left_out))
    if result.files == 0:
        shown = ", ".join(left_out[:8]) + (", …" if len(left_out) > 8 else "")
        raise WorkdirError(f"workdir {os.fspath(root)} has no files to pack"
                           + (f" after exclusions ({len(left_out)} left out by .git, {IGNORE_FILE} or "
                              f"{RESPAWN_IGNORE_FILE}: {shown})" if left_out else " (it is empty)"))
    return result


# ---- the archive ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PackedWorkdir:
    scan: Scan
    data: bytes  # the .tar.gz
    sha256: str  # of data

    @property
    def object_name(self) -> str:
        return f"sha256-{self.sha256}{WORKDIR_SUFFIX}"

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def files(self) -> int:
        return self.scan.files

    def biggest(self, n: int = 5) -> list[Member]:
        return sorted((m for m in self.scan.members if m.kind == "file"), key=lambda m: (-m.size, m.path))[:n]

    def size_warning(self, threshold: int = LARGE_ARCHIVE_BYTES) -> str | None:
        """A warning when every fresh node would download a large archive, naming the biggest files."""
        if self.size <= threshold:
            return None
        names = ", ".join(f"{m.path} ({human_bytes(m.size)})" for m in self.biggest())
        return (f"the workdir archive is {human_bytes(self.size)} (over {human_bytes(threshold)}), and every new "
                f"node downloads it before training starts; the biggest files: {names}. Keep data sets and "
                f"checkpoints out of it ({RESPAWN_IGNORE_FILE} takes .gitignore lines) and read them from Cloud "
                "Storage instead")


class _Counting(io.RawIOBase):
    """A file read through, reporting the bytes read so far to a callback."""

    def __init__(self, f: BinaryIO, report: Callable[[int], None]):
        self.f, self.report = f, report

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        chunk = self.f.read(n)
        self.report(len(chunk))
        return chunk


def _tarinfo(m: Member) -> tarfile.TarInfo:
    info = tarfile.TarInfo(m.path)
    info.mtime = MEMBER_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = m.mode
    if m.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif m.kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, m.target
    else:
        info.size = m.size
    return info


def pack(root: str | os.PathLike[str], progress: Progress | None = None) -> PackedWorkdir:
    """Pack `root` (see the module's docstring for what is left out); `progress(done, total)` is called as file
    bytes are read. Raises WorkdirError naming what cannot be packed."""
    found = scan(root)
    total, done = found.content_bytes, 0
    buf = io.BytesIO()

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    # filename="" and mtime=0 keep the gzip header free of the packing machine's details.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=COMPRESS_LEVEL, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for m in found.members:
                info = _tarinfo(m)
                if m.kind != "file":
                    tar.addfile(info)
                    continue
                full = os.path.join(found.root, *m.path.split("/"))
                try:
                    with open(full, "rb") as f:
                        tar.addfile(info, _Counting(f, advance))
                except OSError as exc:
                    if exc.strerror is None:  # tarfile's "unexpected end of data": shorter than when scanned
                        raise WorkdirError(f"cannot read {full}: it shrank while it was packed; pack again when "
                                           f"nothing writes to it, or add it to {RESPAWN_IGNORE_FILE}") from None
                    raise WorkdirError(f"cannot read {full}: {exc.strerror}; fix its permissions or add it to "
                                       f"{RESPAWN_IGNORE_FILE}") from None
    if progress is not None and total == 0:
        progress(0, 0)
    data = buf.getvalue()
    return PackedWorkdir(found, data, hashlib.sha256(data).hexdigest())


# ---- where it goes ------------------------------------------------------------------------------------------

def workdir_uri(checkpoint_uri: str, digest: str) -> str:
    """The archive's URI for a job with this checkpoint_uri: gs://BUCKET/respawn/workdirs/sha256-HEX.tar.gz in the
    checkpoint bucket (whatever its prefix), or file:///DIR/respawn-workdirs/sha256-HEX.tar.gz where
    file:///DIR/NAME is the checkpoint_uri (beside the job's checkpoint directory)."""
    name = f"sha256-{digest}{WORKDIR_SUFFIX}"
    try:
        where = StoreUri.parse(checkpoint_uri)
    except ValueError as exc:
        raise WorkdirError(f"checkpoint_uri {exc}") from None
    if where.local_path is None:
        return str(StoreUri(StoreUri.GS, where.bucket, f"{GCS_PREFIX}/{name}"))
    beside = posixpath.dirname(posixpath.normpath(where.local_path))
    return str(StoreUri(StoreUri.FILE, "", beside).join(f"{LOCAL_DIR}/{name}"))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
