"""Which of the sandbox's protections this machine gives, said on the console, and the refusal rule.

Every grading start (``nbgrader autograde``, ``workbook.py grade``, a grading worker) prints one line
saying what confines each submission here. Where a protection that keeps classmates apart, bounds what
one submission may take from the machine, or keeps the course folder unreadable is missing, grading
refuses, naming what is missing and how to get it, unless the instructor passes ``--allow-unconfined``;
each grade then records what was missing (``unconfined_note``). docs/grading.md lists each protection,
what gives it with and without root, and what is refused.

A sandbox reports its protections itself, as it set them up (``autograder.grading.confine``); the
judge adds the watchdog it runs where there is no memory cgroup (``autograder.grading.watchdog``).
"""

from __future__ import annotations

import dataclasses

from autograder.grading.confine import NAMESPACES

CGROUP_FIX = ("grade as root (the grader makes a cgroup per sandbox), or inside a cgroup v2 subtree delegated "
              "to you: `systemd-run --user --scope -p Delegate=yes python3 workbook.py grade ...`")
USERNS_FIX = ("allow unprivileged user namespaces (Debian/Ubuntu before 24.04: sysctl "
              "kernel.unprivileged_userns_clone=1; Ubuntu 24.04: sysctl kernel.apparmor_restrict_unprivileged_userns=0)")


@dataclasses.dataclass(frozen=True)
class Protection:
    key: str          # the sandbox's report field
    label: str        # how the console line names it
    good: tuple       # report values (prefixes) that give it
    parallel: tuple   # ... when several submissions are judged at once on this machine (None: the same)
    fix: str


PROTECTIONS = (
    Protection("processes", "processes", ("cgroup", "RLIMIT_NPROC per"), ("cgroup", "RLIMIT_NPROC per sandbox"),
               f"{CGROUP_FIX}; on Linux 5.14 and newer an ordinary user's RLIMIT_NPROC is per sandbox already"),
    Protection("memory", "memory", ("cgroup", "watchdog"), None, CGROUP_FIX),
    Protection("cpu", "CPU", ("",), ("cgroup", "autogroup"),
               f"{CGROUP_FIX}; or turn autogroup on (sysctl kernel.sched_autogroup_enabled=1); or grade one "
               f"submission at a time (--jobs 1)"),
    Protection("namespaces", "namespaces", (NAMESPACES,), None, USERNS_FIX),
    Protection("folders", "folders", ("private tmpfs",), None, USERNS_FIX),
    Protection("proc", "/proc", ("own",), None, USERNS_FIX),
    Protection("filesystem", "files", ("Landlock",), None,
               "Landlock needs Linux 5.13 or newer with it among the active security modules (lsm=...,landlock)"),
    Protection("course", "course folder", ("unreadable",), None,
               "keep the course folder (and its gradebook and submissions) outside the folders a sandbox may "
               "read: the Python installation and /usr, /lib, /etc, /opt"),
    Protection("syscalls", "system calls", ("seccomp",), None, "seccomp filters need Linux on x86_64 or aarch64"),
)


class ConfinementRefused(Exception):
    """Grading refused: a protection is missing on this machine. The message says which, and the fix."""


def missing(confinement: dict, parallel: bool) -> list[tuple[Protection, str]]:
    """The protections this sandbox lacks, each with what it reported."""
    lacking = []
    for protection in PROTECTIONS:
        state = str(confinement.get(protection.key, "off (not reported)"))
        wanted = protection.parallel if parallel and protection.parallel is not None else protection.good
        if not state.startswith(wanted):
            lacking.append((protection, state))
    return lacking


def summary(confinement: dict) -> str:
    """The console line: each protection as this machine gives it."""
    parts = [f"{p.label}: {confinement.get(p.key, 'off (not reported)')}" for p in PROTECTIONS]
    return "trusted grading confines each submission with " + "; ".join(parts)


def enforce(confinement: dict, parallel: bool, allow_unconfined: bool) -> list[str]:
    """Raise ConfinementRefused when a protection is missing, unless the instructor allowed it; return what
    is missing (empty when nothing), for the record."""
    lacking = missing(confinement, parallel)
    if lacking and not allow_unconfined:
        lines = [f"  - {p.label}: {state}. Fix: {p.fix}." for p, state in lacking]
        raise ConfinementRefused(
            "trusted grading refused: on this machine a submission would not be confined"
            + (" while others are graded beside it" if parallel else "") + ":\n" + "\n".join(lines)
            + "\nFix that, or pass --allow-unconfined (nbgrader: --JudgeInSandbox.allow_unconfined=True) to "
              "grade anyway: every grade then records what was missing.")
    return [f"{p.label}: {state}" for p, state in lacking]


def unconfined_note(lacking: list[str]) -> str:
    """What a grade made with --allow-unconfined records (the gradebook's comment on each answer)."""
    return "Graded with --allow-unconfined; this sandbox lacked " + "; ".join(lacking) + "."
