"""The checks of notebook 06's ``Ledger``: driven as a data-parallel loop would, through the worked example
and loaders an update and more ahead of the loop, they judge its counts, its resume position (the last
commit, not the fetched count) and its state_dict, saved while training goes on (a probe, where the ledger
lives).
"""

from __future__ import annotations

import math

from ..checking import error_text, expect, failing_if_raised, graded_check, observe
from ..helpers import serialized_copy, watch
from .worked_example import CRASH_MICROBATCHES, WORKED_EXAMPLE, WORKED_UPDATES


def _new_ledger(Ledger, config):
    with failing_if_raised(f"Ledger{config}"):
        return Ledger(*config)


def _counter(ledger, name: str) -> int:
    with failing_if_raised(f"reading ledger.{name}"):
        value = getattr(ledger, name)
    expect(not callable(value), f"ledger.{name} should be a property holding a number, not a method.")
    return value


def _train(ledger, config, updates: int, prefetch: int = 0, partial: int = 0) -> None:
    """Drive a ledger as a data-parallel loop would: per microbatch every rank fetches its
    micro_batch positions; every accum_steps microbatches end in an optimizer commit.
    ``prefetch`` microbatches are fetched ahead (one fetch each), as a DataLoader's workers read ahead
    of the loop, and the loader stays that far ahead; ``partial`` microbatches of the next update are
    fetched before a crash."""
    world_size, micro_batch, accum_steps = config
    per_microbatch = world_size * micro_batch
    for _ in range(prefetch):
        ledger.fetch(per_microbatch)
    for _ in range(updates):
        for _ in range(accum_steps):
            ledger.fetch(per_microbatch)
        ledger.commit()
    for _ in range(partial):
        ledger.fetch(per_microbatch)


@graded_check("only optimizer commits move the committed cursor; fetched counts every position the loader took")
def check_ledger_counts(Ledger, config=WORKED_EXAMPLE, updates: int = 30) -> None:
    ledger = _new_ledger(Ledger, config)
    per_update = math.prod(config)
    per_microbatch = config[0] * config[1]
    expect((_counter(ledger, "fetched"), _counter(ledger, "committed")) == (0, 0),
           f"a new Ledger should start with fetched = committed = 0, not "
           f"{_counter(ledger, 'fetched')} and {_counter(ledger, 'committed')}.")
    # A loader that prefetches two microbatches ahead, then a crash three microbatches into an update.
    prefetch, partial = 2, CRASH_MICROBATCHES
    _train(ledger, config, updates, prefetch=prefetch, partial=partial)
    fetched, committed = _counter(ledger, "fetched"), _counter(ledger, "committed")
    want_fetched = (prefetch + updates * config[2] + partial) * per_microbatch
    want_committed = updates * per_update
    expect(fetched == want_fetched,
           f"After {updates} updates with a loader two microbatches ahead and {partial} microbatches of the "
           f"next update, the loader took {want_fetched} positions, but ledger.fetched is {fetched}. "
           f"fetch(n) records n more positions the loader took (read ahead or handed to the loop), whether "
           f"or not they are ever trained.")
    if committed != want_committed:
        extra = committed - want_committed
        if extra > 0 and extra % per_microbatch == 0:
            hint = (f" That is {extra} positions too many: {extra // per_microbatch} microbatches were fetched but "
                    f"never reached an optimizer step. ")
        elif committed > 0 and committed * config[2] == want_committed:
            hint = (f" Each commit counted {per_microbatch} positions, one microbatch of every rank; an update is "
                    f"{config[2]} microbatches (the accumulation steps). ")
        else:
            hint = " "
        raise AssertionError(
            f"After {updates} optimizer updates of {per_update} samples, ledger.committed is {committed}, "
            f"expected {want_committed}.{hint}Only commit() means gradients reached the weights, and each "
            f"commit covers exactly one update's worth of positions, however far the loader has read ahead.")


def _resume_scenarios(config, updates: int, partial: int) -> list[tuple[int, int, int]]:
    """(updates, prefetch, partial) of each crash the resume check replays: the worked example (a loader
    that does not read ahead), then loaders an update and more ahead of the loop, crashing mid-update and
    right after a commit. Deep prefetch puts the fetched count a whole update or more past the commit; the
    first of them leaves it off a whole update, so that rounding it down is told apart from taking it."""
    accum_steps = config[2]
    deep = max(1, min(updates, 25))
    return [(updates, 0, partial), (deep, accum_steps, 1), (deep, accum_steps, 0),
            (deep, 2 * accum_steps + 1, max(1, accum_steps - 1))]


