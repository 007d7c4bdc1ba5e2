"""nbgrader configuration: solutions/ is the source, notebooks/ the release.

Run nbgrader from this folder with the environment's bin/ on PATH (nbgrader
calls `alembic` to set up its gradebook). The README's instructor section
lists the commands.
"""

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import GetGrades

from autograder.nbgrader_feedback import RedactHiddenTests
from autograder.notebook_runner import DEFAULT_CELL_TIMEOUT, KERNEL_EXTRA_ARGUMENTS

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

c.CourseDirectory.course_id = "resume-training"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"

# The same limits and kernel flags as the learner's `workbook-check`.
c.Execute.timeout = DEFAULT_CELL_TIMEOUT
c.Execute.extra_arguments = KERNEL_EXTRA_ARGUMENTS

# Feedback shows failure messages, not hidden test code or its tracebacks.
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, RedactHiddenTests]
