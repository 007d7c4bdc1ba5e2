"""Checks for notebook 03: the complete checkpoint, resumed bitwise in a fresh process.

The notebook provides the training setup (``make_trainer``, ``train_steps``) from
here, so the checks and the learner run the very same code. A check trains one
trainer for N steps without a break. Its probes, run where the learner's functions
live, train another for k steps and save it with the learner's ``save_checkpoint`` in a
forked child (what the save leaves in memory dies with it); then, in a fresh process
(``autograder.engine.fresh_process``: a new interpreter that never held the saving process's
memory, given a copy of what the save left in its folder), build a trainer with another
seed, move its RNGs elsewhere, call the learner's ``load_checkpoint`` and train N - k
steps, and report what they saw. Every component is compared right after loading and
step by step afterwards, so a failure names the component that diverged first; where the
fresh process fails and a save and load in one process succeed, the state went through
memory or another file, and the message says so.

The modules: ``trainer`` (the training setup the notebook provides), ``probes`` (the fresh processes and
the probes), ``experiment`` (the resume experiment and its diagnosis, shared by the load checks),
``save_checkpoint`` and ``load_checkpoint`` (each exercise's checks). The notebook and the test cells import
every name from here: those never move.
"""

from .experiment import (COMPONENT_GROUPS, ResumeExperiment, diagnose, resume_experiment,  # noqa: F401
                         run_resume_experiment)
from .load_checkpoint import (check_load_checkpoint, check_load_checkpoint_data_position,  # noqa: F401
                              check_load_checkpoint_rng, check_load_checkpoint_training_state)
from .probes import (probe_resume_experiment, probe_save, probe_saved_then_resumed,  # noqa: F401
                     run_in_fresh_process, warm_up_fresh_processes)
from .save_checkpoint import check_save_checkpoint  # noqa: F401
from .trainer import (BATCH_SIZE, DATASET_SIZE, FEATURES, AugmentedRegression, Trainer, _next_batch,  # noqa: F401
                      make_trainer, next_batch, rng_fingerprints, seed_everything, snapshot, stateful_loader,
                      train_steps)
