#!/usr/bin/env python3
"""Mutation testing of every exercise's reference answer: do the checks catch answers that are almost right?

    .venv/bin/python tools/mutate.py                          # every exercise, report to docs/mutation-report.md
    .venv/bin/python tools/mutate.py --only 06 10/judge_deviation --jobs 2 --timeout 60 --cap 40
    .venv/bin/python tools/mutate.py --only 00 --list         # the mutants, without running them

Each exercise's reference answer is the answer cell of ``solutions/NN_topic/NN_topic.ipynb`` (its
``grade_id`` is the name it defines). Mutants change one thing inside ``### BEGIN SOLUTION`` ...
``### END SOLUTION`` (operators below). A mutant goes through every check call of the exercise's test
cells, visible and hidden, read from the notebook by ``tests/support/notebook_checks.py`` exactly as
``tests/notebooks/test_answers.py`` runs fixture answers: in this process, as in a learner's kernel
(``tests/grading/test_judge_faithful.py`` proves graded mode gives the same verdicts). It is killed
when a call fails (or raises, or passes its timeout: a test cell would score zero), and survives when
every call passes. Each mutant runs in a forked child, ``--jobs`` at a time, under ``--timeout``.

A survivor is either a wrong answer the checks miss (add a fixture for its family and a check that
catches it), or right by the exercise's contract: an *equivalent* mutant, listed in
``tools/mutation_equivalents.toml`` under its key (notebook/exercise:operator:hash of the mutated cell)
with a one-line reason; the report counts those apart. The score is killed / (mutants - equivalent).
Run on demand, like the benchmarks; not part of ``workbook.py test``.
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import difflib
import hashlib
import os
import pickle
import random
import signal
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]

EQUIVALENTS = REPO / "tools" / "mutation_equivalents.toml"
REPORT = REPO / "docs" / "mutation-report.md"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
# One-argument wrappers whose removal is a plausible slip: the copy, the conversion, the sort.
UNWRAP_METHODS = {"clone", "copy", "detach", "item", "tolist", "numpy", "cpu", "contiguous", "float", "double",
                  "long", "int", "keys", "values", "items", "strip", "flush"}
UNWRAP_FUNCTIONS = {"deepcopy", "copy", "int", "float", "bool", "str", "list", "tuple", "dict", "sorted",
                    "reversed", "abs", "len", "max", "min", "sum", "range", "enumerate", "iter", "Path",
                    "abspath", "dirname", "basename", "str"}
SWAPPED_COMPARISONS = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE,
                       ast.GtE: ast.Gt, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
SWAPPED_OPERATORS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                     ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv}


# ---- the reference answers -----------------------------------------------------------------------

@dataclasses.dataclass
class Exercise:
    key: str           # notebook number
    name: str          # the answer cell's grade_id: the name it defines
    source: str        # the answer cell
    spans: list        # (first, last) line numbers of its solution regions
    prelude: str       # the notebook's imports and its other reference answers, which the answer may use

    @property
    def label(self) -> str:
        return f"{self.key}/{self.name}"


def exercises() -> list[Exercise]:
    import nbformat

    from autograder.contract import is_answer_cell, is_test_cell, nbgrader_meta
    from autograder.course import NOTEBOOKS
    found = []
    for notebook in NOTEBOOKS:
        cells = nbformat.read(str(notebook.source()), as_version=4).cells
        imports, answers = [], []
        for cell in cells:
            if cell.cell_type != "code" or is_test_cell(cell):
                continue
            if is_answer_cell(cell):
                answers.append((nbgrader_meta(cell)["grade_id"], cell.source))
                continue
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:          # a cell of IPython magics
                continue
            imports += [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        for name, source in answers:
            lines = source.splitlines()
            begins = [i for i, line in enumerate(lines, 1) if BEGIN in line]
            ends = [i for i, line in enumerate(lines, 1) if END in line]
            others = "\n\n".join(s for n, s in answers if n != name)
            found.append(Exercise(notebook.number, name, source, list(zip(begins, ends)),
                                  "\n".join(dict.fromkeys(imports)) + "\n\n" + others))
    return found


# ---- the mutants ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Mutant:
    exercise: Exercise
    operator: str
    source: str        # the whole mutated answer cell

    @property
    def key(self) -> str:
        digest = hashlib.sha256(self.source.encode()).hexdigest()[:12]
        return f"{self.exercise.label}:{self.operator}:{digest}"

    def diff(self) -> str:
        """What changed, in one line: a replaced line as ``...context [old -> new] context...``, else the
        reference's lines taken out (-) and the mutant's put in (+)."""
        before = ast.unparse(ast.parse(self.exercise.source)).splitlines()
        taken = [line.strip() for line in before if line not in self.source.splitlines()]
        put = [line.strip() for line in self.source.splitlines() if line not in before]
        if len(taken) == len(put) == 1:
            old, new = taken[0], put[0]
            head = len(os.path.commonprefix([old, new]))
            tail = len(os.path.commonprefix([old[head:][::-1], new[head:][::-1]]))
            return (f"{old[max(0, head - 40):head]}[{old[head:len(old) - tail]} -> {new[head:len(new) - tail]}]"
                    f"{old[len(old) - tail:][:40]}")
        if not taken and not put:           # the same lines in another order
            moved = [line.strip() for line in difflib.ndiff(before, self.source.splitlines()) if line[:1] == "+"]
            return "moved: " + " / ".join(moved)[:200]
        return " / ".join([*("- " + t for t in taken), *("+ " + p for p in put)])[:240]


def _inside(node, spans) -> bool:
    line = getattr(node, "lineno", None)
    return line is not None and any(first < line < last for first, last in spans)


def _sites(tree, spans):
    """(operator, path to a node, how to change it) for every mutation the solution regions allow; applied
    to a fresh copy of the tree each time."""
    sites = []
    for node in ast.walk(tree):
        if not _inside(node, spans):
            pass
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in SWAPPED_COMPARISONS:
                    sites.append(("comparison", node, ("op", i)))
        elif isinstance(node, ast.BinOp) and type(node.op) in SWAPPED_OPERATORS:
            sites.append(("arithmetic", node, ("binop",)))
        elif isinstance(node, ast.BoolOp):
            sites.append(("and_or", node, ("boolop",)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            sites.append(("unary_dropped", node, ("unary",)))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites += [("constant_plus_one", node, ("const", 1)), ("constant_minus_one", node, ("const", -1))]
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            sites.append(("boolean_flipped", node, ("bool",)))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "deepcopy":
                sites.append(("deepcopy_to_copy", node, ("shallow",)))
            if isinstance(func, ast.Attribute) and name in UNWRAP_METHODS and not node.args and not node.keywords:
                sites.append(("call_removed", node, ("unwrap_method",)))
            elif name in UNWRAP_FUNCTIONS and len(node.args) == 1 and not node.keywords:
                sites.append(("call_removed", node, ("unwrap_function",)))
            if len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
                sites.append(("arguments_swapped", node, ("swap_args",)))
            for i, keyword in enumerate(node.keywords):
                if keyword.arg is not None:
                    sites.append(("keyword_dropped", node, ("drop_keyword", i)))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            for bound in ("lower", "upper"):
                if getattr(node.slice, bound) is not None:
                    sites.append(("slice_bound_dropped", node, ("slice", bound)))
        if hasattr(node, "body") and isinstance(node.body, list):
            for field in ("body", "orelse", "finalbody"):
                body = getattr(node, field, None) or []
                inside = [i for i, s in enumerate(body) if _inside(s, spans) and not isinstance(s, ast.Pass)]
                for i in inside:
                    if not (isinstance(body[i], ast.Expr) and isinstance(body[i].value, ast.Constant)):
                        sites.append(("statement_dropped", node, ("drop", field, i)))
                for i, j in zip(inside, inside[1:]):
                    if j == i + 1:
                        sites.append(("statements_swapped", node, ("swap", field, i)))
                for i in inside:
                    sites += _in_place_sites(node, field, body, i)
        if isinstance(node, ast.FunctionDef):
            positional = node.args.args[len(node.args.args) - len(node.args.defaults):]
            for arg, default in zip(positional, node.args.defaults):
                if isinstance(default, ast.Constant) and any(
                        isinstance(n, ast.Name) and n.id == arg.arg and _inside(n, spans) for n in ast.walk(node)):
                    sites.append(("hyperparameter_hard_coded", node, ("hard_code", arg.arg, default.value)))
            for i, s in enumerate(node.body):
                if (_inside(s, spans) and isinstance(s, ast.Assign) and len(s.targets) == 1
                        and isinstance(s.targets[0], ast.Name) and isinstance(s.value, (ast.List, ast.Dict))
                        and not getattr(s.value, "elts", getattr(s.value, "keys", None))):
                    sites.append(("mutable_default", node, ("default", i)))
    return sites


def _in_place_sites(parent, field, body, i):
    """``x = x - y`` -> ``x -= y``; ``return x - y`` -> ``x -= y; return x``: in place for out of place."""
    s = body[i]
    value = s.value if isinstance(s, (ast.Assign, ast.Return)) else None
    if (isinstance(value, ast.BinOp) and isinstance(value.left, (ast.Name, ast.Subscript))
            and (isinstance(s, ast.Return) or ast.dump(s.targets[0]) == ast.dump(value.left))):
        return [("in_place", parent, ("in_place", field, i))]
    return []


def _apply(node, how):
    kind = how[0]
    if kind == "op":
        node.ops[how[1]] = SWAPPED_COMPARISONS[type(node.ops[how[1]])]()
    elif kind == "binop":
        node.op = SWAPPED_OPERATORS[type(node.op)]()
    elif kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "unary":
        return node.operand
    elif kind == "const":
        node.value += how[1]
    elif kind == "bool":
        node.value = not node.value
    elif kind == "shallow":
        if isinstance(node.func, ast.Attribute):
            node.func.attr = "copy"
        else:
            node.func = ast.Attribute(ast.Name("copy", ast.Load()), "copy", ast.Load())
    elif kind == "unwrap_method":
        return node.func.value
    elif kind == "unwrap_function":
        return node.args[0]
    elif kind == "swap_args":
        node.args[0], node.args[1] = node.args[1], node.args[0]
    elif kind == "drop_keyword":
        del node.keywords[how[1]]
    elif kind == "slice":
        setattr(node.slice, how[1], None)
    elif kind == "drop":
        getattr(node, how[1])[how[2]] = ast.Pass()
    elif kind == "swap":
        body = getattr(node, how[1])
        body[how[2]], body[how[2] + 1] = body[how[2] + 1], body[how[2]]
    elif kind == "in_place":
        body = getattr(node, how[1])
        s = body[how[2]]
        target = copy.deepcopy(s.value.left)
        target.ctx = ast.Store()
        augmented = ast.AugAssign(target, s.value.op, s.value.right)
        body[how[2]:how[2] + 1] = ([augmented, ast.Return(s.value.left)] if isinstance(s, ast.Return)
                                   else [augmented])
    elif kind == "hard_code":         # the default's value written where the argument is used
        for parent in ast.walk(node):
            for field, value in ast.iter_fields(parent):
                for i, item in enumerate(value if isinstance(value, list) else [value]):
                    if isinstance(item, ast.Name) and item.id == how[1] and isinstance(item.ctx, ast.Load):
                        constant = ast.Constant(how[2])
                        if isinstance(value, list):
                            value[i] = constant
                        else:
                            setattr(parent, field, constant)
    elif kind == "default":
        s = node.body[how[1]]
        name = s.targets[0].id
        node.args.args.append(ast.arg(f"_{name}_kept"))
        node.args.defaults.append(s.value)
        s.value = ast.Name(f"_{name}_kept", ast.Load())
    return node


def mutants(exercise: Exercise) -> list[Mutant]:
    tree = ast.parse(exercise.source)
    original = ast.unparse(tree)
    made, seen = [], {original}
    for index, (operator, _, how) in enumerate(_sites(tree, exercise.spans)):
        fresh = ast.parse(exercise.source)
        node = _sites(fresh, exercise.spans)[index][1]
        replacement = _apply(node, how)
        if replacement is not node:
            _replace(fresh, node, replacement)
        ast.fix_missing_locations(fresh)
        try:
            source = ast.unparse(fresh)
            compile(source, exercise.name, "exec")
        except (SyntaxError, ValueError, TypeError):
            continue
        if source not in seen:        # two operators can make one program: count it once
            seen.add(source)
            made.append(Mutant(exercise, operator, source))
    return made


def _replace(tree, old, new):
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return


def capped(made: list[Mutant], cap: int | None) -> list[Mutant]:
    """At most ``cap`` mutants, drawn reproducibly and spread over the operators (round robin)."""
    if cap is None or len(made) <= cap:
        return made
    by_operator: dict[str, list[Mutant]] = {}
    for m in made:
        by_operator.setdefault(m.operator, []).append(m)
    rng = random.Random(made[0].exercise.label)
    for group in by_operator.values():
        rng.shuffle(group)
    chosen = []
    while len(chosen) < cap:
        for group in by_operator.values():
            if group and len(chosen) < cap:
                chosen.append(group.pop())
    return chosen


# ---- running the checks --------------------------------------------------------------------------

def define(exercise: Exercise, source: str) -> dict:
    """The notebook's answers (its reference ones, and ``source`` for this exercise), each defined in one
    namespace built as the notebook builds it: a later answer that calls this one calls the mutant."""
    namespace = {"__name__": "__main__"}
    exec(compile(exercise.prelude, f"<{exercise.key} prelude>", "exec"), namespace)
    exec(compile(source, f"<{exercise.label}>", "exec"), namespace)
    return namespace


def verdict(exercise: Exercise, source: str) -> tuple[str, str]:
    """("killed", by which call and its message) or ("survived", ""), over every check call of the notebook
    (visible and hidden) that takes this exercise's answer."""
    import notebook_checks as nc
    namespace, module = define(exercise, source), nc.checks_module(exercise.key)
    for call in nc.check_calls(exercise.key):
        if exercise.name not in call.learner_names:
            continue
        try:
            message = nc.run_call(call, getattr(module, call.check), namespace)
        except Exception as exc:        # an error in a test cell: zero for it
            message = f"{type(exc).__name__}: {exc}"
        if message is not None:
            return "killed", f"{call.grade_id}{' (hidden)' if call.hidden else ''}: {message.splitlines()[0][:200]}"
    return "survived", ""


