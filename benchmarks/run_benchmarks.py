#!/usr/bin/env python3
"""The workbook's benchmark suite: is it fast enough for a classroom? (not part of the test run)

    .venv/bin/python benchmarks/run_benchmarks.py                       # everything, defaults below
    .venv/bin/python benchmarks/run_benchmarks.py --sections notebooks selfcheck --repeats 5
    .venv/bin/python benchmarks/run_benchmarks.py --sections grading --students 12 --jobs 1 2 4
    .venv/bin/python benchmarks/run_benchmarks.py --only 01 05          # some notebooks only

Sections (each prints a table; all results go to artifacts/benchmarks/benchmarks.json):
  notebooks  each solution notebook top to bottom in a fresh kernel, next to the floor: a fresh
             kernel running one cell that imports torch and matplotlib. Runs are interleaved
             (floor, notebook 1, notebook 2, ..., floor, ...) so a change in the machine's load
             hits both; medians. The "optim" column divides by a second floor that also takes one
             torch.optim step (which imports torch._dynamo): what a notebook costs beyond torch's own
             start-up. Target: the optim column within the notebook's time_target in the registry
             (autograder/course.py: 1.5x; 2.5x for the notebooks that run multi-rank jobs).
  selfcheck  `workbook-check` (the learner's self-check command) on each solution notebook,
             as a ratio to the same floors and against the same target; medians.
  grading    a class of synthetic submissions of every graded notebook (correct, partly answered,
             untouched, in turn), graded by nbgrader's own serial `nbgrader autograde` and by
             `workbook-grade --jobs N`; the speed-up, and whether both gave the same scores.
             Target: >= 1.7x on 2 cores.
  ledger     notebook 06's audit: benchmarks/ledger_audit.py (its own table and JSON) plus how the
             span audit and a naive per-sample set audit grow from 10^5 to 10^9 positions.
             Target: 10^9 positions under 1 s.
  atomic     notebook 05's atomic_save (taken from the solution notebook's answer cell) against
             plain torch.save, for 1 MB, 100 MB and 1 GB states; medians. Target: <= 1.3x at 100 MB.

Every table states the load average: numbers from a busy machine are slower, not wrong,
and ratios against a floor measured in the same run cancel much of the noise.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import nbformat  # noqa: E402

from autograder.contract import KERNEL_EXTRA_ARGUMENTS, nbgrader_meta  # noqa: E402
from autograder.course import NOTEBOOKS  # noqa: E402
from workbook import tool_env  # noqa: E402  (the same environment as the README's commands)

OUT = ROOT / "artifacts" / "benchmarks" / "benchmarks.json"
BIN = Path(sys.executable).parent
FLOOR_SOURCE = "import torch\nimport matplotlib.pyplot as plt"
# The floor plus torch.optim's first step, which imports torch._dynamo (1-2 s; torch.optim's own
# decorators import it, so no notebook that trains can avoid it): what is left above this is ours.
OPTIMIZER_FLOOR_SOURCE = FLOOR_SOURCE + "\ntorch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1).step()"
GRADING_TARGET, LEDGER_TARGET_S, ATOMIC_TARGET = 1.7, 1.0, 1.3
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def say(message: str) -> None:
    print(message, flush=True)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def solution_notebooks(only: list[str]) -> list[Path]:
    found = sorted((ROOT / "solutions").glob("*/*.ipynb"))
    return [p for p in found if not only or any(p.stem.startswith(o) for o in only)]


def notebook_target(path: Path) -> float:
    return next(n.time_target for n in NOTEBOOKS if n.folder == path.stem)


# ---- notebooks and the self-check, against the floor ---------------------------------------------

def run_in_fresh_kernel(nb, workdir: Path) -> float:
    """Seconds from starting a kernel to its shutdown after the last cell, with the grader's flags."""
    from nbclient import NotebookClient

    client = NotebookClient(copy.deepcopy(nb), timeout=600, kernel_name="python3",
                            extra_arguments=KERNEL_EXTRA_ARGUMENTS, resources={"metadata": {"path": str(workdir)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def floor_notebook(source: str = FLOOR_SOURCE):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def self_check_seconds(path: Path) -> tuple[float, bool]:
    start = time.perf_counter()
    run = subprocess.run([str(BIN / "workbook-check"), str(path), "--json"], cwd=ROOT, env=tool_env(),
                         capture_output=True, text=True)
    return time.perf_counter() - start, run.returncode == 0


def bench_notebooks(paths: list[Path], repeats: int, selfcheck: bool, notebooks: bool) -> dict:
    floor, optimizer_floor, runs, checks, errors = [], [], {p.stem: [] for p in paths}, {p.stem: [] for p in paths}, {}
    loaded = {p.stem: nbformat.read(p, as_version=4) for p in paths}
    started_load = load()
    for repeat in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            floor.append(run_in_fresh_kernel(floor_notebook(), Path(tmp)))
            optimizer_floor.append(run_in_fresh_kernel(floor_notebook(OPTIMIZER_FLOOR_SOURCE), Path(tmp)))
        say(f"  repeat {repeat + 1}/{repeats}: floor {floor[-1]:.1f} s, with an optimizer step "
            f"{optimizer_floor[-1]:.1f} s (load {load()[0]})")
        for path in paths:
            if notebooks and path.stem not in errors:
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        runs[path.stem].append(run_in_fresh_kernel(loaded[path.stem], Path(tmp)))
                    except Exception as exc:  # a notebook that fails is reported, not timed
                        last_line = ANSI.sub("", str(exc)).strip().splitlines()[-1]
                        errors[path.stem] = f"{type(exc).__name__}: {last_line[:160]}"
            if selfcheck:
                seconds, passed = self_check_seconds(path)
                checks[path.stem].append(seconds)
                if not passed:
                    errors.setdefault(path.stem, "workbook-check did not give full marks")
            say(f"    {path.stem}: " + ", ".join(
                f"{what} {values[path.stem][-1]:.1f} s" for what, values in (("notebook", runs), ("self-check", checks))
                if values[path.stem]))
    floor_median = statistics.median(floor)
    rows = []
    for path in paths:
        row = {"notebook": path.stem, "target_ratio": notebook_target(path), "error": errors.get(path.stem)}
        for what, values in (("notebook", runs), ("selfcheck", checks)):
            if values[path.stem]:
                median = statistics.median(values[path.stem])
                row[f"{what}_seconds"] = values[path.stem]
                row[f"{what}_median_s"] = median
                row[f"{what}_ratio"] = median / floor_median
        for what, values in (("notebook", runs), ("selfcheck", checks)):
            if values[path.stem]:
                row[f"{what}_ratio_to_optimizer_floor"] = (statistics.median(values[path.stem])
                                                           / statistics.median(optimizer_floor))
        rows.append(row)
    return {"floor_seconds": floor, "floor_median_s": floor_median, "repeats": repeats,
            "optimizer_floor_seconds": optimizer_floor, "optimizer_floor_median_s": statistics.median(optimizer_floor),
            "load_before": started_load, "load_after": load(), "rows": rows}


def print_notebooks(result: dict) -> None:
    say(f"\nNotebooks vs the floor (fresh kernel importing torch + matplotlib: median "
        f"{result['floor_median_s']:.2f} s over {result['repeats']}; load {result['load_before'][0]} -> "
        f"{result['load_after'][0]} on {os.cpu_count()} CPUs; with torch.optim's first step: median "
        f"{result['optimizer_floor_median_s']:.2f} s, the 'optim' column)")
    say(f"{'notebook':<28} {'run s':>7} {'ratio':>6} {'optim':>6} {'check s':>8} {'ratio':>6} {'optim':>6} "
        f"{'target':>7}  verdict (the optim columns against the target)")
    for r in result["rows"]:
        judged = [r.get("notebook_ratio_to_optimizer_floor"), r.get("selfcheck_ratio_to_optimizer_floor")]
        slower = [what for what, ratio in zip(("run", "self-check"), judged) if ratio and ratio > r["target_ratio"]]
        verdict = r["error"] or ("not measured" if not any(judged) else
                                 f"{' and '.join(slower)} SLOWER than target" if slower else "ok")
        numbers = [r.get(key) for key in ("notebook_median_s", "notebook_ratio", "notebook_ratio_to_optimizer_floor",
                                          "selfcheck_median_s", "selfcheck_ratio", "selfcheck_ratio_to_optimizer_floor")]
        cells = [f"{value if value is not None else float('nan'):>{width}.2f}"
                 for value, width in zip(numbers, (7, 6, 6, 8, 6, 6))]
        say(f"{r['notebook']:<28} {' '.join(cells)} {r['target_ratio']:>6}x  {verdict}")


# ---- grading a class -------------------------------------------------------------------------------

def build_class(folder: Path, paths: list[Path], students: int) -> tuple[Path, list[str]]:
    """A course with every graded notebook generated, and ``students`` submissions of each."""
    from notebook_files import fill_answers, graded_notebooks, new_course, solution_answers, submit

    graded = graded_notebooks(paths)
    course = new_course(folder, {p.stem: p for p in graded})
    kinds = ("correct", "partly", "untouched")
    for p in graded:
        released = course / "notebooks" / p.stem / p.name
        answers = solution_answers(p)
        first = dict(list(answers.items())[:1])
        for i in range(students):
            kind = kinds[i % len(kinds)]
            chosen = {"correct": answers, "partly": first, "untouched": {}}[kind]
            submit(course, f"s{i:03d}_{kind}", p.stem, fill_answers(released, chosen))
    return course, [p.stem for p in graded]


def total_scores(course: Path) -> dict:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        return {f"{s.assignment.name}/{s.student.id}": s.score
                for a in gb.assignments for s in gb.assignment_submissions(a.name)}


@contextlib.contextmanager
def dask_cluster(kind: str, workers: int):
    """The address of a Dask cluster of ``workers`` grading workers on this machine: an in-process
    LocalCluster, or a `dask scheduler` with `workbook-worker` processes as the README starts them."""
    if kind == "local":
        from distributed import LocalCluster

        from autograder.grading.cluster import course_resource
        with LocalCluster(n_workers=workers, threads_per_worker=1, resources={course_resource(): 1},
                          preload=["autograder.commands.worker"], dashboard_address=None) as cluster:
            yield cluster.scheduler_address
        return
    with tempfile.TemporaryDirectory(prefix="bench-dask-") as tmp:
        file = Path(tmp) / "scheduler.json"
        started = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                                     "--no-dashboard", "--scheduler-file", str(file)], env=tool_env(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        try:
            while not (file.exists() and file.stat().st_size):
                time.sleep(0.1)
            address = json.loads(file.read_text())["address"]
            started.append(subprocess.Popen([str(BIN / "workbook-worker"), address, "--nworkers", str(workers)],
                                            env=tool_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            from distributed import Client
            with Client(address, timeout=30) as client:
                client.wait_for_workers(workers, timeout=120)
            yield address
        finally:
            for process in reversed(started):
                process.terminate()
                process.wait()


def bench_grading(paths: list[Path], students: int, jobs: list[int], repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-class-") as tmp:
        blank, assignments = build_class(Path(tmp) / "blank", paths, students)
        say(f"  a class of {students} students x {len(assignments)} graded notebooks")
        modes = ([("nbgrader autograde (serial)", None)] + [(f"workbook-grade --jobs {j}", j) for j in jobs]
                 + [(f"{name} ({2} workers)", kind) for name, kind in (("Dask LocalCluster", "local"),
                                                                          ("dask scheduler + workbook-worker", "cli"))])
        rows, reference = [], None
        for name, workers in modes:
            seconds = []
            for repeat in range(repeats):
                course = Path(shutil.copytree(blank, Path(tmp) / f"run-{workers}-{repeat}"))
                before = load()
                start = time.perf_counter()
                if isinstance(workers, str):       # a Dask cluster of 2 workers, started outside the timing
                    with dask_cluster(workers, 2) as address:
                        start = time.perf_counter()
                        subprocess.run([sys.executable, "-m", "autograder.commands.grade", *assignments, "--course",
                                        str(course), "--scheduler", address, "--no-summary"],
                                       cwd=ROOT, env=tool_env(), capture_output=True, text=True)
                        seconds.append(time.perf_counter() - start)
                elif workers is None:
                    for assignment in assignments:
                        run = subprocess.run([str(BIN / "nbgrader"), "autograde", assignment, "--create"],
                                             cwd=course, env=tool_env(), capture_output=True, text=True)
                        if run.returncode:
                            say(f"    nbgrader autograde {assignment} failed: {run.stderr[-500:]}")
                else:
                    subprocess.run([sys.executable, "-m", "autograder.commands.grade", *assignments, "--course",
                                    str(course), "--jobs", str(workers), "--no-summary"],
                                   cwd=ROOT, env=tool_env(), capture_output=True, text=True)
                if not isinstance(workers, str):
                    seconds.append(time.perf_counter() - start)
                scores = total_scores(course)
                reference = reference if reference is not None else scores
                say(f"    {name}: {seconds[-1]:.1f} s (load {before[0]} -> {load()[0]})")
                shutil.rmtree(course, ignore_errors=True)
            rows.append({"mode": name, "jobs": workers if not isinstance(workers, str) else 2, "seconds": seconds,
                         "median_s": statistics.median(seconds), "same_scores_as_nbgrader": scores == reference,
                         "submissions": len(scores)})
    serial = rows[0]["median_s"]
    cpus = os.cpu_count() or 1
    for row in rows:
        row["speedup"] = serial / row["median_s"]
        row["per_minute_per_core"] = row["submissions"] / (row["median_s"] / 60) / min(row["jobs"] or 1, cpus)
    return {"students": students, "notebooks": assignments, "cpus": os.cpu_count(), "rows": rows}


def print_grading(result: dict) -> None:
    n = result["students"] * len(result["notebooks"])
    say(f"\nGrading a class: {result['students']} students x {len(result['notebooks'])} notebooks = {n} "
        f"submissions on {result['cpus']} CPUs")
    say(f"{'mode':<46} {'seconds':>8} {'speed-up':>9} {'/min/core':>10}  same scores as nbgrader")
    for r in result["rows"]:
        say(f"{r['mode']:<46} {r['median_s']:>8.1f} {r['speedup']:>8.2f}x {r['per_minute_per_core']:>10.1f}  "
            f"{r['same_scores_as_nbgrader']}")
    pool = next((r for r in result["rows"] if r["jobs"] == 2 and "--jobs" in r["mode"]), None)
    for r in result["rows"]:
        if pool and "workers)" in r["mode"]:
            say(f"dispatch overhead of {r['mode']}: {(r['median_s'] - pool['median_s']) / r['submissions']:+.2f} s "
                f"per submission against workbook-grade --jobs 2")
    say(f"target: >= {GRADING_TARGET}x on 2 cores")


# ---- notebook 06: the ledger audit ---------------------------------------------------------------

def bench_ledger(big: bool) -> dict:
    path = ROOT / "benchmarks" / "ledger_audit.py"
    if not path.exists():
        return {"skipped": "benchmarks/ledger_audit.py is not there yet"}
    spec = importlib.util.spec_from_file_location("ledger_audit", path)
    ledger = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ledger)
    say("  benchmarks/ledger_audit.py:")
    ledger.main()  # its own table and artifacts/benchmarks/ledger_audit.json
    growth = []
    sizes = [("span audit (notebook 06)", ledger.audit, [10**6, 10**8, 10**9]),
             ("per-sample set", ledger.audit_per_sample_sets, [10**5, 10**6] + ([10**7] if big else []))]
    for name, function, positions in sizes:
        for n in positions:
            expected, trained = ledger._scale_case(n, 100)
            measured = ledger.measure(function, expected, trained)
            growth.append({"audit": name, "positions": n, "seconds": measured["seconds"]})
    return {"growth": growth, "ledger_audit_json": "artifacts/benchmarks/ledger_audit.json"}


def print_ledger(result: dict) -> None:
    say(f"\nLedger audit growth (100 spans; the per-sample set stops where it no longer fits; load {load()[0]})")
    say(f"{'audit':<26} {'positions':>15} {'seconds':>10}")
    for r in result["growth"]:
        say(f"{r['audit']:<26} {r['positions']:>15,} {r['seconds']:>10.2e}")
    say(f"target: 10^9 positions under {LEDGER_TARGET_S:g} s")


# ---- notebook 05: atomic_save against torch.save ---------------------------------------------------

def solution_atomic_save():
    """The atomic_save of notebook 05's solution, from its answer cell; None while it does not exist."""
    paths = list((ROOT / "solutions").glob("05_*/*.ipynb"))
    if not paths:
        return None
    import tempfile as tempfile_module

    import torch

    for cell in nbformat.read(paths[0], as_version=4).cells:
        if nbgrader_meta(cell).get("grade_id") == "atomic_save" and nbgrader_meta(cell).get("solution"):
            namespace = {"os": os, "tempfile": tempfile_module, "torch": torch}
            exec(compile(cell.source, f"{paths[0].name}:atomic_save", "exec"), namespace)
            return namespace["atomic_save"]
    return None


def bench_atomic(sizes_mb: list[int], repeats: int) -> dict:
    atomic_save = solution_atomic_save()
    if atomic_save is None:
        return {"skipped": "notebook 05 (solutions/05_*/) has no atomic_save answer cell yet"}
    import torch

    def plain(obj, path):
        torch.save(obj, path)

    def plain_fsync(obj, path):
        with open(path, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-atomic-", dir=ROOT / "artifacts") as tmp:
        for mb in sizes_mb:
            state = {"weights": torch.randn(mb * 2**20 // 4)}
            times = {"torch.save": [], "torch.save + fsync": [], "atomic_save": []}
            savers = [("torch.save", plain), ("torch.save + fsync", plain_fsync), ("atomic_save", atomic_save)]
            for repeat in range(repeats):
                # Rotate the order: the first big write of a round also pays for earlier writeback.
                for name, save in savers[repeat % 3:] + savers[:repeat % 3]:
                    target = Path(tmp) / "checkpoint.pt"
                    start = time.perf_counter()
                    save(state, str(target))
                    times[name].append(time.perf_counter() - start)
                    target.unlink()
            medians = {k: statistics.median(v) for k, v in times.items()}
            rows.append({"megabytes": mb, "seconds": times, "median_s": medians,
                         "ratio_vs_torch_save": medians["atomic_save"] / medians["torch.save"],
                         "ratio_vs_torch_save_fsync": medians["atomic_save"] / medians["torch.save + fsync"]})
            say(f"    {mb} MB: " + ", ".join(f"{k} {v:.3f} s" for k, v in medians.items()))
            del state
    return {"repeats": repeats, "rows": rows}


def print_atomic(result: dict) -> None:
    say(f"\natomic_save (notebook 05's solution) vs torch.save, medians of {result['repeats']} (load {load()[0]})")
    say(f"{'size':>8} {'torch.save':>11} {'+ fsync':>9} {'atomic_save':>12} {'ratio':>6} {'vs +fsync':>10}")
    for r in result["rows"]:
        m = r["median_s"]
        say(f"{r['megabytes']:>5} MB {m['torch.save']:>11.3f} {m['torch.save + fsync']:>9.3f} "
            f"{m['atomic_save']:>12.3f} {r['ratio_vs_torch_save']:>5.2f}x {r['ratio_vs_torch_save_fsync']:>9.2f}x")
    say(f"target: <= {ATOMIC_TARGET}x plain torch.save at 100 MB")


# ---- the suite ---------------------------------------------------------------------------------------

SECTIONS = ("notebooks", "selfcheck", "grading", "ledger", "atomic")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--only", nargs="*", default=[], help="notebook name prefixes (default: every notebook)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; medians are reported")
    parser.add_argument("--students", type=int, default=6, help="synthetic students per notebook when grading")
    parser.add_argument("--jobs", type=int, nargs="+", default=sorted({1, 2, os.cpu_count() or 1}),
                        help="worker counts to grade with (default: 1, 2 and one per core)")
    parser.add_argument("--grading-repeats", type=int, default=1, help="runs per grading mode (each is minutes)")
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 100, 1000], help="atomic_save state sizes")
    parser.add_argument("--big", action="store_true", help="also the per-sample set audit at 10^7 positions")
    args = parser.parse_args(argv)

    # What learners and graders get through workbook.py: one BLAS/OpenMP thread per process (the
    # models are tiny; a second thread only adds synchronisation on a busy machine).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    paths = solution_notebooks(args.only)
    results = {"schema": "workbook-benchmarks/1", "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "machine": {"cpus": os.cpu_count(), "load_at_start": load(),
                           "omp_num_threads": os.environ["OMP_NUM_THREADS"], "python": platform.python_version(),
                           "torch": torch.__version__, "platform": platform.platform()}}
    say(f"workbook benchmarks: {len(paths)} notebooks, {os.cpu_count()} CPUs, load average {load()}")
    if {"notebooks", "selfcheck"} & set(args.sections):
        say("\n== notebooks and self-check against the floor ==")
        results["notebooks"] = bench_notebooks(paths, args.repeats, "selfcheck" in args.sections,
                                               "notebooks" in args.sections)
    if "grading" in args.sections:
        say("\n== grading a class ==")
        results["grading"] = bench_grading(paths, args.students, args.jobs, args.grading_repeats)
    if "ledger" in args.sections:
        say("\n== ledger audit ==")
        results["ledger"] = bench_ledger(args.big)
    if "atomic" in args.sections:
        say("\n== atomic_save ==")
        results["atomic"] = bench_atomic(args.sizes_mb, args.repeats)
    results["machine"]["load_at_end"] = load()

    say("\n================ results ================")
    for key, show in (("notebooks", print_notebooks), ("grading", print_grading), ("ledger", print_ledger),
                      ("atomic", print_atomic)):
        if key in results and "skipped" in results[key]:
            say(f"\n{key}: skipped ({results[key]['skipped']})")
        elif key in results:
            show(results[key])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))
    say(f"\nwrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
