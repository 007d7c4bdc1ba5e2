"""Checks for notebook 02: Adam's bias correction lost on a weights-only resume.

The learner writes Adam in NumPy (float64) with the state ``{"m", "v", "t"}``,
then saves and resumes it. The reference for every check is ``torch.optim.Adam``
itself, run in float64 on the same NumPy problem, so this module holds no
NumPy Adam to copy from. Textbook Adam (m-hat / v-hat) and PyTorch's rearranged
form round differently, so single steps are compared within a few ulps; a
resume is compared bitwise against the uninterrupted run, because both go
through the very same arithmetic. The learner's saves run in forked children and
the resumes in a fresh process (``autograder.engine.fresh_process``), so only the file
connects them.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import tempfile

import numpy as np
import torch

from ..engine import fresh_process, travel
from ..checking import expect, graded_check, observe, type_name
from ..grading.sandbox import learner_exception
from ..grading.server import describe_exception

ULPS = 16  # a single Adam step: textbook and PyTorch forms differ by at most a few ulps


# ---- what the notebook provides ------------------------------------------------------------

@dataclasses.dataclass
class RegressionProblem:
    """Least squares ``0.5 * mean((X @ w - y)**2)`` in float64, with its exact gradient."""

    X: np.ndarray
    y: np.ndarray
    w0: np.ndarray

    def loss(self, w: np.ndarray) -> float:
        return float(0.5 * np.mean((self.X @ w - self.y) ** 2))

    def grad(self, w: np.ndarray) -> np.ndarray:
        return self.X.T @ (self.X @ w - self.y) / len(self.y)


def regression_problem(seed: int = 0, n: int = 32, dim: int = 5) -> RegressionProblem:
    """A small, well-conditioned regression: Adam brings the loss down within 100 steps."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim))
    true_w = rng.normal(size=dim)
    y = X @ true_w + 0.1 * rng.normal(size=n)
    return RegressionProblem(X, y, w0=np.zeros(dim))


def new_adam_state(w: np.ndarray) -> dict:
    """Adam before its first step: both moments zero, no step taken yet (t counts completed steps)."""
    return {"m": np.zeros_like(w, dtype=np.float64), "v": np.zeros_like(w, dtype=np.float64), "t": 0}


# ---- the reference: torch.optim.Adam driving NumPy arrays ------------------------------------

HYPER = ("lr", "beta1", "beta2", "eps")


class _TorchReference:
    """torch.optim.Adam in float64 on the regression problem of one seed, from its w0 and a fresh state.

    The reference of every check: it starts nowhere else (no weights, state or gradient function of a
    caller's), and goes on by copying itself (``branch``), so it is no Adam step to wrap.
    """

    def __init__(self, seed: int, hp: dict):
        self.problem = regression_problem(seed)
        self.param = torch.nn.Parameter(torch.tensor(self.problem.w0, dtype=torch.float64))
        self.optimizer = torch.optim.Adam([self.param], **_torch_hyper(hp))

    @property
    def w(self) -> np.ndarray:
        return self.param.detach().numpy().copy()

    @property
    def state(self) -> dict:
        s = self.optimizer.state.get(self.param)
        if not s:
            return new_adam_state(self.w)
        return {"m": s["exp_avg"].numpy().copy(), "v": s["exp_avg_sq"].numpy().copy(), "t": int(s["step"])}

    def branch(self, hp: dict | None = None, fresh: bool = False) -> "_TorchReference":
        """A copy that goes on from here: with other hyperparameters, or a new Adam on these weights."""
        other = copy.deepcopy(self)
        if fresh:
            other.optimizer = torch.optim.Adam([other.param], **_torch_hyper(hp or {}))
        elif hp is not None:
            other.optimizer.param_groups[0].update(_torch_hyper(hp))
        return other

    def advance(self, n: int, gradient: np.ndarray | None = None) -> np.ndarray:
        """n steps on the problem's gradient at the current weights (or on one fixed gradient)."""
        for _ in range(n):
            g = self.problem.grad(self.w) if gradient is None else gradient
            self.param.grad = torch.tensor(np.asarray(g, dtype=np.float64))
            self.optimizer.step()
        return self.w


