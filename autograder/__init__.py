"""Checks and grading tooling for the resume-training workbook.

One module per notebook holds that notebook's checks (``state_dict_aliasing``
for notebook 01, ...). Checks drive the learner's code as a black box: they call
it, then observe returned values, files and processes.
"""

import sys

__version__ = "0.1.0"

# nbformat imports jsonschema, which builds three Earley parsers for the optional "iri" formats when
# rfc3987_syntax is installed (jupyter_events pulls it in): 2 s at every start of workbook-check and
# of each grading process (python-jsonschema/jsonschema#1392). Notebook schemas use no iri format, so
# those processes go without it. Only before jsonschema is imported: later it would change nothing.
if "jsonschema" not in sys.modules:
    sys.modules.setdefault("rfc3987_syntax", None)
