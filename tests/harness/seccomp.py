"""Run a command under a systemd unit's system call filter, without systemd as PID 1.

``SystemCallFilter=`` lines are read from the unit and their ``@groups`` expanded by
``systemd-analyze syscall-filter`` (the same tables systemd compiles in); the result is loaded with
libseccomp (ctypes; libseccomp2 ships with systemd) and the command is exec'd under it, so the
filter is the one systemd would apply, and it outlives the exec as it does under systemd.

Semantics, as systemd.exec(5): the first ``SystemCallFilter=`` decides the kind (an allow-list, or
a deny-list when it starts with ``~``); later lines add to or take from it; an empty assignment
resets it. A call outside the filter kills the process (SIGSYS) unless ``SystemCallErrorNumber=``
names an errno, which it then returns. A few calls are always allowed (``ALWAYS_ALLOWED``).

    python -m tests.harness.seccomp --unit deploy/systemd/gatewayd.service -- gatewayd --config ...
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# systemd.exec(5): "execve, exit, exit_group, getrlimit, rt_sigreturn, sigreturn" and friends are
# always permitted, so a filtered service can still start and end.
ALWAYS_ALLOWED = frozenset(
    {"execve", "exit", "exit_group", "getrlimit", "rt_sigreturn", "sigreturn", "arch_prctl", "brk"}
)
_SCMP_ACT_KILL_PROCESS = 0x80000000
_SCMP_ACT_ALLOW = 0x7FFF0000


def _scmp_act_errno(number: int) -> int:
    return 0x00050000 | (number & 0xFFFF)


@dataclass(frozen=True)
class SyscallFilter:
    allow_list: bool  # True: only ``names`` are allowed; False: ``names`` are refused
    names: frozenset[str]
    errno: int | None  # None: a refused call kills the process (SIGSYS)

    def allows(self, name: str) -> bool:
        return name in ALWAYS_ALLOWED or (name in self.names) == self.allow_list


@cache
def expand(item: str) -> frozenset[str]:
    """A system call name, or every name of an ``@group`` (its nested groups included)."""
    if not item.startswith("@"):
        return frozenset({item})
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter", "--no-pager", item], capture_output=True, text=True, check=True
    ).stdout
    names: set[str] = set()
    for line in out.splitlines()[1:]:  # the first line is the group's own name
        entry = line.strip()
        if entry and not entry.startswith("#"):
            names |= expand(entry)
    return frozenset(names)


def unit_settings(unit: Path, key: str) -> list[str]:
    """The values of ``key=`` in the unit's [Service] section, in order."""
    values, section = [], ""
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line.startswith(f"{key}="):
            values.append(line.split("=", 1)[1].strip())
    return values


def unit_filter(unit: Path) -> SyscallFilter | None:
    """The unit's system call filter; None when it sets none."""
    allow_list: bool | None = None
    names: set[str] = set()
    for value in unit_settings(unit, "SystemCallFilter"):
        if not value:
            allow_list, names = None, set()
            continue
        deny = value.startswith("~")
        items = {n for item in value.lstrip("~").split() for n in expand(item)}
        if allow_list is None:
            allow_list, names = not deny, items
        elif deny == (not allow_list):  # the same kind as the first line: more of it
            names |= items
        else:
            names -= items
    if allow_list is None:
        return None
    numbers = unit_settings(unit, "SystemCallErrorNumber")
    return SyscallFilter(allow_list, frozenset(names), _errno(numbers[-1]) if numbers else None)


def _errno(value: str) -> int:
    return int(value) if value.isdigit() else getattr(errno, value)


def load(rules: SyscallFilter) -> None:
    """Load ``rules`` into this process (and what it execs); raises OSError if libseccomp fails."""
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    refuse = _SCMP_ACT_KILL_PROCESS if rules.errno is None else _scmp_act_errno(rules.errno)
    if rules.allow_list:
        default, listed, names = refuse, _SCMP_ACT_ALLOW, rules.names | ALWAYS_ALLOWED
    else:
        default, listed, names = _SCMP_ACT_ALLOW, refuse, rules.names - ALWAYS_ALLOWED
    ctx = lib.seccomp_init(default)
    if not ctx:
        raise OSError("seccomp_init failed")
    for name in sorted(names):
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:  # a call this architecture does not have (e.g. a 32-bit variant)
            continue
        rc = lib.seccomp_rule_add(ctx, listed, number, 0)
        if rc < 0:
            raise OSError(-rc, f"seccomp_rule_add({name})")
    rc = lib.seccomp_load(ctx)
    if rc < 0:
        raise OSError(-rc, "seccomp_load")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unit", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command to run is required")
    rules = unit_filter(args.unit)
    if rules is not None:
        load(rules)
    os.execvp(command[0], command)
    sys.exit(127)


if __name__ == "__main__":
    main()
