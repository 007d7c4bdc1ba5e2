"""Checks for notebook 06: the data ledger.

A resume is correct for the data when the model and the input pipeline restart
from the same point: the last optimizer commit. The checks drive the learner's
``samples_per_update``, ``Ledger``, ``audit`` and ``window_digest`` through the
worked example (8 ranks, microbatch 2, 4 accumulation steps, a crash during the
third microbatch after update 1,250), through loaders that read an update and more
ahead of the loop, and through random scenarios, comparing against a per-position
reference that is only affordable at small sizes.

"Fetched" means taken from the run's data order by the loader: handed to the loop or
read ahead into its prefetch queue. ``window_digest`` is also computed in new Python
interpreters (started with different PYTHONHASHSEED values), where the learner's
function lives: a digest built on the salted ``hash()`` of a str differs there.

The modules: ``worked_example`` (the worked example's figures, the demo's dataset ``SlowWorkerSamples`` and
the per-position ``reference_audit``, which the checks share), then the checks of each exercise:
``samples_per_update``, ``ledger``, ``audit`` and ``window_digest``. The test cells and the notebooks (06's
and 10's) import every name from here (``from autograder.data_ledger import ...``): those never move.
So do ``_train``, ``_random_scenario`` and ``_scale_case``, which the tests and
``benchmarks/ledger_audit.py`` use.
"""

from .audit import _random_scenario, _scale_case, check_audit, check_audit_scale, probe_audit_memory  # noqa: F401
from .ledger import (_train, check_ledger_counts, check_ledger_new_configuration, check_ledger_resume,  # noqa: F401
                     check_ledger_state_dict, probe_state_saved_later)
from .samples_per_update import check_samples_per_update  # noqa: F401
from .window_digest import (HASH_SEEDS, check_window_digest_boundaries, check_window_digest_order,  # noqa: F401
                            probe_digests_in_new_interpreters)
from .worked_example import (CRASH_MICROBATCHES, WORKED_EXAMPLE, WORKED_UPDATES, SlowWorkerSamples,  # noqa: F401
                             reference_audit)
