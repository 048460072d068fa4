"""How many forked children the memory holds: the machine's, and the cgroup's, if it has a limit.

A page that the parent or a child writes while the other maps it is copied, and CPython
writes into every object it reads. The rows are packed so that neither reads the exam's
objects (packed.py), but the result index and whatever else a row touches are still shared:
a child is given the parent's resident size, the most it could copy. Linux only; none when
that is not known.
"""

from __future__ import annotations

from pathlib import Path

CGROUPS = Path("/sys/fs/cgroup")
OWN = Path("/proc/self/cgroup")  # which cgroups this process is in
_UNLIMITED = 1 << 60  # bytes: cgroup v1 says "no limit" with a number near 2**63


def room(children: int) -> int:
    """How many of these children the free memory takes (0 when it cannot be told)."""
    try:
        available, resident = memory()
    except (OSError, ValueError, IndexError):
        return 0
    return min(children, available // max(resident, 1))


def memory() -> tuple[int, int]:
    """The memory this process may still take and its resident size, in kB: the machine's
    available memory, or what the cgroup's limit leaves, whichever is less."""
    available = _field("/proc/meminfo", "MemAvailable:")
    limited = cgroup_room()
    return min(available, limited) if limited is not None else available, _field(
        "/proc/self/status", "VmRSS:"
    )


def cgroup_room() -> int | None:
    """What this process's memory cgroup (v2 or v1) leaves under its limit, in kB; None when
    it sets none, or cannot be read."""
    for limit, usage in _cgroup_files():
        try:
            top = limit.read_text().strip()
            if top == "max" or int(top) >= _UNLIMITED:
                return None
            return max(int(top) - int(usage.read_text()), 0) // 1024
        except (OSError, ValueError):
            continue
    return None


def _cgroup_files() -> list[tuple[Path, Path]]:
    """(limit, usage) files of this process's memory cgroup, the likeliest first."""
    files = []
    try:
        lines = OWN.read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        if number == "0" and not controllers:  # v2: one hierarchy
            base = CGROUPS / path.lstrip("/")
            files.append((base / "memory.max", base / "memory.current"))
        elif "memory" in controllers.split(","):  # v1
            for base in (CGROUPS / "memory" / path.lstrip("/"), CGROUPS / "memory"):
                files.append((base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"))
    return files


def _field(path: str, name: str) -> int:
    with Path(path).open(encoding="ascii") as lines:
        for line in lines:
            if line.startswith(name):
                return int(line.split()[1])
    raise ValueError(f"no {name} in {path}")
