"""docs/architecture.md stays true to the tree: its list of the pure control core is the import contract's
(pyproject.toml), and every file, folder and module it names exists (one named with a class or function defines it)."""

from __future__ import annotations

import ast
import re
import tomllib

from tests.deploy_fixtures import ROOT

CONTRACT = "the pure control core imports no Google client and no adapter"


def _contract_modules() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [c for c in data["tool"]["importlinter"]["contracts"] if c["name"] == CONTRACT]
    return {m.removeprefix("respawn.control.") for m in contract["source_modules"]}


def _documented() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| pure core:"))
    rule = next(line for line in text.splitlines() if line.startswith("- The pure control core ("))
    return {"import table": {m.split(".")[-1] for m in re.findall(r"`(?:respawn\.control)?\.?(\w+)`", row.split("|")[1])},
            "import rules": set(re.findall(r"`(\w+)`", rule.split(")")[0]))}


def test_the_documented_pure_core_is_the_contracts():
    modules = _contract_modules()
    assert "identities" in modules and "job" in modules
    for where, documented in _documented().items():
        assert documented == modules, f"docs/architecture.md ({where}) lists {sorted(documented)}; the contract " \
                                      f"checks {sorted(modules)}"


# The folders a path in the design may name; a token with a placeholder ({zone}, <framework>) is a pattern, not a path.
_FOLDERS = ("functions/", "node_agent/", "trainer/", "respawn/", "sim/", "deploy/", "bench/", "tests/", "docs/",
            "examples/", ".ci/")
_PRODUCT = ("functions", "node_agent", "trainer", "respawn", "sim", "deploy", "bench")


def _quoted() -> list[str]:
    return re.findall(r"`([^`\s]+)`", (ROOT / "docs" / "architecture.md").read_text())


def _defines(path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    return any(getattr(n, "name", None) == name or isinstance(n, ast.Assign) and any(
        getattr(t, "id", None) == name for t in n.targets) for n in ast.walk(tree))


def test_every_file_and_folder_the_design_names_exists():
    named = {t.rstrip(".,;:") for t in _quoted() if t.startswith(_FOLDERS) and not re.search(r"[{<*]", t)}
    missing = []
    for token in sorted(named):
        module, dot, attr = token.partition(".py.")  # folder/module.py.name
        if not dot and (m := re.fullmatch(r"([\w/]+)\.([A-Z]\w*)", token)):  # folder/module.Class
            module, attr = m.groups()
        target = ROOT / (module + ".py" if attr else token)
        if not target.exists() or attr and not _defines(target, attr):
            missing.append(token)
    assert len(named) > 40 and not missing, f"docs/architecture.md names what is not in the tree: {missing}"


def test_every_module_the_design_names_exists():
    from deploy.stage import package_dirs, source_file

    dirs = package_dirs(ROOT)
    modules = {t.rstrip(".,;:") for t in _quoted() if re.fullmatch(r"respawn(\.\w+)+", t.rstrip(".,;:"))}
    missing = []
    for name in sorted(modules):
        if source_file(dirs, name) is not None:
            continue
        owner, _, attr = name.rpartition(".")
        found = source_file(dirs, owner)
        if found is None or not _defines(found, attr):
            missing.append(name)
    bare = {t for t in _quoted() if re.fullmatch(r"\w+\.py", t)}  # a module named by its file alone
    missing += [f for f in sorted(bare) if not any(any((ROOT / d).rglob(f)) for d in _PRODUCT)]
    assert len(modules) > 10 and not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def _class_lengths(folder: str) -> dict[str, int]:
    """`file.py:Class` → its lines, for every class in the folder's modules."""
    found = {}
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    return found


def test_no_room_outgrows_the_limit_the_design_sets():
    text = " ".join((ROOT / "docs" / "architecture.md").read_text().split())
    limits = {what: int(m.group(1)) for what, pattern in {
        "decide": r"`functions/decide.py` stays under (\d+) lines", "sim": r"no class in `sim/` over (\d+) lines",
        "agent": r"`Agent` under (\d+) lines"}.items() if (m := re.search(pattern, text))}
    assert set(limits) == {"decide", "sim", "agent"}, f"docs/architecture.md's room sizes not found: {limits}"
    decide = len((ROOT / "functions" / "decide.py").read_text().splitlines())
    assert decide < limits["decide"], f"functions/decide.py has {decide} lines"
    big = {name: n for name, n in _class_lengths("sim").items() if n > limits["sim"]}
    assert not big, f"classes in sim/ over {limits['sim']} lines: {big}"
    agent = _class_lengths("node_agent")["node_agent/agent.py:Agent"]
    assert agent < limits["agent"], f"Agent has {agent} lines"
