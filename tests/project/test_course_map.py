"""The registry is the course: every notebook in it appears in the README's table and in notebook 00's
map, each link opens the released notebook, the authoring guide points nowhere outside the repository, and
every file of it that they name is there."""

import re

import nbformat

from autograder.course import NOTEBOOKS, RELEASE_DIR, REPO_ROOT


def _markdown(path) -> str:
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")


def _linked(text: str) -> set[str]:
    return set(re.findall(r"\]\((?:\.\./|notebooks/)(\d\d_\w+)/\1\.ipynb\)", text))


def test_the_readme_table_lists_every_notebook_with_a_link_that_opens():
    readme = (REPO_ROOT / "README.md").read_text()
    assert _linked(readme) == {n.folder for n in NOTEBOOKS}
    for notebook in NOTEBOOKS:
        assert notebook.source(RELEASE_DIR).exists(), notebook.folder


def test_notebook_00s_map_lists_every_other_notebook():
    start = next(n for n in NOTEBOOKS if n.number == "00")
    for root in (start.source().parent.parent, RELEASE_DIR):
        assert _linked(_markdown(start.source(root))) == {n.folder for n in NOTEBOOKS if n is not start}, root.name


def test_authoring_md_links_nothing_outside_the_repository():
    text = (REPO_ROOT / "AUTHORING.md").read_text()
    assert not re.search(r"https?://|\.\./", text)
    for target in re.findall(r"\]\(([^)#]+)", text):
        assert (REPO_ROOT / target).exists(), target


def test_every_file_of_the_repository_a_notebook_or_the_guides_name_exists():
    """A notebook that sends the learner to `autograder/...py` (or the README and AUTHORING.md to a module)
    names a file that is there: a module that became a package moves its code."""
    texts = {name: (REPO_ROOT / name).read_text() for name in ("README.md", "AUTHORING.md")}
    texts |= {notebook.folder: _markdown(notebook.source()) for notebook in NOTEBOOKS}
    named = {(where, path) for where, text in texts.items()
             for path in re.findall(r"`((?:autograder|tests|tools|benchmarks)/[\w/]+\.py)`", text)}
    assert named, "no file named: the pattern finds nothing"
    missing = [(where, path) for where, path in sorted(named) if "NN_" not in path and not (REPO_ROOT / path).exists()]
    assert missing == []
