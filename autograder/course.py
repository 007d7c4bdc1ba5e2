"""The course's one registry: its notebooks, in reading order, and the check module each one's test
cells import. The judge, the sandbox's guards, the commands, the release and the tests all derive
from this list; adding a notebook adds one line here (AUTHORING.md has the checklist).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS_DIR = REPO_ROOT / "solutions"
# The released notebooks: the repository's notebooks/, or in the student distribution, which is installed
# without the repository around it, the copy packaged inside it (workbook.py release --student-package).
PACKAGED_RELEASE_DIR = Path(__file__).resolve().parent / "released"
STUDENT_DISTRIBUTION = PACKAGED_RELEASE_DIR.is_dir()
RELEASE_DIR = PACKAGED_RELEASE_DIR if STUDENT_DISTRIBUTION else REPO_ROOT / "notebooks"


@dataclasses.dataclass(frozen=True)
class Notebook:
    folder: str          # solutions/<folder>/<folder>.ipynb, released as notebooks/<folder>/<folder>.ipynb
    checks: str          # autograder.<checks>: imported by its locked test cells, so it never moves
    # How long it may run top to bottom, as a multiple of the benchmark's optim floor (a fresh kernel
    # importing torch and matplotlib and taking one optimizer step): benchmarks/run_benchmarks.py.
    time_target: float = 1.5

    @property
    def number(self) -> str:
        return self.folder.split("_", 1)[0]

    @property
    def check_module(self) -> str:
        return f"autograder.{self.checks}"

    @property
    def check_modules(self) -> tuple[str, ...]:
        """The check module and, where it is a package (one module per exercise), each of its modules: read
        from the file tree, so a module added there is guarded in the sandbox without another list."""
        package = Path(__file__).resolve().parent / self.checks
        parts = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__") if package.is_dir() else []
        return (self.check_module, *(f"{self.check_module}.{part}" for part in parts))

    def source(self, root: Path = SOLUTIONS_DIR) -> Path:
        return root / self.folder / f"{self.folder}.ipynb"


NOTEBOOKS = (
    Notebook("00_start_here", checks="start_here"),
    Notebook("01_state_dict_aliasing", checks="state_dict_aliasing"),
    Notebook("02_adam_resume", checks="adam_resume"),
    Notebook("03_complete_checkpoint", checks="complete_checkpoint"),
    Notebook("04_worker_generators", checks="worker_seeding"),
    Notebook("05_atomic_writes", checks="atomic_writes"),
    Notebook("06_data_ledger", checks="data_ledger"),
    Notebook("07_distributed_sampler", checks="distributed_sampler", time_target=2.5),   # real multi-rank jobs
    Notebook("08_commit_boundary", checks="commit_boundary"),
    Notebook("09_sharded_checkpoints", checks="sharded_checkpoints", time_target=2.5),   # and DCP in the kernel
    Notebook("10_auditable_progress", checks="auditable_progress"),
)

# What check modules build on; shared by every notebook's checks, so guarded like them in the sandbox.
CHECK_SUPPORT = ("autograder.checking", "autograder.helpers", "autograder.contract",
                 "autograder.engine.portable", "autograder.engine.fresh_process", "autograder.engine.fresh_server",
                 "autograder.engine.fresh_wire", "autograder.engine.fresh_runs",
                 "autograder.engine.confinement", "autograder.engine.travel", "autograder.engine.crash_trials",
                 "autograder.engine.file_operations", "autograder.engine.forked_ranks")
CHECK_MODULES = tuple(name for notebook in NOTEBOOKS for name in notebook.check_modules)


def matching(selectors: list[str], known: list[str], command: str, where: str = "") -> list[str]:
    """The names in ``known`` that the selectors pick: a name itself, a prefix such as ``01``, or a
    notebook file's name; all of them when there is no selector. Unknown selectors end the command."""
    if not selectors:
        return list(known)
    chosen: list[str] = []
    for selector in selectors:
        name = Path(selector).stem if selector.endswith(".ipynb") else selector
        matches = [k for k in known if k == name] or [k for k in known if k.startswith(name)]
        if not matches:
            raise SystemExit(f"{command}: no notebook matches {selector!r}{where} "
                             f"(known: {', '.join(known) or 'none'})")
        chosen += [m for m in matches if m not in chosen]
    return chosen
