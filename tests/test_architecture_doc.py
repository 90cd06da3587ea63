"""docs/architecture.md's list of the pure control core is the import contract's (pyproject.toml): a module added to
one and not the other is either unchecked or undocumented."""

from __future__ import annotations

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
