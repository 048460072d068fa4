"""The memory a forked child may take (stages/room.py): the machine's, or what the process's
cgroup leaves under its limit, v2 or v1, whichever is less."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragexam.stages import room

MB = 1 << 20


def cgroups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own: str) -> Path:
    """A cgroup tree in tmp_path, and the /proc/self/cgroup that places this process in it."""
    (tmp_path / "own").write_text(own)
    monkeypatch.setattr(room, "OWN", tmp_path / "own")
    monkeypatch.setattr(room, "CGROUPS", tmp_path / "fs")
    return tmp_path / "fs"


def write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


@pytest.mark.parametrize(("limit", "room_kb"), [(str(300 * MB), 100 * 1024), ("max", None)])
def test_cgroup_v2_leaves_its_limit_less_its_usage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: str, room_kb: int | None
) -> None:
    fs = cgroups(tmp_path, monkeypatch, "0::/box/run\n")
    write(fs / "box" / "run", memory_max=f"{limit}\n", memory_current=f"{200 * MB}\n")
    assert room.cgroup_room() == room_kb


def test_cgroup_v1_reads_the_memory_controller_and_its_no_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = cgroups(tmp_path, monkeypatch, "5:cpu,cpuacct:/x\n4:memory:/api/job\n0::/\n")
    write(fs / "memory" / "api" / "job", memory_limit_in_bytes=str(1 << 30),
          memory_usage_in_bytes=str(1 << 29))  # fmt: skip
    assert room.cgroup_room() == (1 << 29) // 1024
    write(fs / "memory" / "api" / "job", memory_limit_in_bytes="9223372036854771712")
    assert room.cgroup_room() is None  # v1's way of saying no limit


def test_no_cgroup_to_read_sets_no_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cgroups(tmp_path, monkeypatch, "0::/gone\n")
    assert room.cgroup_room() is None


def test_a_child_gets_the_least_of_the_machine_and_the_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process's resident size is what a child is given: a cgroup that leaves less than
    that takes none, whatever the machine has free."""
    resident = room.memory()[1]
    fs = cgroups(tmp_path, monkeypatch, "0::/box\n")
    write(fs / "box", memory_max=str(1 << 40), memory_current="0")
    assert room.room(1) == 1  # the machine has room for one, and the cgroup sets no bound
    write(fs / "box", memory_max=str(resident * 1024 // 2), memory_current="0")
    assert room.room(1) == 0
