#!/usr/bin/env python3
"""Build an nbgrader source notebook from a percent-format script (for authors).

The .ipynb in solutions/ is the source of truth; this tool only saves typing
JSON when a notebook is first written or rewritten wholesale. Cell markers:

    # %% [markdown]            markdown: each line's leading "# " is removed
    # %%                       ordinary code cell
    # %% answer                autograded answer cell; grade_id = the one top-level
                               def/class it defines (the grading contract)
    # %% test id=test_x points=2   autograder test cell, locked

Any header may also carry (e.g. `# %% [markdown] id=intro tags=hide-input`):

    id=NAME                    the cell id (letters, digits, - and _; 64 at most).
                               Default: the grade_id for answer cells; for other
                               cells md-/code- plus 8 hex of the source's sha1, so
                               inserting a cell renumbers nothing (a later cell
                               with the same source gets -2, -3, ...)
    tags=a,b                   metadata.tags, e.g. raises-exception on a cell
                               that fails on purpose, so execution goes on

    python3 tools/build_notebook.py draft.py solutions/NN_name/NN_name.ipynb
    python3 tools/build_notebook.py --export solutions/NN_name/NN_name.ipynb draft.py

--export writes the script back, every cell's id pinned with id=, and refuses a
notebook that would not build back to the same cell types, sources, ids, nbgrader
metadata and tags. Outputs and other cell metadata are not kept (it says which).
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys

import nbformat

MARKER = re.compile(r"^# %%(.*)$")
CELL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # nbformat 4.5's rule for cell ids
KINDS = {"[markdown]": "markdown", "answer": "answer", "test": "test"}
OPTIONS = {"id", "tags", "points"}

ANSWER = {"grade": False, "locked": False, "schema_version": 3, "solution": True, "task": False}
TEST = {"grade": True, "locked": True, "schema_version": 3, "solution": False, "task": False}


def parse_header(header: str) -> tuple[str, dict[str, str]]:
    """'test id=test_x points=2' -> ('test', {'id': 'test_x', 'points': '2'})."""
    words = header.split()
    kind = "code"
    if words and "=" not in words[0]:
        kind = KINDS.get(words.pop(0), "")
        if not kind:
            raise SystemExit(f"unknown cell kind in '# %% {header}' (use [markdown], answer or test)")
    options: dict[str, str] = {}
    for word in words:
        key, _, value = word.partition("=")
        # Strict, so that a typo such as tag= is an error rather than silently lost.
        if key not in OPTIONS or not value or key in options:
            raise SystemExit(f"cannot read {word!r} in '# %% {header}' (options: id=, tags=, points= on tests)")
        options[key] = value
    if "points" in options and kind != "test":
        raise SystemExit(f"points= is for test cells only: '# %% {header}'")
    if kind == "test" and "id" not in options:
        raise SystemExit(f"a test cell needs id= (its grade_id): '# %% {header}'")
    return kind, options


def _defined_name(source: str) -> str:
    names = [node.name for node in ast.parse(source).body
             if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    if len(names) != 1:
        raise SystemExit(f"an answer cell must define exactly one function or class, found {names}:\n{source}")
    return names[0]


def _tags(value: str) -> list[str]:
    tags = value.split(",")
    if "" in tags or len(set(tags)) != len(tags):
        raise SystemExit(f"tags= wants distinct comma-separated names: tags={value}")
    return tags


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


def _assign_ids(cells: list[tuple[nbformat.NotebookNode, str | None]]) -> None:
    """Give each cell its explicit id, else one from its content."""
    explicit: set[str] = set()
    for _, cell_id in cells:
        if cell_id is None:
            continue
        if not CELL_ID.match(cell_id):
            raise SystemExit(f"invalid cell id {cell_id!r}: letters, digits, - and _ only, 1 to 64 of them")
        if cell_id in explicit:
            raise SystemExit(f"duplicate cell id {cell_id!r}: every cell id must be unique")
        explicit.add(cell_id)
    # Explicit ids are all reserved first, so a content id never takes one further down.
    taken = set(explicit)
    for cell, cell_id in cells:
        if cell_id is None:
            prefix = "md" if cell.cell_type == "markdown" else "code"
            base = f"{prefix}-{hashlib.sha1(cell.source.encode()).hexdigest()[:8]}"
            cell_id, n = base, 1
            while cell_id in taken:
                n += 1
                cell_id = f"{base}-{n}"
            taken.add(cell_id)
        cell.id = cell_id


def build(text: str):
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    cells = []
    for header, body in split_cells(text):
        kind, options = parse_header(header)
        if kind == "markdown":
            source = "\n".join(re.sub(r"^# ?", "", line) for line in body.splitlines())
            cell = nbformat.v4.new_markdown_cell(source)
        else:
            cell = nbformat.v4.new_code_cell(body)
        cell_id = options.get("id")
        if kind == "answer":
            name = _defined_name(body)
            cell.metadata["nbgrader"] = {**ANSWER, "grade_id": name}
            cell_id = cell_id or name
        elif kind == "test":
            cell.metadata["nbgrader"] = {**TEST, "grade_id": cell_id, "points": int(options.get("points", 1))}
        if "tags" in options:
            cell.metadata["tags"] = _tags(options["tags"])
        cells.append((cell, cell_id))
    _assign_ids(cells)
    nb.cells = [cell for cell, _ in cells]
    nbformat.validate(nb)
    return nb


def _export_cell(cell) -> tuple[str, list[str]]:
    """The header after '# %%' and the body lines of one cell."""
    grading = cell.metadata.get("nbgrader")
    if cell.cell_type == "markdown":
        kind = " [markdown]"
        # "#" alone keeps an empty line (even a last one) apart from the blank line between cells.
        lines = ["# " + line if line else "#" for line in cell.source.split("\n")]
    elif cell.cell_type == "code":
        kind = ""
        lines = cell.source.split("\n") if cell.source else []
    else:
        raise SystemExit(f"cell {cell.get('id')!r}: a {cell.cell_type} cell has no marker in the script")
    if grading:
        # Only the two shapes build() writes; anything else (a locked markdown cell, a task) has no marker.
        if cell.cell_type == "code" and grading.get("solution") and not grading.get("grade"):
            kind = " answer"
        elif cell.cell_type == "code" and grading.get("grade") and not grading.get("solution"):
            kind = " test"
        else:
            raise SystemExit(f"cell {cell.get('id')!r}: its nbgrader metadata has no marker in the script: {grading}")
    header = kind + (f" id={cell.id}" if cell.get("id") else "")
    if kind == " test":
        header += f" points={grading.get('points', 1)}"
    tags = cell.metadata.get("tags", [])
    if any(not tag or re.search(r"[\s,]", tag) for tag in tags):
        raise SystemExit(f"cell {cell.get('id')!r}: tags with spaces or commas cannot be written as tags=: {tags}")
    if tags:
        header += " tags=" + ",".join(tags)
    for line in lines:
        if MARKER.match(line):
            raise SystemExit(f"cell {cell.get('id')!r}: its line {line!r} would read as a cell marker; "
                             "the script would be ambiguous, so nothing was written")
    return header, lines


def _kept(cell, with_id: bool) -> tuple:
    """What a round trip keeps of a cell."""
    return (cell.cell_type, cell.source, cell.get("id") if with_id else None,
            cell.metadata.get("nbgrader"), cell.metadata.get("tags", []))


def export(nb) -> str:
    """The percent script of a notebook; refused unless it builds back to the same cells."""
    script = "\n\n".join("\n".join([f"# %%{header}", *lines])
                         for header, lines in map(_export_cell, nb.cells)) + "\n"
    try:
        rebuilt = build(script)
    except SystemExit as error:
        raise SystemExit(f"the exported script would not build: {error}") from None
    fields = ("cell type", "source", "id", "nbgrader metadata", "tags")
    for original, back in zip(nb.cells, rebuilt.cells):
        # A notebook older than nbformat 4.5 has no ids to keep.
        with_id = bool(original.get("id"))
        if _kept(original, with_id) != _kept(back, with_id):
            changed = [name for name, a, b in zip(fields, _kept(original, with_id), _kept(back, with_id)) if a != b]
            raise SystemExit(f"cell {original.get('id')!r} would not come back the same "
                             f"({', '.join(changed)} would change); nothing was written")
    return script


def dropped_metadata(nb) -> set[str]:
    """Cell metadata keys that export does not carry."""
    return {key for cell in nb.cells for key in cell.metadata} - {"nbgrader", "tags"}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--export":
        notebook = nbformat.read(sys.argv[2], as_version=4)
        text = export(notebook)
        with open(sys.argv[3], "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {sys.argv[3]}: {len(notebook.cells)} cells")
        if dropped_metadata(notebook):
            print(f"not kept: cell metadata {sorted(dropped_metadata(notebook))}", file=sys.stderr)
    elif len(sys.argv) == 3:
        with open(sys.argv[1], encoding="utf-8") as f:
            notebook = build(f.read())
        nbformat.write(notebook, sys.argv[2])
        print(f"wrote {sys.argv[2]}: {len(notebook.cells)} cells")
    else:
        raise SystemExit(__doc__)
