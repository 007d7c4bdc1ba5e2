"""Checks and grading tooling for the resume-training workbook, laid out by role.

Top level: one module per notebook holds that notebook's scenarios, probes and checks
(``state_dict_aliasing`` for notebook 01, ...; the registry is ``course``). Released test cells import
them by name, so they never move. Beside them, what every check uses: ``checking`` (graded_check,
expect, observe), ``helpers`` (toy models and data), ``contract`` (the grading contract).
``engine/`` is the machinery checks and demos share: fresh processes, crash trials in PID namespaces
and process groups, the file-operation recorder, the rank server and launchers, portable functions.
``demos/`` is what the notebooks run on screen: notebook 05's demo writer, 07's gloo and 09's sharded
jobs, 10's token streams, the live controls. ``grading/`` is the trusted-grading engine, ``commands/``
the console commands, ``platforms/`` the judge in Gradescope's and PrairieLearn's containers.
Checks drive the learner's code as a black box: they call it, then observe returned values, files and
processes.
"""

import importlib
import importlib.machinery
import sys

__version__ = "0.1.0"

# nbformat imports jsonschema, which builds three Earley parsers for the optional "iri" formats when
# rfc3987_syntax is installed (jupyter_events pulls it in): 2 s at every start of workbook-check and
# of each grading process (python-jsonschema/jsonschema#1392). Notebook schemas use no iri format, so
# those processes go without it. Only before jsonschema is imported: later it would change nothing.
if "jsonschema" not in sys.modules:
    sys.modules.setdefault("rfc3987_syntax", None)


# Modules under the names they had before they moved, for what outside this repository may still name
# them: a released notebook's cells (engine/ and demos/), an instructor's own copy of nbgrader_config.py,
# console scripts of an environment installed before. The old name is the very same module object as the
# new (fresh_process._SERVER exists once), imported on first use only, so ``import autograder`` stays cheap.
MOVED = {
    "autograder.nbgrader_judge": "autograder.grading.nbgrader_plugins",
    "autograder.nbgrader_feedback": "autograder.grading.nbgrader_plugins",
    "autograder.notebook_runner": "autograder.contract",
    "autograder.selfcheck": "autograder.commands.check",
    "autograder.class_grading": "autograder.commands.grade",
    "autograder.classroom": "autograder.commands.demo",
    "autograder.fresh_process": "autograder.engine.fresh_process",
    "autograder.portable": "autograder.engine.portable",
    "autograder.rank_server": "autograder.engine.rank_server",
    "autograder.gloo_demo": "autograder.demos.gloo_demo",
    "autograder.sharded_demo": "autograder.demos.sharded_demo",
    "autograder.token_streams": "autograder.demos.token_streams",
    "autograder.controls": "autograder.demos.controls",
}


class _Renamed:
    """A finder and loader for the old names of MOVED (a plain class: importlib.abc costs 8 ms to import)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state   # the import system set the old name's spec on it


if not any(isinstance(finder, _Renamed) for finder in sys.meta_path):
    sys.meta_path.append(_Renamed())