def _torch_hyper(hp: dict) -> dict:
    return {"lr": hp.get("lr", 1e-3), "betas": (hp.get("beta1", 0.9), hp.get("beta2", 0.999)),
            "eps": hp.get("eps", 1e-8)}


def hyper(**hp) -> dict:
    return {k: v for k, v in hp.items() if k in HYPER}


# ---- small utilities for messages ------------------------------------------------------------

def _as_weights(value, like: np.ndarray, what: str) -> np.ndarray:
    expect(value is not None, f"{what} returned None: it should return the weights as a NumPy array.")
    expect(isinstance(value, np.ndarray),
           f"{what} returned a {type_name(value)}; return the weights as a NumPy array.")
    expect(value.shape == like.shape, f"{what} returned weights of shape {value.shape}, expected {like.shape}.")
    return value


def _as_state(state, like: np.ndarray, what: str) -> dict:
    expect(isinstance(state, dict), f"{what} should be a dict {{'m', 'v', 't'}}, not {type_name(state)}.")
    missing = [k for k in ("m", "v", "t") if k not in state]
    expect(not missing, f"{what} has no {missing} entry (its keys are {sorted(map(str, state))}).")
    for key in ("m", "v"):
        expect(np.shape(state[key]) == like.shape,
               f"{what}[{key!r}] has shape {np.shape(state[key])}, expected {like.shape}.")
    expect(float(state["t"]) == int(float(state["t"])), f"{what}['t'] should count steps, but it is {state['t']!r}.")
    return state


def _problem_and_gradients(seed: int, steps: int, hp: dict):
    """The reference trajectory: weights, gradient and PyTorch's state before each step."""
    reference = _TorchReference(seed, hp)
    trajectory = []
    for _ in range(steps):
        w, state = reference.w, reference.state
        g = reference.problem.grad(w)
        reference.advance(1, g)
        trajectory.append((w, g, state, reference.w))
    return reference.problem, trajectory


# ---- checks ----------------------------------------------------------------------------------

@graded_check("adam_step matches torch.optim.Adam step by step (within a few ulps)")
def check_adam_step(adam_step, seed: int = 0, steps: int = 30, **hp) -> None:
    hp = hyper(**hp)
    lr = hp.get("lr", 1e-3)
    _, trajectory = _problem_and_gradients(seed, steps, hp)
    for k, (w, g, state, expected) in enumerate(trajectory):
        # Each step starts from PyTorch's own state, so this check is about the update rule only.
        got = _as_weights(adam_step(w.copy(), g.copy(), {"m": state["m"].copy(), "v": state["v"].copy(),
                                                         "t": state["t"]}, **hp), w, "adam_step")
        scale = np.maximum(np.abs(w), np.abs(expected))
        if np.all(np.abs(got - expected) <= ULPS * np.spacing(scale)):
            continue
        moved, should = np.abs(got - w), np.abs(expected - w)
        ratio = float(np.median(moved / np.maximum(should, 1e-300)))
        size = (f"your step is {ratio:.3g} times PyTorch's" if abs(ratio - 1) > 0.005 else
                "your step has about the right size, but not the right value")
        evidence = (f"At step t={state['t'] + 1} your weights differ from torch.optim.Adam's by up to "
                    f"{np.max(np.abs(got - expected)):.2e} (allowed: {ULPS} ulps); {size}.")
        if not np.all(np.isfinite(got)):
            raise AssertionError(evidence.split(";")[0] + ": your update is inf or nan. With t counting "
                                 "completed steps, the bias correction of step t uses 1 - beta**t after t is "
                                 "incremented; 1 - beta**0 is 0.")
        if k == 0:
            ratios = moved / np.maximum(should, 1e-300)
            uncorrected = (1 - hp.get("beta1", 0.9)) / np.sqrt(1 - hp.get("beta2", 0.999))
            if abs(ratio - 1) > 0.005 and np.allclose(ratios, ratio, rtol=1e-3) and \
                    not np.isclose(ratio, uncorrected, rtol=1e-3):
                default = ("this call passes none, so your signature's default is used" if "lr" not in hp
                           else f"this call passes lr={lr:g}")
                raise AssertionError(
                    f"{evidence} On the very first step PyTorch moves every weight by about lr = {lr:g}; yours moved "
                    f"every weight {ratio:.3g} times as far, all alike. A constant factor is the learning rate: "
                    f"{default}. (Without the bias correction the factor would be (1 - beta1) / sqrt(1 - beta2) = "
                    f"{uncorrected:.3g}, and that is not it.)")
            exactly = (f" That factor is (1 - beta1) / sqrt(1 - beta2) = {uncorrected:.3g}: what m and v give "
                       f"uncorrected." if np.isclose(ratio, uncorrected, rtol=1e-3) else "")
            raise AssertionError(
                f"{evidence} On the very first step PyTorch moves every weight by about lr = {lr:g}: "
                f"m-hat / sqrt(v-hat) is g / |g| once both moments are bias-corrected.{exactly} Check how you "
                f"correct m and v for their zero start, and where eps goes.")
        raise AssertionError(f"{evidence} Check the moment updates, the bias correction with the current t, "
                             f"and where eps goes (outside the square root).")


