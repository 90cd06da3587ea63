"""respawn.logs.one_line: how every failure is told in one line, on every side (the CLI, the doctor, the trainer)."""

from __future__ import annotations

from respawn.logs import one_line


def test_a_message_of_several_lines_keeps_each_on_one_line():
    said = one_line(RuntimeError("403 Forbidden\n\n   caller   lacks\tstorage.objects.get\n"))
    assert said == "403 Forbidden; caller lacks storage.objects.get"


def test_a_long_message_is_cut_where_asked_and_says_so():
    assert one_line("x" * 500, 200) == "x" * 200 + "..."
    assert one_line("x" * 200, 200) == "x" * 200


def test_an_exception_without_text_is_named_by_its_type():
    assert one_line(TimeoutError()) == "TimeoutError"
    assert one_line("") == ""