def _child(exercise, source, result_path):
    os.setpgid(0, 0)                    # the mutant's own process group: a timeout ends all of it
    try:
        result = verdict(exercise, source)
    except BaseException as exc:        # the mutant does not even define its name
        result = ("killed", f"{type(exc).__name__}: {str(exc)[:200]}")
    Path(result_path).write_bytes(pickle.dumps(result))
    os._exit(0)


def run_all(work: list[Mutant], jobs: int, timeout: float, progress) -> dict:
    """key -> (outcome, detail), each mutant in a forked child of this (already warm) process. The verdict
    comes back in a file, read when the child has exited (a pipe would stay open in the processes a check
    starts, so its end says nothing)."""
    results, pending, running = {}, list(work), {}
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        while pending or running:
            while pending and len(running) < jobs:
                mutant = pending.pop(0)
                result_path = os.path.join(scratch, f"{len(pending)}.pickle")
                pid = os.fork()
                if pid == 0:
                    _child(mutant.exercise, mutant.source, result_path)
                running[pid] = (mutant, time.monotonic(), result_path)
            time.sleep(0.05)
            for pid, (mutant, started, result_path) in list(running.items()):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if not done and time.monotonic() - started <= timeout:
                    continue
                _kill_group(pid)
                if not done:
                    os.waitpid(pid, 0)
                del running[pid]
                if os.path.exists(result_path):
                    results[mutant.key] = pickle.loads(Path(result_path).read_bytes())
                else:
                    results[mutant.key] = ("killed", "the process died" if done else f"timed out after {timeout:.0f} s")
                progress(mutant, results[mutant.key])
    return results


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ---- the report ----------------------------------------------------------------------------------

