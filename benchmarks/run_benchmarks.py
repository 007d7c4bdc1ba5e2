#!/usr/bin/env python3
"""The workbook's benchmark suite: is it fast enough for a classroom? (not part of the test run)

    .venv/bin/python benchmarks/run_benchmarks.py                       # everything, defaults below
    .venv/bin/python benchmarks/run_benchmarks.py --sections notebooks selfcheck --repeats 5
    .venv/bin/python benchmarks/run_benchmarks.py --sections grading --students 12 --jobs 1 2 4
    .venv/bin/python benchmarks/run_benchmarks.py --only 01 05          # some notebooks only

Sections (each prints a table; all results go to artifacts/benchmarks/benchmarks.json):
  notebooks  each solution notebook top to bottom in a fresh kernel, each run right after a floor
             of its own: a fresh kernel running one cell that imports torch and matplotlib and takes
             torch.optim's first step (which imports torch._dynamo), what a notebook that trains
             cannot avoid. Pairs are interleaved (floor, notebook, floor, notebook, ...) so the load of
             the moment hits both halves of a pair. Reported: the ratio of the medians, the spread
             of the pairs' ratios (min..max; the interquartile range from 5 repeats on) and the load.
             Target: the notebook's time_target in the registry (autograder/course.py: 1.5x; 2.5x for
             the notebooks that run multi-rank jobs); the verdict is "too noisy to call" where the
             spread holds the target.
  selfcheck  `workbook-check` (the learner's self-check command) on each solution notebook, paired
             with a floor of its own the same way, against the same target.
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


def spread(ratios: list[float]) -> tuple[float, float]:
    """How far the pairs' ratios range: min..max, or the interquartile range from 5 pairs on."""
    if len(ratios) < 5:
        return min(ratios), max(ratios)
    quartiles = statistics.quantiles(ratios, n=4)
    return quartiles[0], quartiles[2]


def verdict(low: float, high: float, target: float) -> str:
    """Within or over the target only where the whole spread is on one side of it."""
    if high <= target:
        return "ok"
    if low > target:
        return "SLOWER than target"
    return "too noisy to call"


def bench_notebooks(paths: list[Path], repeats: int, selfcheck: bool, notebooks: bool) -> dict:
    """Each measurement right after a floor of its own (floor, notebook, floor, self-check, floor, next
    notebook, ...), so the machine's load of the moment hits both halves of each pair."""
    floor, runs, checks, errors = [], {p.stem: [] for p in paths}, {p.stem: [] for p in paths}, {}
    loaded = {p.stem: nbformat.read(p, as_version=4) for p in paths}
    started_load = load()

    def pair(what: str, path: Path, measure) -> dict | None:
        with tempfile.TemporaryDirectory() as tmp:
            floor_s = run_in_fresh_kernel(floor_notebook(OPTIMIZER_FLOOR_SOURCE), Path(tmp))
        try:
            seconds = measure()
        except Exception as exc:  # a notebook that fails is reported, not timed
            last_line = ANSI.sub("", str(exc)).strip().splitlines()[-1]
            errors[path.stem] = f"{type(exc).__name__}: {last_line[:160]}"
            return None
        return {"floor_s": floor_s, f"{what}_s": seconds, "ratio": seconds / floor_s, "load": load()[0]}

    def notebook_seconds(path: Path) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            return run_in_fresh_kernel(loaded[path.stem], Path(tmp))

    def check_seconds(path: Path) -> float:
        seconds, passed = self_check_seconds(path)
        if not passed:
            errors.setdefault(path.stem, "workbook-check did not give full marks")
        return seconds

    for repeat in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:    # torch + matplotlib alone: the 'ratio' column, once a round
            floor.append(run_in_fresh_kernel(floor_notebook(), Path(tmp)))
        say(f"  repeat {repeat + 1}/{repeats}: floor without an optimizer step {floor[-1]:.1f} s (load {load()[0]})")
        for path in paths:
            measured = []
            for what, values, measure, wanted in (("notebook", runs, notebook_seconds, notebooks),
                                                  ("selfcheck", checks, check_seconds, selfcheck)):
                if wanted and path.stem not in errors:
                    done = pair(what, path, lambda: measure(path))
                    if done:
                        values[path.stem].append(done)
                        measured.append(f"{what} {done[what + '_s']:.1f} s after a floor of {done['floor_s']:.1f} s "
                                        f"({done['ratio']:.2f}x, load {done['load']})")
            say(f"    {path.stem}: " + ("; ".join(measured) or errors.get(path.stem, "")))
    rows = []
    for path in paths:
        row = {"notebook": path.stem, "target_ratio": notebook_target(path), "error": errors.get(path.stem)}
        for what, values in (("notebook", runs), ("selfcheck", checks)):
            pairs = values[path.stem]
            if pairs:
                median, floor_median = (statistics.median(p[key] for p in pairs) for key in (f"{what}_s", "floor_s"))
                low, high = spread([p["ratio"] for p in pairs])
                row.setdefault("measured", {})[what] = {
                    "pairs": pairs, "median_s": median, "floor_median_s": floor_median,
                    "ratio_of_medians": median / floor_median, "spread": [low, high],
                    "ratio_to_floor_without_optimizer": median / statistics.median(floor),
                    "load": [min(p["load"] for p in pairs), max(p["load"] for p in pairs)],
                    "verdict": verdict(low, high, row["target_ratio"])}
        rows.append(row)
    return {"floor_seconds": floor, "floor_median_s": statistics.median(floor), "repeats": repeats,
            "optimizer_floor": OPTIMIZER_FLOOR_SOURCE, "load_before": started_load, "load_after": load(), "rows": rows}


def print_notebooks(result: dict) -> None:
    say(f"\nNotebooks and the self-check, each against a floor run just before it (a fresh kernel importing torch "
        f"and matplotlib and taking torch.optim's first step); {result['repeats']} pairs each; load "
        f"{result['load_before'][0]} -> {result['load_after'][0]} on {os.cpu_count()} CPUs. 'ratio': median run / "
        f"median floor; 'spread': the pairs' ratios ({'min..max' if result['repeats'] < 5 else 'interquartile'}); "
        f"'no optim': against the floor without the optimizer step (median {result['floor_median_s']:.2f} s).")
    say(f"{'notebook':<28} {'what':<9} {'run s':>6} {'floor s':>7} {'ratio':>6} {'spread':>11} {'no optim':>8} "
        f"{'target':>6} {'load':>9}  verdict")
    for r in result["rows"]:
        measured = r.get("measured", {})
        if not measured:
            say(f"{r['notebook']:<28} {r['error'] or 'not measured'}")
        for what, m in measured.items():
            low, high = m["spread"]
            say(f"{r['notebook']:<28} {what:<9} {m['median_s']:>6.2f} {m['floor_median_s']:>7.2f} "
                f"{m['ratio_of_medians']:>5.2f}x {low:>5.2f}..{high:<5.2f} "
                f"{m['ratio_to_floor_without_optimizer']:>7.2f}x "
                f"{r['target_ratio']:>5}x {m['load'][0]:>4.1f}-{m['load'][1]:<4.1f}  {r['error'] or m['verdict']}")
    say("verdict: ok where every pair's ratio (the spread) is within the target, SLOWER where every one is over "
        "it; too noisy to call where the spread holds the target: run again on a quieter machine or with more "
        "--repeats")


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