@graded_check("adam_step updates the state in place: t counts steps, m and v are the moving averages")
def check_adam_step_state(adam_step, seed: int = 0, steps: int = 6, **hp) -> None:
    hp = hyper(**hp)
    _, trajectory = _problem_and_gradients(seed, steps + 1, hp)
    w0 = trajectory[0][0]
    state = new_adam_state(w0)
    for k, (w, g, _, _) in enumerate(trajectory[:steps]):
        # Feed PyTorch's gradients whatever the returned weights are: only the state is judged here.
        adam_step(w.copy(), g.copy(), state, **hp)
        ref = trajectory[k + 1][2]
        _as_state(state, w0, f"after {k + 1} call(s) of adam_step, the state")
        expect(int(state["t"]) == k + 1,
               f"After {k + 1} call(s) of adam_step, state['t'] is {state['t']}, expected {k + 1}: t counts "
               f"completed steps and must grow by one per call, in the dict you were given (update it in "
               f"place; rebinding the name `state` inside the function changes nothing for the caller).")
        for key, name, beta, default in (("m", "first moment m", "beta1", 0.9), ("v", "second moment v", "beta2", 0.999)):
            got = np.asarray(state[key], dtype=np.float64)
            term = g if key == "m" else g * g
            scale = np.maximum(np.abs(trajectory[k][2][key]), np.abs(term))
            if np.all(np.abs(got - ref[key]) <= ULPS * np.spacing(np.maximum(scale, np.abs(ref[key])))):
                continue
            # What the state holds instead, where it matches a mistake exactly (the earlier calls matched).
            b = hp.get(beta, default)
            corrected = ref[key] / (1 - b ** (k + 1))
            with_default = default * trajectory[k][2][key] + (1 - default) * term
            if np.allclose(got, corrected, rtol=1e-9, atol=0):
                why = (f": it holds the bias-corrected average (divided by 1 - {beta}**t). Keep the raw moving "
                       f"average in the state, and correct a copy of it for the step.")
            elif b != default and np.allclose(got, with_default, rtol=1e-9, atol=0):
                why = (f": it matches the moving average with the default {beta}={default:g}, not the {beta}={b:g} "
                       f"this call passes. Use the betas adam_step is given.")
            else:
                why = (" (it is still all zeros)" if not np.any(got) else "") + (
                    f". It should be the raw moving average with {beta}={b:g} (not bias-corrected), kept in the "
                    f"state dict.")
            raise AssertionError(
                f"After {k + 1} call(s), state[{key!r}] (the {name}) differs from torch.optim.Adam's "
                f"{'exp_avg' if key == 'm' else 'exp_avg_sq'} by up to {np.max(np.abs(got - ref[key])):.2e}{why}")


