"""Which ``autograder`` package a grader runs, wherever the course and the package lie.

Instructors grade in many layouts: the course folder is a clone of this repository and the package is
installed from it (the README's), or installed from another checkout, from a wheel, in a hub's shared
environment, on a Dask worker, in a platform's container. Two things must then hold:

- **Every process of a sandbox imports the one package the grader runs.** A sandbox may read the package
  folder, not the folder it lies in when that is the course folder (the gradebook, the hidden tests and
  every submission lie there). An interpreter started inside the sandbox (the server of fresh processes,
  multiprocessing's forkserver, a new interpreter a check starts) finds packages by listing the folders of
  ``sys.path``: listing the course folder is refused, so it would go on to whatever other copy the
  environment knows (an editable install of another checkout: unreadable, and the fresh process died with
  a bare ``ConnectionResetError``; a wheel: other code than the grader's). ``import_root()`` is a folder
  of the grader's own holding only a link named ``autograder`` to the package: the sandbox's ``PYTHONPATH``,
  readable and listable from inside, and nothing else in it.
- **The course and the package agree.** Where the course folder holds its own ``autograder/`` and the
  grader imports another one, the test cells of the course's notebooks would be judged by other checks
  than the course's. ``course_disagreement()`` says so (both places, and how to make them one) unless both
  hold the same code; the commands refuse to grade then.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import tempfile
from pathlib import Path

import autograder
from autograder.grading.protections import ConfinementRefused

PACKAGE_DIR = Path(autograder.__file__).resolve().parent
IMPORT_PREFIX = "workbook-import-"
_ROOT: dict = {}      # the import root of this grading tree: forked grading children inherit (and share) it


def import_root() -> str:
    """The folder every process of a sandbox imports ``autograder`` from (see the module's docstring).

    Made once per grading process and inherited by the children it forks (their sandboxes all come from
    one zygote, which keeps the first one's ``PYTHONPATH``); removed when its maker ends, or by the next
    grader's sweep when its maker was killed (``cgroups.sweep``)."""
    root = _ROOT.get("path")
    if root is None or not os.path.isdir(root):
        from autograder.grading import cgroups
        root = tempfile.mkdtemp(prefix=f"{IMPORT_PREFIX}{cgroups.owner_tag()}-")
        os.chmod(root, 0o755)       # a sandbox of an ordinary user runs as that user; as root, as root
        os.symlink(PACKAGE_DIR, os.path.join(root, "autograder"))
        _ROOT.update(path=root, maker=os.getpid())
        atexit.register(_remove, root, os.getpid())
    return root


def _remove(root: str, maker: int) -> None:
    if os.getpid() == maker:
        from autograder.grading.scratch import remove_tree
        remove_tree(root)


@functools.lru_cache(maxsize=4)      # a grading process asks once per course; its code does not change meanwhile
def package_digest(folder: Path = PACKAGE_DIR) -> str:
    """What the package's code is: every .py file under ``folder``, by relative path and content."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        relative = path.relative_to(folder)
        if "__pycache__" in relative.parts or relative.parts[0] == "released":
            continue
        digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def course_disagreement(course: Path) -> str | None:
    """Why grading ``course`` with the package this process imports would judge it with other checks than
    the course's own; None when they agree (no copy in the course, the same folder, or the same code)."""
    theirs = Path(course).resolve() / "autograder"
    if not (theirs / "__init__.py").is_file() or theirs.resolve() == PACKAGE_DIR:
        return None
    try:
        if package_digest(theirs) == package_digest():
            return None
    except OSError as exc:
        return f"the course's autograder/ ({theirs}) cannot be read: {exc}"
    return (f"the course folder holds its own autograder/ ({theirs}), but this grader imports another one, "
            f"with other code ({PACKAGE_DIR}): the course's notebooks would be judged by checks that are not "
            f"the course's. Grade with the course's own package (`pip install -e {course}` into this "
            f"environment, or run the course's `python3 workbook.py grade`), or bring both to the same "
            f"version.")


class LayoutRefused(ConfinementRefused):
    """Grading refused before it starts: the course's own package and the one imported differ."""


def refuse_disagreement(course: Path) -> None:
    """Raise LayoutRefused where ``course_disagreement`` finds one."""
    why = course_disagreement(course)
    if why:
        raise LayoutRefused(f"grading refused: {why}")
