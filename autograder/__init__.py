"""Checks and grading tooling for the resume-training workbook.

One module per notebook holds that notebook's checks (``state_dict_aliasing``
for notebook 01, ...). Checks drive the learner's code as a black box: they call
it, then observe returned values, files and processes.
"""

__version__ = "0.1.0"
