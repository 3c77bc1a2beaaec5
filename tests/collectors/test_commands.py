"""collectors.commands.run against real tools: a missing binary, one past its timeout, one printing past
the bound (`yes`, `head -c`), a non-zero exit and output that is not UTF-8."""

from __future__ import annotations

import sys

import pytest

from collectors.commands import Completed, run
from collectors.errors import CommandError, CommandNotFound, CommandOutputTooLarge, CommandTimedOut


def test_a_tool_that_exits_non_zero_gives_its_status_and_both_streams() -> None:
    assert run(["sh", "-c", "echo out; echo err >&2; exit 3"], 10) == Completed(3, "out\n", "err\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fleetlens-no-such-tool"], "fleetlens-no-such-tool is not installed (not found on PATH)"),
        (["/nonexistent/dcgmi", "diag"], "/nonexistent/dcgmi does not exist"),
    ],
)
def test_a_missing_binary_is_command_not_found_naming_it(argv: list[str], message: str) -> None:
    with pytest.raises(CommandNotFound) as missing:
        run(argv, 10)
    assert str(missing.value) == message


def test_a_file_that_cannot_be_executed_is_a_command_error(tmp_path) -> None:
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\n")  # not executable
    with pytest.raises(CommandError, match="tool cannot be run: Permission denied"):
        run([str(script)], 10)


def test_a_tool_past_its_timeout_is_killed_with_its_children() -> None:
    with pytest.raises(CommandTimedOut, match=r"^sh ran past its 0.3 s timeout$"):
        run(["sh", "-c", "sleep 60 & sleep 60"], 0.3)  # the backgrounded child holds the pipes open


@pytest.mark.parametrize(
    ("argv", "stream"),
    [
        (["yes"], "stdout"),  # never stops on its own: only the bound ends it
        (["head", "-c", "5000", "/dev/zero"], "stdout"),
        (["sh", "-c", "head -c 5000 /dev/zero >&2"], "stderr"),
    ],
)
def test_output_past_the_bound_is_refused_naming_the_stream(argv: list[str], stream: str) -> None:
    with pytest.raises(CommandOutputTooLarge) as refused:
        run(argv, 30, max_output_bytes=4096)
    assert str(refused.value) == f"{argv[0]} wrote more than 4096 bytes to {stream}"


def test_output_at_the_bound_is_kept_whole() -> None:
    assert run(["head", "-c", "4096", "/dev/zero"], 30, max_output_bytes=4096).stdout == "\0" * 4096


def test_bytes_that_are_not_utf8_are_replaced_and_said() -> None:
    code = "import sys; sys.stdout.buffer.write(b'ok\\xff'); sys.stderr.buffer.write(b'\\xfe')"
    ran = run([sys.executable, "-c", code], 30)
    assert (ran.stdout, ran.stderr, ran.stdout_replaced) == ("ok\ufffd", "\ufffd", True)


def test_a_replacement_character_the_tool_wrote_is_not_taken_for_bad_bytes() -> None:
    ran = run([sys.executable, "-c", "print('\\ufffd')"], 30, env={"PYTHONIOENCODING": "utf-8"})
    assert (ran.stdout, ran.stdout_replaced) == ("\ufffd\n", False)


def test_the_environment_given_is_the_tools_whole_environment() -> None:
    assert run(["/usr/bin/env"], 10, env={"ONLY": "this"}).stdout == "ONLY=this\n"