@graded_check("the resume position is the last commit, not the fetched count (the 80,000-sample example)")
def check_ledger_resume(Ledger, config=WORKED_EXAMPLE, updates: int = WORKED_UPDATES,
                        partial: int = CRASH_MICROBATCHES) -> None:
    per_update, per_microbatch = math.prod(config), config[0] * config[1]
    for done, prefetch, in_flight in _resume_scenarios(config, updates, partial):
        ledger = _new_ledger(Ledger, config)
        _train(ledger, config, done, prefetch=prefetch, partial=in_flight)
        want = done * per_update
        fetched = want + (prefetch + in_flight) * per_microbatch
        got = _counter(ledger, "resume_position")
        if got == want:
            continue
        ahead = (f"a loader {prefetch} microbatches ahead of the loop ({prefetch * per_microbatch:,} positions; "
                 f"an update is {per_update:,})" if prefetch else "a loader that does not read ahead")
        crash = (f"{in_flight} microbatch{'es' if in_flight > 1 else ''} into update {done + 1}" if in_flight
                 else f"right after the commit of update {done}")
        rounded = fetched // per_update * per_update
        if _counter(ledger, "committed") == got:
            cause = (f"resume_position is ledger.committed, and that count is already wrong ({got:,}): only commit() "
                     f"may move it, by exactly one update's worth of positions per optimizer step "
                     f"(test_Ledger_counts shows what it counted). ")
        elif got > want:
            derived = ("the fetched count, here also a whole number of updates" if got == fetched == rounded
                       else "the fetched count" if got == fetched
                       else "the fetched count rounded down to a whole update" if got == rounded else f"{got:,}")
            cause = (f"resume_position is {derived}. Anything derived from the fetched count, even rounded down "
                     f"to a whole update, runs ahead of the weights by what the loader read ahead. ")
        else:
            cause = f"resume_position is {got:,}. "
        effect = (f"Resuming at {got:,} skips {got - want:,} positions whose gradients never reached the weights."
                  if got > want else
                  f"Resuming at {got:,} replays {want - got:,} positions the weights already contain.")
        raise AssertionError(
            f"With {ahead}, the run crashed {crash}: {fetched:,} positions fetched, and the durable checkpoint "
            f"holds update {done} = {want:,} committed positions. {cause}{effect} "
            "Where do the model's weights say training stopped?")


def probe_state_saved_later(ledger, config, more: int) -> dict:
    """Take ``ledger.state_dict()``, train ``more`` updates, then save the state (a torch.save/load round
    trip): the saved copy, or what stopped it (the state's type if not a dict, an error as text); with
    ledger.committed after those updates and what state_dict() changed in the ledger (helpers.watch).

    Runs where the ledger lives: a state_dict() that is a live view of the ledger has moved by the time
    it is saved, which a copy taken out of the sandbox at once would hide. A saved state that did not move
    shows nothing unless the ledger did: the ledger's own count after the updates comes back with it (read
    here, since what a probe does to the ledger need not outlast the probe)."""
    changed = watch(lambda: {"ledger": ledger})
    try:
        state = ledger.state_dict()
    except NotImplementedError:
        raise
    except Exception as exc:
        return {"state_dict raised": error_text(exc)}
    tampering = changed()
    if not isinstance(state, dict):
        return {"not a dict": type(state).__name__}
    _train(ledger, config, more)
    try:
        committed = ledger.committed
    except NotImplementedError:
        raise
    except Exception:
        committed = None
    seen = {"committed after": None if callable(committed) else committed, "tampering": tampering}
    try:
        return {"saved": serialized_copy(state), **seen}
    except NotImplementedError:
        raise
    except Exception as exc:
        return {"saving raised": error_text(exc), **seen}