def _close(w: np.ndarray, expected: np.ndarray) -> bool:
    return float(np.max(np.abs(w - expected))) <= 1e-9 * max(1.0, float(np.max(np.abs(expected))))


def _shown(hp: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in hp.items()) or "none"


def _what_train_n_steps_did(w: np.ndarray, start: _TorchReference, n: int, hp: dict) -> str | None:
    """Which mistake the weights after one call of train_n_steps match, if one does: each is replayed with
    torch.optim.Adam from where the call started."""
    candidates = [
        (lambda: start.branch().advance(n, start.problem.grad(start.w)),
         f"an Adam that used one and the same gradient, the one at the starting weights, for all {n} steps of "
         f"this call. Each step needs the gradient at the current weights: call grad_fn(w) in every step"),
        (lambda: start.branch(hp={}).advance(n),
         f"torch.optim.Adam with the default hyperparameters (lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08), not "
         f"with the ones train_n_steps received ({_shown(hp)}). Pass them on to adam_step")
        if hp else None,
        (lambda: start.branch(hp, fresh=True).advance(n),
         "an Adam that started afresh (m = v = 0, t = 0) at this call, instead of continuing the state it was "
         "given. Step with that very dict, which adam_step updates in place")
        if int(start.state["t"]) else None,
    ]
    for replay, story in filter(None, candidates):
        if _close(w, replay()):
            return story
    return None


@graded_check("train_n_steps continues from the state it is given and counts n steps")
def check_train_n_steps(train_n_steps, seed: int = 0, first: int = 7, then: int = 13, **hp) -> None:
    hp = hyper(**hp)
    reference = _TorchReference(seed, hp)
    problem = reference.problem
    state = new_adam_state(problem.w0)
    w = problem.w0.copy()
    for n in (first, then):
        start = reference.branch()
        w = _as_weights(train_n_steps(w, state, n, problem.grad, **hp), problem.w0, "train_n_steps")
        expected = reference.advance(n)
        done = int(reference.state["t"])
        _as_state(state, problem.w0, "after train_n_steps, the state")
        expect(int(state["t"]) == done,
               f"After train_n_steps with n={first}" + (f" and then n={then}" if n == then else "")
               + f", state['t'] is {state['t']}, expected {done}: every step must advance the state you "
                 f"were given, and a second call must continue from it, not start a new Adam.")
        if _close(w, expected):
            continue
        evidence = (f"After {done} steps in total (this call: n={n}) the weights differ from torch.optim.Adam's by "
                    f"{float(np.max(np.abs(w - expected))):.2e}")
        story = _what_train_n_steps_did(w, start, n, hp)
        if story:
            raise AssertionError(f"{evidence}, and they match {story}.")
        raise AssertionError(
            f"{evidence}. They match none of the usual mistakes, each replayed with torch.optim.Adam from where "
            f"this call started: the gradient at the starting weights reused for every step, the default "
            f"hyperparameters instead of the ones received ({_shown(hp)}), a fresh Adam state. Several at once, "
            f"or adam_step itself? Check that each step computes grad_fn(w) at the current weights, passes the "
            f"hyperparameters on, and continues the state it was given.")


def _trained(seed: int, k: int, hp: dict):
    reference = _TorchReference(seed, hp)
    reference.advance(k)
    return reference.problem, reference.w, reference.state


def _saved_here(save_checkpoint, path: str, w: np.ndarray, state: dict) -> dict:
    """In a forked child: save, and say what it returned, what was at `path`, what else in its folder, and
    whether the arrays it was given changed."""
    before = (w.copy(), {key: np.copy(v) for key, v in state.items()})
    result = save_checkpoint(path, w, state)
    folder, name = os.path.split(path)
    return {"returned": None if result is None else type_name(result),
            "size": os.path.getsize(path) if os.path.isfile(path) else None,
            "elsewhere": sorted(n for n in os.listdir(folder) if n != name),
            "changed": not (np.array_equal(w, before[0]) and all(np.array_equal(state[key], before[1][key])
                                                                 for key in before[1]))}


