"""Checks for notebook 09: checkpoints across ranks, one module per exercise.

Conventions the notebook states (``folders``): a run folder holds one folder per checkpoint,
``step_<n>`` (n the number of committed updates), each written by ``torch.distributed.checkpoint``
(DCP), whose coordinator writes ``.metadata`` last: a step folder is *durable* when it holds a
readable ``.metadata``. Next to them, the file ``latest`` holds the name of the newest durable
folder, replaced by notebook 05's recipe once the checkpoint is synced.

- ``latest``: ``latest_checkpoint`` on run folders written with real DCP saves and left as crashes
  leave them; the path it returns is judged as text, never looked up.
- ``saving``: ``save_checkpoint`` in two probes, three saves on one run folder with every fsync,
  rename and symlink watched, and saves on three real gloo ranks, each holding its own rows.
- ``resume_plan``: the positions it returns, update by update.
- ``preemption``: ``PreemptionGuard`` inside real gloo ranks, under a scheduler process of its own
  that decides when the SIGTERMs come and to which ranks.

The test cells import every check from here (``from autograder.sharded_checkpoints import ...``):
those names never move.
"""

from ..engine.forked_ranks import quiet_distributed  # noqa: F401  (the notebook's own cells import it from here)
from .latest import check_latest_checkpoint_committed, check_latest_checkpoint_newest, judged_path  # noqa: F401
from .preemption import check_preemption_guard_same_boundary, check_preemption_guard_saves  # noqa: F401
from .resume_plan import check_resume_plan_cursor, check_resume_plan_global_batch  # noqa: F401
from .saving import (check_save_checkpoint_durable, check_save_checkpoint_new_folder,  # noqa: F401
                     check_save_checkpoint_pointer, check_save_checkpoint_ranks)
