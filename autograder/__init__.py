"""Checks and grading tooling for the resume-training workbook.

Top level: one module per notebook holds that notebook's checks (``state_dict_aliasing`` for
notebook 01, ...; the registry is ``course``), with what they build on (``checking``, ``helpers``,
``portable``, ``contract``, ``fresh_process``) and notebook 07's rank runtime (``gloo_demo``, ``rank_server``).
Checks drive the learner's code as a black box: they call it, then observe returned values,
files and processes. ``grading/`` is the trusted-grading engine, ``commands/`` the console commands.
"""

import importlib
import sys
import types

__version__ = "0.1.0"

# nbformat imports jsonschema, which builds three Earley parsers for the optional "iri" formats when
# rfc3987_syntax is installed (jupyter_events pulls it in): 2 s at every start of workbook-check and
# of each grading process (python-jsonschema/jsonschema#1392). Notebook schemas use no iri format, so
# those processes go without it. Only before jsonschema is imported: later it would change nothing.
if "jsonschema" not in sys.modules:
    sys.modules.setdefault("rfc3987_syntax", None)


# Modules that moved when the package was laid out by role, under their old names, for what outside
# this repository may still name them: an instructor's own copy of nbgrader_config.py, console scripts
# of an environment installed before. Each is imported on first use only.
MOVED = {
    "nbgrader_judge": "autograder.grading.nbgrader_plugins",
    "nbgrader_feedback": "autograder.grading.nbgrader_plugins",
    "notebook_runner": "autograder.contract",
    "selfcheck": "autograder.commands.check",
    "class_grading": "autograder.commands.grade",
    "classroom": "autograder.commands.demo",
}


class _MovedModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):     # tools that walk sys.modules (inspect) must not import it
            raise AttributeError(name)
        return getattr(importlib.import_module(self.__moved_to__), name)


for _old, _new in MOVED.items():
    _alias = _MovedModule(f"{__name__}.{_old}", f"Moved to {_new}.")
    _alias.__moved_to__ = _new
    sys.modules.setdefault(_alias.__name__, _alias)