def probe_save_checkpoint(save_checkpoint, path: str, w: np.ndarray, state: dict, timeout: float = 20.0) -> dict:
    """The learner's save, in a forked child (what it keeps in memory dies with it: a later resume cannot
    find it in this process): _saved_here's report, or {"raised": what it raised} or {"died": why}."""
    try:
        return fresh_process.in_a_fork(_saved_here, save_checkpoint, path, w, state, timeout=timeout)
    except fresh_process.FreshProcessError as exc:
        return {"raised": exc.described()} if exc.described() else {"died": str(exc)}


@graded_check("save_checkpoint writes the weights and the Adam state to disk and leaves them untouched")
def check_save_checkpoint(save_checkpoint, seed: int = 0, k: int = 9, **hp) -> None:
    _, w, state = _trained(seed, k, hyper(**hp))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "adam.ckpt")
        seen = observe(probe_save_checkpoint, save_checkpoint, path, w, state)
    if "died" in seen:
        raise AssertionError(f"save_checkpoint, run in a process of its own, did not return: {seen['died']}.")
    if "raised" in seen:
        raise learner_exception(seen["raised"])
    expect(seen["returned"] is None, f"save_checkpoint returned a {seen['returned']}; it should write to disk "
                                     f"and return None (the checkpoint is the file, not a value in memory).")
    name = os.path.basename(path)
    expect(seen["size"] is not None, _no_file_at_path(name, seen["elsewhere"]))
    expect(seen["size"], f"save_checkpoint({name!r}, w, state) left an empty file at `path`: the weights and "
                         f"the Adam state must be in it.")
    expect(not seen["changed"],
           "Saving changed the weights or the Adam state it was given: save_checkpoint must only read them.")


def _no_file_at_path(name: str, elsewhere: list[str]) -> str:
    """Why there is no file at `path` after save_checkpoint(path, ...), from what its folder holds."""
    if not elsewhere:
        return (f"save_checkpoint({name!r}, w, state) wrote nothing to disk: a checkpoint kept in memory dies with "
                f"the process it was meant to survive.")
    numpy_suffix = [n for n in elsewhere if n in (name + ".npz", name + ".npy")]
    return (f"save_checkpoint({name!r}, w, state) wrote no file at `path`, only {', '.join(elsewhere)} next to it"
            + (": given a file name, np.savez and np.save append .npz or .npy to it. Open the file yourself and "
               "pass the file object." if numpy_suffix else ". The checkpoint is the file `path`: that is where "
                                                            "a resume looks for it."))


def _saving(save_checkpoint, path: str, w: np.ndarray, state: dict) -> tuple:
    """In a forked child: save; what the save raised (None when nothing), and the files it wrote outside
    the checkpoint's folder (see engine.travel.recording_writes_outside)."""
    outside = travel.recording_writes_outside(os.path.dirname(path))
    try:
        save_checkpoint(path, w, state)
    except Exception as exc:
        return describe_exception(exc), outside
    return None, outside


def warm_up_fresh_processes() -> None:
    """In the server of fresh processes (fresh_process._warm): np.load and np.savez's modules, imported once."""
    import io
    buffer = io.BytesIO()
    np.savez(buffer, w=np.zeros(1))
    buffer.seek(0)
    with np.load(buffer) as loaded:
        loaded["w"].copy()


def _resuming(resume, path: str):
    """In the fresh process: the learner's resume from the file at ``path``."""
    return resume(path)


def _round_trip(save_checkpoint, resume, path: str, w: np.ndarray, state: dict, full: bool) -> bool:
    """The control, in one forked child: a save and a resume in one and the same process."""
    save_checkpoint(path, w.copy(), {key: np.copy(v) for key, v in state.items()})
    return _same(resume(path), w, state, full)


