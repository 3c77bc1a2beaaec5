"""The `tail -F` follower the log collectors share: growth, rotation, truncation, rewrites and limits."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from collectors.follow import MAX_LINE_BYTES, FollowedFile


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as out:
        out.write(data)


def texts(log: FollowedFile) -> list[str]:
    return [text for _, text in log.read_lines()]


def test_appended_lines_come_once_and_a_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_bytes(b"one\ntwo\nthr")
    log = FollowedFile(path)

    assert log.read_lines() == [(1, "one"), (2, "two")]
    assert log.restarted
    assert log.read_lines() == []
    assert not log.restarted
    append(path, b"ee\nfour\n")
    assert log.read_lines() == [(3, "three"), (4, "four")]
    log.close()


def test_truncated_file_is_read_again_from_line_one(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_bytes(b"a long first line\nanother\nhalf")
    log = FollowedFile(path)
    log.read_lines()

    os.truncate(path, 0)  # copytruncate: same inode, shorter
    append(path, b"fresh\n")

    assert log.read_lines() == [(1, "fresh")]
    assert log.restarted
    log.close()


def test_rotation_finishes_the_old_file_then_reads_the_new_one_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_bytes(b"old 1\n")
    log = FollowedFile(path)
    log.read_lines()
    append(path, b"old 2\nold 3 unterminated")
    path.rename(tmp_path / "kern.log.1")
    path.write_bytes(b"new 1\nnew 2\n")

    assert log.read_lines() == [(2, "old 2"), (3, "old 3 unterminated"), (1, "new 1"), (2, "new 2")]
    assert log.restarted
    append(tmp_path / "kern.log.1", b"written late to the old file\n")
    assert log.read_lines() == []
    log.close()


def test_a_file_removed_while_held_is_still_read_until_its_successor_appears(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_bytes(b"old 1\n")
    log = FollowedFile(path)
    log.read_lines()

    with path.open("ab") as writer:  # the writer keeps the removed file open, like syslog before HUP
        path.unlink()
        writer.write(b"old 2\n")
        writer.flush()
        assert log.read_lines() == [(2, "old 2")]
    path.write_bytes(b"new 1\n")

    assert log.read_lines() == [(1, "new 1")]
    log.close()


def test_without_finish_rotated_a_rotated_files_tail_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "rank0.log"
    path.write_bytes(b"old 1\n")
    log = FollowedFile(path, finish_rotated=False)
    log.read_lines()
    append(path, b"old 2\n")
    path.rename(tmp_path / "rank0.log.1")
    path.write_bytes(b"new 1\n")

    assert log.read_lines() == [(1, "new 1")]
    assert log.restarted


def test_a_rewrite_in_place_of_the_same_length_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"job 1 rank 0\n")
    log = FollowedFile(path, finish_rotated=False)
    log.read_lines()

    with path.open("r+b") as out:  # same inode, same size: only the changed start betrays it
        out.write(b"job 2 rank 0\n")

    assert log.read_lines() == [(1, "job 2 rank 0")]
    assert log.restarted


@pytest.mark.parametrize("finish_rotated", [True, False])
def test_a_backlog_is_read_in_bounded_steps_without_cutting_lines(
    fixtures: Path, tmp_path: Path, finish_rotated: bool
) -> None:
    real = (fixtures / "gpud" / "dmesg-with-xid-119.log").read_bytes()  # 5403 bytes
    path = tmp_path / "kern.log"
    path.write_bytes(real)
    log = FollowedFile(path, finish_rotated=finish_rotated, read_limit=500)

    reads = [log.read_lines() for _ in range(12)]

    assert all(reads[:11]) and reads[11] == []  # 5403 bytes, 500 a read
    assert [line for read in reads for line in read] == list(enumerate(real.decode().splitlines(), 1))
    log.close()


def test_the_read_limit_lets_a_rotated_files_long_tail_finish_first(tmp_path: Path) -> None:
    path = tmp_path / "kern.log"
    path.write_bytes(b"")
    log = FollowedFile(path, read_limit=10)
    log.read_lines()
    append(path, b"old 1\nold 2\nold 3\n")  # 18 bytes: two reads
    path.rename(tmp_path / "kern.log.1")
    path.write_bytes(b"new 1\n")

    assert log.read_lines() == [(1, "old 1")]
    assert not log.restarted
    assert log.read_lines() == [(2, "old 2"), (3, "old 3")]  # and "ne", within the same 10 bytes
    assert log.restarted
    assert log.read_lines() == [(1, "new 1")]
    log.close()


def test_an_endless_line_is_kept_only_up_to_the_bound_and_numbering_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"first\n")
    log = FollowedFile(path, finish_rotated=False, read_limit=MAX_LINE_BYTES)
    log.read_lines()
    tracemalloc.start()
    for _ in range(16):
        append(path, b"x" * MAX_LINE_BYTES)
        assert log.read_lines() == []
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    append(path, b"\nthird\n")

    assert held < 4 * MAX_LINE_BYTES  # not the 1 MiB written

    assert log.read_lines() == [(2, "x" * MAX_LINE_BYTES), (3, "third")]


def test_bytes_that_are_not_utf8_are_replaced_and_the_line_kept(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"n\xe9ud1 ok\n\xff\xfe\n")

    assert FollowedFile(path, finish_rotated=False).read_lines() == [
        (1, "n\ufffdud1 ok"),
        (2, "\ufffd\ufffd"),
    ]


@pytest.mark.parametrize("finish_rotated", [True, False])
def test_a_path_that_never_existed_raises_file_not_found(tmp_path: Path, finish_rotated: bool) -> None:
    log = FollowedFile(tmp_path / "absent.log", finish_rotated=finish_rotated)

    with pytest.raises(FileNotFoundError):
        log.read_lines()


def test_a_vanished_file_raises_file_not_found_when_nothing_is_held(tmp_path: Path) -> None:
    path = tmp_path / "job.log"
    path.write_bytes(b"line\n")
    log = FollowedFile(path, finish_rotated=False)
    log.read_lines()

    path.unlink()

    with pytest.raises(FileNotFoundError):
        log.read_lines()
