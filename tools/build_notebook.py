#!/usr/bin/env python3
"""Build an nbgrader source notebook from a percent-format script (for authors).

The .ipynb in solutions/ is the source of truth; this tool only saves typing
JSON when a notebook is first written or rewritten wholesale. Cell markers:

    # %% [markdown]            markdown: each line's leading "# " is removed
    # %%                       ordinary code cell
    # %% answer                autograded answer cell; grade_id = the one top-level
                               def/class it defines (the grading contract)
    # %% test id=test_x points=2   autograder test cell, locked

    python3 tools/build_notebook.py draft.py solutions/NN_name/NN_name.ipynb
"""

from __future__ import annotations

import ast
import re
import sys

import nbformat

MARKER = re.compile(r"^# %%(.*)$")


def _options(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def _defined_name(source: str) -> str:
    names = [node.name for node in ast.parse(source).body
             if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    if len(names) != 1:
        raise SystemExit(f"an answer cell must define exactly one function or class, found {names}:\n{source}")
    return names[0]


def split_cells(text: str) -> list[tuple[str, str]]:
    cells, header, body = [], None, []
    for line in text.splitlines():
        match = MARKER.match(line)
        if match:
            if header is not None:
                cells.append((header, "\n".join(body).strip("\n")))
            header, body = match.group(1).strip(), []
        elif header is not None:
            body.append(line)
    if header is not None:
        cells.append((header, "\n".join(body).strip("\n")))
    return cells


def build(text: str):
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    counters: dict[str, int] = {}
    for header, body in split_cells(text):
        kind = header.split()[0] if header else "code"
        if kind == "[markdown]":
            source = "\n".join(re.sub(r"^# ?", "", line) for line in body.splitlines())
            cell = nbformat.v4.new_markdown_cell(source)
        else:
            cell = nbformat.v4.new_code_cell(body)
        if kind == "answer":
            name = _defined_name(body)
            cell.metadata["nbgrader"] = {"grade": False, "grade_id": name, "locked": False,
                                         "schema_version": 3, "solution": True, "task": False}
            cell.id = name
        elif kind == "test":
            opts = _options(header)
            cell.metadata["nbgrader"] = {"grade": True, "grade_id": opts["id"], "locked": True,
                                         "points": int(opts.get("points", 1)), "schema_version": 3,
                                         "solution": False, "task": False}
            cell.id = opts["id"]
        else:
            label = "md" if kind == "[markdown]" else "code"
            counters[label] = counters.get(label, 0) + 1
            cell.id = f"{label}-{counters[label]:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1], encoding="utf-8") as f:
        notebook = build(f.read())
    nbformat.write(notebook, sys.argv[2])
    print(f"wrote {sys.argv[2]}: {len(notebook.cells)} cells")