def _same(result, w: np.ndarray, state: dict, full: bool = True) -> bool:
    """Whether a resume's result is (w, state) bitwise, or (``full`` False) has the weights w, bitwise."""
    try:
        got_w, got = result
        if not (np.asarray(got_w).dtype == np.float64 and np.array_equal(np.asarray(got_w), w)):
            return False
        return not full or (int(got["t"]) == int(state["t"]) and all(
            np.asarray(got[key]).dtype == np.float64 and np.array_equal(np.asarray(got[key]), state[key])
            for key in ("m", "v")))
    except Exception:  # noqa: BLE001 (anything else than a pair (w, state) is not the same)
        return False


def probe_resume_after_save(save_checkpoint, resume, path: str, w: np.ndarray, state: dict, full: bool = True,
                            timeout: float = 20.0) -> dict:
    """Save ``w`` and ``state`` to ``path`` with the learner's code in a forked child, copy the file to
    another folder under the same name, and resume from the copy with the learner's code in a fresh process
    (autograder.engine.fresh_process): a new interpreter that never held this one's memory, reading no file but
    the copy. ``resume`` is packed before the save runs, so nothing the save leaves in memory reaches it.

    Returns {"resumed": what the resume returned (data), "raised": what it raised (see
    grading.server.describe_exception) or None, "resumed_at": the copy's path, "save_raised": what the save
    raised or None, "save_died": why the saving process failed or None, "at_path": whether the save left a
    file at ``path``, "elsewhere": the other names in its folder, "left_out" and "written_outside" (what of
    the resume's globals could not travel, where the save wrote outside the folder), "control": None, or,
    when the resume did not give back what was saved (its weights only, unless ``full``), whether a save and
    a resume in one and the same process do}."""
    saved_w, saved_state = w.copy(), {key: np.copy(value) for key, value in state.items()}
    resuming = fresh_process.packed(_resuming, resume)
    seen = {"resumed": None, "raised": None, "resumed_at": None, "save_raised": None, "save_died": None,
            "control": None, "at_path": None, "elsewhere": None, "left_out": resuming.left_out,
            "written_outside": []}
    try:
        seen["save_raised"], seen["written_outside"] = fresh_process.in_a_fork(_saving, save_checkpoint, path, w,
                                                                               state, timeout=timeout)
    except fresh_process.FreshProcessError as exc:  # it died, ran out of time, or ended itself (sys.exit)
        seen["save_died"] = str(exc)
    if seen["save_raised"] or seen["save_died"]:
        return seen
    folder, name = os.path.split(path)
    seen["at_path"] = os.path.isfile(path)
    seen["elsewhere"] = sorted(n for n in os.listdir(folder) if n != name)
    # Another folder, the same name: only what the save left on disk travels (the folder's files' bytes, not
    # a link), and nothing in the path says which run this is.
    elsewhere = tempfile.mkdtemp(dir=folder)
    try:
        moved = tempfile.mkdtemp(dir=elsewhere)
        travel.copy_regular_files(folder, moved)
        copy = seen["resumed_at"] = os.path.join(moved, name)
        try:
            seen["resumed"] = resuming.run(copy, readable=[moved], timeout=timeout, preload=__name__)
        except fresh_process.FreshProcessError as exc:
            seen["raised"] = exc.described() or {"type": "RuntimeError", "builtin": True, "message": str(exc)}
        if seen["raised"] or not _same(seen["resumed"], saved_w, saved_state, full):
            control = os.path.join(tempfile.mkdtemp(dir=elsewhere), name)
            try:
                seen["control"] = fresh_process.in_a_fork(_round_trip, save_checkpoint, resume, control, saved_w,
                                                          saved_state, full, timeout=timeout)
            except fresh_process.FreshProcessError:
                seen["control"] = False
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)
    return seen


