"""Notebook 02's round trip, which both resume checks go through: the learner's save in a forked child, its
resume in a fresh process reading only a copy of the file, the control (both in one process), and the messages
that say what came back.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from ..checking import expect, observe, type_name
from ..engine import fresh_process, travel
from ..grading.sandbox import learner_exception
from ..grading.server import describe_exception
from .problem import _as_state, _as_weights, _trained
from .save_checkpoint import _no_file_at_path


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
    """In the server of fresh processes (engine/fresh_server._warm): np.load and np.savez's modules, imported once."""
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
            seen["resumed"] = resuming.run(copy, readable=[moved], timeout=timeout, preload=__package__)
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