def equivalents() -> dict[str, str]:
    if not EQUIVALENTS.exists():
        return {}
    return {key: entry["reason"] for key, entry in tomllib.loads(EQUIVALENTS.read_text()).items()}


def summarise(chosen: dict, results: dict, known: dict, totals: dict, args) -> str:
    rows, survivors = [], []
    for label, group in chosen.items():
        killed = sum(results[m.key][0] == "killed" for m in group)
        equivalent = [m for m in group if results[m.key][0] == "survived" and m.key in known]
        alive = [m for m in group if results[m.key][0] == "survived" and m.key not in known]
        scored = len(group) - len(equivalent)
        score = f"{100 * killed / scored:.0f}%" if scored else "-"
        rows.append(f"| {label} | {len(group)} of {totals[label]} | {killed} | {len(alive)} | {len(equivalent)} | {score} |")
        survivors += [f"- `{m.key}` `{m.diff()}`" for m in alive]
        survivors += [f"- equivalent `{m.key}`: {known[m.key]}" for m in equivalent]
        # A timeout counts as a kill (a test cell that runs out of time scores zero), but on a loaded machine it
        # may hide a survivor: shown, to be rerun with a longer --timeout.
        survivors += [f"- killed by the timeout `{m.key}`: `{m.diff()}`" for m in group
                      if results[m.key][1].startswith("timed out")]
    return "\n".join([
        f"Mutants per exercise capped at {args.cap} (drawn round robin over the operators, reproducibly); "
        f"{args.timeout:.0f} s per mutant; made {time.strftime('%Y-%m-%d')} by `tools/mutate.py`.", "",
        "| exercise | mutants run | killed | survived | equivalent | score |", "|---|---|---|---|---|---|",
        *rows, "", "Survivors (a wrong answer the checks miss, or equivalent with its reason):", "",
        *(survivors or ["- none"])]) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="NN or NN/exercise (e.g. 06 10/judge_deviation)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per mutant")
    parser.add_argument("--cap", type=int, default=None, help="at most this many mutants per exercise")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument("--report", type=Path, default=None, help=f"write the table here (e.g. {REPORT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    chosen, totals = {}, {}
    for exercise in exercises():
        if args.only and not any(exercise.label == s or exercise.key == s for s in args.only):
            continue
        made = mutants(exercise)
        totals[exercise.label] = len(made)
        chosen[exercise.label] = capped(made, args.cap)
    if args.list:
        for group in chosen.values():
            for m in group:
                print(f"{m.key}  {m.diff()}")
        return 0

    import torch  # noqa: F401  -- imported once here, so each forked child starts warm
    for label in chosen:                  # the reference itself must pass, else the notebook's namespace is wrong
        exercise = chosen[label][0].exercise if chosen[label] else None
        if exercise:
            outcome, detail = verdict(exercise, exercise.source)
            if outcome != "survived":
                sys.exit(f"{label}: the reference answer fails its own checks here: {detail}")
    known = equivalents()

    def progress(mutant, result):      # a dot per killed mutant; a survivor on a line of its own, at once
        if result[0] == "killed" or mutant.key in known:
            print("." if result[0] == "killed" else "e", end="", flush=True)
        else:
            print(f"\nsurvived {mutant.key}  {mutant.diff()}", flush=True)

    work = [m for group in chosen.values() for m in group]
    started = time.monotonic()
    results = run_all(work, args.jobs, args.timeout, progress)
    print(f"\n{len(work)} mutants in {time.monotonic() - started:.0f} s\n")
    table = summarise(chosen, results, known, totals, args)
    print(table)
    if args.report:
        args.report.write_text(table)
    alive = [k for k, (outcome, _) in results.items() if outcome == "survived" and k not in known]
    return 1 if alive else 0


if __name__ == "__main__":
    sys.exit(main())