def _not_on_disk(seen: dict, saved, what: str, full: bool) -> str:
    """The failure message when a resume from the file alone fails, where a resume in the saving process works."""
    if seen["raised"]:
        raised = dict(seen["raised"])
        for shown, as_ in ((seen["resumed_at"], "path"), (os.path.dirname(seen["resumed_at"]), "its folder")):
            raised["message"] = raised.get("message", "").replace(shown, as_)
        did = f"raised {fresh_process.raised_text(raised)}"
    else:
        did = f"returned {_summary(seen['resumed'], saved, full)}"
    return (f"The checkpoint was not really on disk: the resume in a fresh process found only the file, and "
            f"{what}(path) {did} there. Saved and resumed within one process, the same functions give back "
            f"what was saved: the state went through memory or another file, not through the checkpoint. "
            f"{travel.what_did_not_travel(seen, 'save_checkpoint', what)}After a crash only the file "
            f"is left; write everything into it.")


def _summary(result, saved, full: bool) -> str:
    """What a resume returned, against what was saved, in a few words."""
    w_saved, s_saved = saved
    try:
        w, state = result
        compared = [("weights", w, w_saved)] + ([("m", state["m"], s_saved["m"]), ("v", state["v"], s_saved["v"])]
                                                if full else [])
        parts = [f"{name}: {_differs(got, ref)}" for name, got, ref in compared
                 if not np.array_equal(np.asarray(got), ref)]
        if full and int(state["t"]) != int(s_saved["t"]):
            parts.append(f"t = {state['t']} instead of {s_saved['t']}")
        return f"other values than were saved ({'; '.join(parts)})"
    except Exception:  # noqa: BLE001
        return f"a {type_name(result)}, not the pair (w, state) that was saved"


def _saved_and_resumed(save_checkpoint, resume, seed: int, k: int, hp: dict, what: str, full: bool = True):
    """Train k reference steps, save them with the learner's code in a fresh process and resume them with
    the learner's code in another (the probe above); return the problem, what was saved, and the resumed
    (w, state)."""
    problem, w, state = _trained(seed, k, hp)
    saved = (w.copy(), {key: np.copy(v) for key, v in state.items()})
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "adam.ckpt")
        seen = observe(probe_resume_after_save, save_checkpoint, resume, path, w, state, full)
    if seen["save_died"]:
        raise AssertionError(f"save_checkpoint, run in a process of its own, did not return: {seen['save_died']}.")
    if seen["save_raised"]:
        raise learner_exception(seen["save_raised"])
    if seen["control"]:
        raise AssertionError(_not_on_disk(seen, saved, what, full))
    if seen["raised"] and not seen["at_path"]:
        raise AssertionError(f"{what}(path) raised {seen['raised']['type']}: "
                             + _no_file_at_path(os.path.basename(path), seen["elsewhere"]))
    if seen["raised"]:
        raise learner_exception(seen["raised"])
    return problem, saved, _resumed(seen["resumed"], problem.w0, what)


def _resumed(result, like: np.ndarray, what: str):
    expect(isinstance(result, tuple) and len(result) == 2,
           f"{what}(path) should return a pair (w, state), not {type_name(result)}.")
    w, state = result
    expect(not (isinstance(w, dict) and isinstance(state, np.ndarray)),
           f"{what}(path) returned a pair whose first item is a dict and whose second is an array: return "
           f"(w, state), the weights first, as train_n_steps takes them.")
    return _as_weights(w, like, what), _as_state(state, like, f"the state returned by {what}")


def _differs(got, ref) -> str:
    got = np.asarray(got)
    if got.dtype != np.float64:
        return f"it comes back as {got.dtype}, not float64"
    return f"max |diff| {float(np.max(np.abs(got - ref))):.2e}"


