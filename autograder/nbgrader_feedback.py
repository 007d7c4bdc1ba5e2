"""Feedback that shows each failure message but never the hidden tests.

By default nbgrader's feedback HTML shows the autograded notebook: the source of
hidden test blocks and the traceback lines that point into them. This
preprocessor, added to ``GenerateFeedback.preprocessors`` in nbgrader_config.py,
replaces each hidden block with a one-line note and reduces every error in a
test cell to its ``ExceptionName: message`` line, which is written for the learner.
"""

from __future__ import annotations

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

HIDDEN_BEGIN = "BEGIN HIDDEN TESTS"
HIDDEN_END = "END HIDDEN TESTS"
HIDDEN_NOTE = "# (hidden tests with other seeds and sizes ran here)"


def redact_hidden_blocks(source: str) -> str:
    kept, hidden = [], False
    for line in source.split("\n"):
        if HIDDEN_BEGIN in line:
            hidden = True
            kept.append(line[: len(line) - len(line.lstrip())] + HIDDEN_NOTE)
        elif HIDDEN_END in line:
            hidden = False
        elif not hidden:
            kept.append(line)
    return "\n".join(kept)


class RedactHiddenTests(Preprocessor):
    enabled = Bool(True)  # nbconvert registers preprocessors switched off unless they say otherwise

    def preprocess_cell(self, cell, resources, index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            cell.source = redact_hidden_blocks(cell.source)
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources
