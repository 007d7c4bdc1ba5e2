"""nbgrader configuration: solutions/ is the source, notebooks/ the release.

Run nbgrader from this folder with the environment's bin/ on PATH (nbgrader
calls `alembic` to set up its gradebook). The README's instructor section
lists the commands.
"""

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute, GetGrades

from autograder.contract import DEFAULT_CELL_TIMEOUT, KERNEL_EXTRA_ARGUMENTS
from autograder.grading.nbgrader_plugins import JudgeInSandbox, RedactHiddenTests
from autograder.grading.nbgrader_plugins import RecordUnconfined, SubmissionExporter, WrapLongOutputs

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

c.CourseDirectory.course_id = "resume-training"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"

# The same limits and kernel flags as the learner's `workbook-check` (used where nbgrader runs a kernel:
# the Validate button and `nbgrader validate`).
c.Execute.timeout = DEFAULT_CELL_TIMEOUT
c.Execute.extra_arguments = KERNEL_EXTRA_ARGUMENTS

# Trusted grading: autograde runs the submission in a sandbox and takes each test cell's verdict from
# the judge, not from a kernel the submission controls (autograder/grading/judge.py; threat model in docs/grading.md).
# nbgrader's own list, with JudgeInSandbox in place of Execute.
c.Autograde.autograde_preprocessors = [JudgeInSandbox if step is Execute else step
                                       for step in Autograde.class_traits()["autograde_preprocessors"].default()
                                       ] + [RecordUnconfined]
c.JudgeInSandbox.timeout = DEFAULT_CELL_TIMEOUT
# A submitted file that is not a notebook: every test cell scores zero, saying why (not a traceback).
c.Autograde.exporter_class = SubmissionExporter


# Feedback shows failure messages, wrapped, not hidden test code or its tracebacks.
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, WrapLongOutputs, RedactHiddenTests]