@graded_check("state_dict / load_state_dict resume from the committed cursor")
def check_ledger_state_dict(Ledger, config=WORKED_EXAMPLE, updates: int = 5,
                            partial: int = CRASH_MICROBATCHES) -> None:
    # Compared with the ledger's own committed count, so that this check is about saving and
    # loading only (whether that count is right is check_ledger_counts' business).
    per_update = math.prod(config)
    ledger = _new_ledger(Ledger, config)
    prefetch = config[2] + 1          # the loader reads more than an update ahead of the loop
    _train(ledger, config, updates, prefetch=prefetch, partial=partial)
    committed = _counter(ledger, "committed")
    # Training goes on while the checkpoint is written: the saved state must not move with it.
    seen = observe(probe_state_saved_later, ledger, config, more=2)
    if "state_dict raised" in seen:
        raise AssertionError(f"ledger.state_dict() raised {seen['state_dict raised']}")
    expect("not a dict" not in seen, f"state_dict() should return a dict, not {seen.get('not a dict')}.")
    moved_to = seen["committed after"]
    if "saving raised" in seen:
        raise AssertionError(f"the ledger's state_dict() does not survive torch.save/torch.load(weights_only=True) "
                             f"({seen['saving raised']}); keep it to plain numbers, strings and dicts.")
    saved = seen["saved"]
    resumed = _new_ledger(Ledger, config)
    try:
        resumed.load_state_dict(saved)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise AssertionError(f"load_state_dict raised {type(exc).__name__}: {exc}") from None
    got = {name: _counter(resumed, name) for name in ("committed", "resume_position", "fetched")}
    if got["committed"] != committed and got["committed"] == moved_to:
        raise AssertionError(
            f"The state_dict() taken at {committed:,} committed positions reads {got['committed']:,} after two "
            f"more updates: it is a live view of the ledger, not a snapshot. What does your state_dict() return?")
    if got["committed"] == committed and moved_to == committed:
        # A saved state that did not move counts only if the ledger did.
        raise AssertionError(
            (f"Your state_dict() changed the ledger it was called on ({'; '.join(seen['tampering'])}): "
             if seen["tampering"] else "")
            + f"two more updates after state_dict() left ledger.committed at {committed:,}, so whether the saved "
            f"state is a snapshot or a live view of the ledger could not be observed. "
            + ("state_dict() must only read the ledger." if seen["tampering"] else
               "Only commit() moves the committed count, by one update's worth of positions."))
    expect(got["committed"] == committed and got["resume_position"] == committed,
           f"A ledger saved with committed = {committed:,} (and {prefetch + partial} uncommitted microbatches "
           f"fetched, {prefetch} of them read ahead by the loader) "
           f"comes back with committed = {got['committed']:,} and resume_position = "
           f"{got['resume_position']:,}; both should be {committed:,}.")
    expect(got["fetched"] == committed,
           f"After load_state_dict the ledger says {got['fetched']:,} positions were fetched, so the next "
           f"fetch continues there; but the new process's loader restarts at the resume position "
           f"{committed:,}. "
           + (f"Resuming the fetch cursor beyond it omits the {got['fetched'] - committed:,} positions that were "
              f"fetched before the crash but never committed." if got["fetched"] > committed else
              f"A fetch cursor behind it would hand out again the {committed - got['fetched']:,} positions "
              f"from {got['fetched']:,} on, which the weights already contain."))
    for _ in range(config[2]):
        resumed.fetch(config[0] * config[1])
    resumed.commit()
    expect(_counter(resumed, "committed") == committed + per_update,
           f"After load_state_dict, one more update should bring committed to {committed + per_update:,}, "
           f"but it is {_counter(resumed, 'committed'):,}.")


def _one_update(ledger, config) -> int:
    """What one update's commit adds to the ledger's committed count."""
    before = _counter(ledger, "committed")
    for _ in range(config[2]):
        ledger.fetch(config[0] * config[1])
    ledger.commit()
    return _counter(ledger, "committed") - before


@graded_check("a saved ledger restores into a job with another configuration: positions carry over, its own "
              "configuration counts the next updates")
def check_ledger_new_configuration(Ledger, config=WORKED_EXAMPLE, restart=(4, 2, 2), updates: int = 5) -> None:
    # The restarted job may run on another number of ranks or accumulate differently: the saved state is
    # in positions (the data order does not change with the job), and the new ledger's own configuration
    # decides what its next commit adds. Judged against the ledger's own counts (what one commit adds in
    # each configuration, measured on fresh ledgers), so that this check is about the restart only.
    old, new = (_one_update(_new_ledger(Ledger, c), c) for c in (config, restart))
    ledger = _new_ledger(Ledger, config)
    _train(ledger, config, updates, prefetch=1, partial=1)
    committed = _counter(ledger, "committed")
    with failing_if_raised("ledger.state_dict()"):
        saved = ledger.state_dict()
    resumed = _new_ledger(Ledger, restart)
    with failing_if_raised(f"load_state_dict into Ledger{restart}"):
        resumed.load_state_dict(saved)
    got = _counter(resumed, "committed")
    expect(got == committed,
           f"A ledger saved at {committed:,} committed positions by a job with (world_size, micro_batch, "
           f"accum_steps) = {config} (one update = {old} positions) was loaded into a restarted job with "
           f"{restart} (one update = {new} positions), and its committed count is {got:,}"
           + (f" = {committed // old} updates of the new job" if old and got == committed // old * new else "")
           + ". The data order does not change with the job: save positions, not a count of updates, so the "
             "committed position means the same in any configuration.")
    after = got + _one_update(resumed, restart)
    expect(after == committed + new,
           f"After loading the state into a job with {restart} (one update = {new} positions), one update "
           f"brought committed from {committed:,} to {after:,}"
           + (f": it added the saved job's {old} positions per update" if after == committed + old else "")
           + f". The restarted job's own configuration, the one its ledger was made with, decides what a commit "
             f"adds; should be {committed + new:,}.")
