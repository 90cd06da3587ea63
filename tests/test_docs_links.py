"""Every relative link in the project's Markdown resolves to a file or folder inside the repository.

Checked: README.md, docs/*.md and the folder READMEs (functions/, node_agent/, trainer/, sim/, respawn/, deploy/,
tests/). A link is `[text](target)` (images too) or a reference definition `[label]: target`. URLs (any scheme)
and pure `#anchors` are skipped; a `#fragment` is stripped before the path is checked. Links inside code (fenced
blocks and inline code spans) are not links and are ignored. No network.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    + [ROOT / d / "README.md" for d in ("functions", "node_agent", "trainer", "sim", "respawn", "deploy", "tests")]
)

_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code."""
    text = _FENCE.sub("", text)
    text = _CODE_SPAN.sub("code", text)
    targets = [m.group(1) for m in _INLINE.finditer(text)] + [m.group(1) for m in _REFERENCE.finditer(text)]
    return [t[1:-1] if t.startswith("<") and t.endswith(">") else t for t in targets]


def local_path(target: str) -> str | None:
    """The path part of a repository link, or None for a URL or a pure anchor."""
    if _SCHEME.match(target) or target.startswith("#"):
        return None
    return target.split("#", 1)[0].split("?", 1)[0]


def problems(page: Path, text: str | None = None) -> tuple[int, list[str]]:
    """(links checked, what is wrong) for the Markdown `text` of `page` (read from the file by default)."""
    checked, bad = 0, []
    for target in links(page.read_text(encoding="utf-8") if text is None else text):
        path = local_path(target)
        if path is None:
            continue
        checked += 1
        if not path:
            bad.append(f"{target!r}: empty path")
            continue
        resolved = (page.parent / path).resolve()
        if resolved != ROOT and ROOT not in resolved.parents:
            bad.append(f"{target!r} leaves the repository ({resolved})")
        elif not resolved.exists():
            bad.append(f"{target!r} does not exist ({resolved.relative_to(ROOT)})")
    return checked, bad


def test_the_pages_exist():
    missing = [str(p.relative_to(ROOT)) for p in PAGES if not p.is_file()]
    assert not missing, f"Markdown pages the link check expects are missing: {missing}"
    assert (ROOT / "docs" / "architecture.md").is_file() and (ROOT / "docs" / "gcp-facts.md").is_file()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page: Path):
    assert page.is_file(), f"{page.relative_to(ROOT)} is missing"
    _, bad = problems(page)
    assert not bad, f"{page.relative_to(ROOT)}: broken links:\n  " + "\n  ".join(bad)


def test_the_check_finds_links():
    # Guards against a parser that silently matches nothing and so passes.
    total = sum(problems(p)[0] for p in PAGES if p.is_file())
    assert total > 10, f"only {total} relative links found in {len(PAGES)} pages: the link parser is broken"


def test_the_parser():
    text = (
        "See [a](docs/a.md#x), ![img](pic.png \"title\"), [b](<with space.md>), [web](https://example.com),\n"
        "[anchor](#here), `[not](code.md)`, [`code text`](real.md).\n"
        "```\n[fenced](no.md)\n```\n"
        "[ref]: ref.md\n"
    )
    assert links(text) == ["docs/a.md#x", "pic.png", "with space.md", "https://example.com", "#here", "real.md",
                           "ref.md"]
    assert [local_path(t) for t in links(text)] == ["docs/a.md", "pic.png", "with space.md", None, None, "real.md",
                                                   "ref.md"]


def test_broken_and_escaping_links_fail():
    page = ROOT / "README.md"
    assert problems(page, "[ok](docs/architecture.md#reconcile) [dir](sim/)") == (2, [])
    _, bad = problems(page, "[up](../outside-the-repository.md)")
    assert len(bad) == 1 and "leaves the repository" in bad[0]
    _, bad = problems(page, "[gone](docs/no-such-page.md)")
    assert len(bad) == 1 and "does not exist" in bad[0]