@graded_check("a full resume after a disk round trip equals the uninterrupted run bitwise")
def check_resume_from_full_checkpoint(resume_from_full_checkpoint, save_checkpoint, seed: int = 0,
                                      k: int = 20, n: int = 50, lr: float = 0.05, **hp) -> None:
    hp = hyper(lr=lr, **hp)
    problem, (w_saved, s_saved), (w, state) = _saved_and_resumed(save_checkpoint, resume_from_full_checkpoint,
                                                                 seed, k, hp, "resume_from_full_checkpoint")
    expect(int(state["t"]) == k,
           f"The resumed state has t = {state['t']}, but {k} steps were taken before the save. "
           + ("Adam's step count restarted, so bias correction treats the resume as a fresh start. "
              "What does your checkpoint store for t?" if int(state["t"]) == 0 else
              "Is t saved and read back as the step count?"))
    for key, name in (("m", "first moment m"), ("v", "second moment v")):
        if not np.array_equal(state[key], s_saved[key]):
            raise AssertionError(
                f"The resumed {name} differs from the one saved ({_differs(state[key], s_saved[key])})"
                + (": it is all zeros, as in a fresh Adam. A full checkpoint holds both moments."
                   if not np.any(state[key]) else ". The round trip must be exact: keep float64."))
    if not np.array_equal(w, w_saved):
        raise AssertionError(f"The resumed weights differ from the saved ones ({_differs(w, w_saved)}). "
                             + "The round trip must be exact: keep float64.")
    expected = _TorchReference(seed, hp).advance(n)
    # The resumed (w, state), continued by torch.optim.Adam: PyTorch's own state after k steps, given its values.
    resumed_run = _TorchReference(seed, hp)
    resumed_run.advance(k)
    torch_state = resumed_run.optimizer.state[resumed_run.param]
    with torch.no_grad():
        for target, value in ((resumed_run.param, w), (torch_state["exp_avg"], state["m"]),
                              (torch_state["exp_avg_sq"], state["v"])):
            target.copy_(torch.tensor(np.asarray(value, dtype=np.float64)))
        torch_state["step"].fill_(int(state["t"]))
    resumed = resumed_run.advance(n - k)
    expect(np.array_equal(resumed, expected),
           f"After resuming at step {k} and training to step {n}, the weights differ from the uninterrupted "
           f"run by {float(np.max(np.abs(resumed - expected))):.2e}; they should be bitwise equal.")


@graded_check("a weights-only resume restores the weights and restarts Adam's state")
def check_resume_from_weights_only(resume_from_weights_only, save_checkpoint, seed: int = 0,
                                   k: int = 20, lr: float = 0.05, **hp) -> None:
    hp = hyper(lr=lr, **hp)
    problem, (w_saved, _), (w, state) = _saved_and_resumed(save_checkpoint, resume_from_weights_only,
                                                           seed, k, hp, "resume_from_weights_only", full=False)
    if not np.array_equal(w, w_saved):
        raise AssertionError(f"The weights-only resume did not give back the saved weights ({_differs(w, w_saved)})"
                             + (": they look like what the arrays held after the save, so the checkpoint "
                                "was not really on disk." if not np.any(w) else "."))
    expect(int(state["t"]) == 0 and not np.any(state["m"]) and not np.any(state["v"]),
           f"A weights-only resume starts a fresh Adam (m = v = 0, t = 0), but the returned state has "
           f"t = {state['t']}, |m| up to {float(np.max(np.abs(state['m']))):.2e}, |v| up to "
           f"{float(np.max(np.abs(state['v']))):.2e}. This function plays the mistake, so restore the weights only.")
    # What the restart predicts: with m-hat = g and v-hat = g*g, the first step is lr * sign(g) per coordinate.
    g = problem.grad(w)
    restarted = _TorchReference(seed, hp)          # a new torch.optim.Adam, its state as fresh as the resumed one
    with torch.no_grad():
        restarted.param.copy_(torch.tensor(np.asarray(w, dtype=np.float64)))
    after = restarted.advance(1)
    eps = hp.get("eps", 1e-8)
    predicted = w - hp["lr"] * g / (np.abs(g) + eps)
    expect(np.allclose(after, predicted, rtol=0, atol=1e-12),
           f"After the weights-only resume the first Adam step should move each weight by lr * sign(g) "
           f"(up to eps), but it moved by up to {float(np.max(np.abs(after - w))):.3g}.")
