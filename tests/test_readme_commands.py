"""The README holds exactly two set-up commands (the demo, the tests), and .ci/run runs both exactly as written, from
the repository root (a test that hands the demo an absolute folder once hid a demo failing on every fresh clone)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def setup_commands() -> list[str]:
    section = (ROOT / "README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_has_the_two_setup_commands():
    commands = setup_commands()
    assert len(commands) == 2, commands
    demo, tests = commands
    assert demo.endswith("respawn demo"), f"the first command must run the demo with every default: {demo}"
    assert "pytest" in tests, tests


def test_ci_runs_each_readme_command_as_written_and_checks_the_demo():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    demo, tests = setup_commands()
    for command in (demo, tests):
        assert command in lines, f".ci/run does not run the README's command as written: {command}"
    assert lines.index(demo) < lines.index("python3 .ci/check-demo respawn-demo-out"), \
        ".ci/run must check the summary the demo wrote in its default output folder"
