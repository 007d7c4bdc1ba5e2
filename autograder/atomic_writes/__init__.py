"""Checks for notebook 05: atomic checkpoint writes, proven under real crashes; a module per role.

``torch.save(obj, path)`` opens ``path`` for writing at once: from that moment
until the last byte lands, the only checkpoint on the load path is a partial
file. The crash trials fork a writer (after torch is imported, so it starts in
milliseconds), let it save, and SIGKILL it, with every process it started, when the
directory shows that a given share of the checkpoint's bytes has been written; once
none of them is left, they try to load what is under the final name. The other
checks watch one call of the learner's ``atomic_save``: ``os.fsync`` /
``os.fdatasync`` / ``os.replace`` / ``os.rename`` are wrapped for the duration of
that call, recording what was synced, how many bytes it held at that moment, and the
order of events.

The forking, killing and recording happen in probes, where the learner's code lives
(in graded mode, the sandbox); they report how each writer ended, or the recorded
events. The checks make the scratch folders and the checkpoints themselves, then
read, load and judge what is on disk from outside.

``path`` must hold the old or the new checkpoint at every moment, not only where a
byte count lands a kill: the watched call also records, after each of those calls
and of ``os.remove`` / ``os.unlink`` / ``os.link`` / ``os.symlink``, what the file
at ``path`` holds (a digest, or nothing), and whether it is still the old file,
written over in place. Removing ``path`` before renaming the new file onto it, moving
the old one away first, or copying the temp file onto ``path`` all show there.

Every call of the learner's ``atomic_save`` looks alike, so that none can tell which
check it is in: ``path`` is ``<scratch>/checkpoints/model.pt``, and tempfile's default
folder is ``<scratch>/system-tmp`` during the call.

Conventions the notebook states: checkpoints end in ``.pt`` (``load_latest_checkpoint``'s
are named ``step_<n>.pt``, n the step they record as ``checkpoint["step"]``, and the
newest is the one with the largest step); a writer's temp file ends in ``.tmp`` and
lives next to its checkpoint.

The modules: ``checkpoints`` (what the checks write, ``classify``, the scratch layout), ``crashes``
(the crash trials), ``watched_call`` (one call watched), ``atomic_save`` and ``load_latest`` (the
checks of each exercise). The test cells and the notebook import every name from here: those never move.
"""

from ..demos.crash_demo import demo_crash, save_directly  # noqa: F401  (the notebook imports them from here)
from ..engine.crash_trials import run_and_kill  # noqa: F401  (the notebook's too)
from ..engine.file_operations import content_digest, recorded_file_operations  # noqa: F401  (05 and 09 record)
from .atomic_save import (check_atomic_save_cleanup, check_atomic_save_crash,  # noqa: F401
                          check_atomic_save_fsync_directory, check_atomic_save_fsync_file,
                          check_atomic_save_temp_location)
from .checkpoints import CHECKPOINT_SUFFIX, TEMP_SUFFIX, classify, holds_drawn, make_checkpoint  # noqa: F401
from .crashes import crash_trials  # noqa: F401
from .load_latest import (check_load_latest_checkpoint_newest, check_load_latest_checkpoint_temp_files,  # noqa: F401
                          check_load_latest_checkpoint_unreadable)
