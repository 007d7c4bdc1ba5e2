"""tools/build_notebook.py: markers, tags, stable ids, and export's round trip."""

import importlib.util

import nbformat
import pytest

from autograder.course import REPO_ROOT

ROOT = REPO_ROOT
_spec = importlib.util.spec_from_file_location("build_notebook", ROOT / "tools" / "build_notebook.py")
build_notebook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_notebook)

SOLUTIONS = sorted(ROOT.glob("solutions/*/*.ipynb"))

DRAFT = """\
# %% [markdown]
# # Title
#
# Some text.

# %%
import torch

# %% answer
def square(x):
    return x * x

# %% test id=test_square points=2
assert square(3) == 9

# %% [markdown]
# The end.
"""


def kept(cell):
    return (cell.cell_type, cell.source, cell.id, cell.metadata.get("nbgrader"), cell.metadata.get("tags", []))


def test_existing_markers():
    nb = build_notebook.build(DRAFT)
    assert [c.cell_type for c in nb.cells] == ["markdown", "code", "code", "code", "markdown"]
    assert nb.cells[0].source == "# Title\n\nSome text."
    answer, test = nb.cells[2], nb.cells[3]
    assert answer.id == "square" and answer.metadata["nbgrader"]["grade_id"] == "square"
    assert answer.metadata["nbgrader"]["solution"] and not answer.metadata["nbgrader"]["grade"]
    assert test.id == "test_square" and test.metadata["nbgrader"]["points"] == 2
    assert test.metadata["nbgrader"]["locked"]
    assert "tags" not in nb.cells[1].metadata


def test_tags_parsed_on_every_kind():
    nb = build_notebook.build(
        "# %% [markdown] tags=hide-input\n# hi\n\n"
        "# %% tags=raises-exception\nraise RuntimeError('on purpose')\n\n"
        "# %% answer tags=a,b\ndef f():\n    pass\n\n"
        "# %% test id=test_f points=3 tags=raises-exception,hide-input\nf()\n"
    )
    assert [c.metadata["tags"] for c in nb.cells] == [
        ["hide-input"], ["raises-exception"], ["a", "b"], ["raises-exception", "hide-input"]]
    assert nb.cells[3].metadata["nbgrader"]["points"] == 3


def test_explicit_ids_kept():
    nb = build_notebook.build(
        "# %% [markdown] id=intro\n# hi\n\n"
        "# %% id=setup tags=x\nx = 1\n\n"
        "# %% answer id=answer-cell\ndef f():\n    pass\n\n"
        "# %% test id=test_f\nf()\n"
    )
    assert [c.id for c in nb.cells] == ["intro", "setup", "answer-cell", "test_f"]
    # An explicit id names the cell; the answer's grade_id stays the name it defines.
    assert nb.cells[2].metadata["nbgrader"]["grade_id"] == "f"


def test_content_ids_are_valid_and_distinct():
    nb = build_notebook.build("# %%\nx = 1\n\n# %%\nx = 1\n\n# %%\n\n# %% [markdown]\n# x = 1\n")
    ids = [c.id for c in nb.cells]
    assert len(set(ids)) == len(ids)
    assert ids[0].startswith("code-") and ids[1] == ids[0] + "-2"
    assert ids[3].startswith("md-")
    assert all(build_notebook.CELL_ID.match(i) for i in ids)


def test_content_id_never_takes_a_later_explicit_id():
    first = build_notebook.build("# %%\nx = 1\n").cells[0].id
    nb = build_notebook.build(f"# %%\nx = 1\n\n# %% id={first}\ny = 2\n")
    assert nb.cells[1].id == first and nb.cells[0].id != first


@pytest.mark.parametrize("where", range(6))
def test_inserting_a_cell_changes_no_other_id(where):
    cells = DRAFT.split("\n\n")
    before = [c.id for c in build_notebook.build(DRAFT).cells]
    cells.insert(where, "# %% [markdown]\n# A new cell.\n\n# %%\nprint('new')")
    after = [c.id for c in build_notebook.build("\n\n".join(cells)).cells]
    assert after[:where] + after[where + 2:] == before


def test_answer_defining_two_names_refused():
    with pytest.raises(SystemExit, match="exactly one function or class, found \\['f', 'g'\\]"):
        build_notebook.build("# %% answer\ndef f():\n    pass\n\ndef g():\n    pass\n")


def test_duplicate_explicit_id_refused():
    with pytest.raises(SystemExit, match="duplicate cell id 'same'"):
        build_notebook.build("# %% id=same\nx = 1\n\n# %% [markdown] id=same\n# hi\n")
    with pytest.raises(SystemExit, match="duplicate cell id 'test_f'"):
        build_notebook.build("# %% test id=test_f\npass\n\n# %% test id=test_f\npass\n")


@pytest.mark.parametrize("header, message", [
    ("# %% id=has.dot", "invalid cell id"),
    ("# %% id=" + "x" * 65, "invalid cell id"),
    ("# %% tag=raises-exception", "cannot read 'tag=raises-exception'"),
    ("# %% tags=a,,b", "tags= wants"),
    ("# %% points=2", "points= is for test cells only"),
    ("# %% test points=2", "a test cell needs id="),
    ("# %% [md]", "unknown cell kind"),
])
def test_bad_headers_refused(header, message):
    with pytest.raises(SystemExit, match=message):
        build_notebook.build(header + "\npass\n")


def test_export_refuses_a_line_that_reads_as_a_marker():
    nb = build_notebook.build("# %%\nx = 1\n")
    nb.cells[0].source = "x = 1\n# %% not a new cell"
    with pytest.raises(SystemExit, match="would read as a cell marker"):
        build_notebook.export(nb)
    # In markdown, "%% ..." would be written as "# %% ..."; a markdown "# %%" is safe ("# # %%").
    nb.cells[0] = nbformat.v4.new_markdown_cell("%% percent")
    with pytest.raises(SystemExit, match="would read as a cell marker"):
        build_notebook.export(nb)
    nb.cells[0] = nbformat.v4.new_markdown_cell("# %% heading")
    assert build_notebook.build(build_notebook.export(nb)).cells[0].source == "# %% heading"


def test_export_refuses_what_would_not_come_back():
    nb = build_notebook.build("# %%\nx = 1\n")
    nb.cells[0].source = "\nx = 1"  # a leading blank line in code cannot be written
    with pytest.raises(SystemExit, match="source would change"):
        build_notebook.export(nb)
    nb = build_notebook.build("# %% [markdown]\n# hi\n")
    nb.cells[0].metadata["nbgrader"] = {"grade": False, "solution": False, "locked": True, "grade_id": "x",
                                        "schema_version": 3, "task": False}
    with pytest.raises(SystemExit, match="nbgrader metadata has no marker"):
        build_notebook.export(nb)


def test_export_round_trip_of_a_draft():
    nb = build_notebook.build(DRAFT.replace("# %% answer", "# %% answer tags=raises-exception"))
    nb.cells[0].source += "\n"  # a markdown cell's last empty line survives as "#"
    back = build_notebook.build(build_notebook.export(nb))
    assert [kept(c) for c in back.cells] == [kept(c) for c in nb.cells]


def test_solution_notebooks_found():
    assert SOLUTIONS, "no solutions/*/*.ipynb: the round trip below would test nothing"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.parent.name for p in SOLUTIONS])
def test_solution_notebook_round_trip(path):
    nb = nbformat.read(path, as_version=4)
    back = build_notebook.build(build_notebook.export(nb))
    assert [kept(c) for c in back.cells] == [kept(c) for c in nb.cells]
