"""Checks for notebook 08: the commit boundary and resume equivalence.

``AccumulationRun`` is a small but complete training loop: dropout (drawing from
the global RNG), a running mean of the hidden activations (a buffer), a shuffled
data order rebuilt from (seed, epoch), SGD with momentum, a StepLR schedule, a
GradScaler and gradient accumulation. A policy of the notebook picks how it
checkpoints and how it resumes: two correct ways, one way for each trap the
notebook names, and two that test the comparison itself (a resume that differs
in one tensor, one whose last bits differ). The capstone checks drive the
learner's ``resume_equivalent`` with runs of each policy, as a black box: it must
accept both correct resumes and reject every broken one. It runs in a fresh process and
holds handles only: the runs, their checkpoints and the policy stay in the process that
runs the check (see ``handles``).

The modules: ``training_loop`` (the loop, its policies, the runs the checks compare), ``handles`` (what
the learner's resume_equivalent is handed, and where the runs it asks about live) and
``resume_equivalent`` (the capstone's checks). The notebook, its test cells and the fresh process's
server (``fresh_process.start("autograder.commit_boundary")``, which runs ``warm_up_fresh_processes``)
import every name from here: those never move.
"""

from .handles import probe_resume_equivalent, warm_up_fresh_processes  # noqa: F401
from .resume_equivalent import (check_resume_equivalent_accepts_correct_resume,  # noqa: F401
                                check_resume_equivalent_catches_changed_seed,
                                check_resume_equivalent_catches_claimed_microbatches,
                                check_resume_equivalent_catches_unrestored_rng,
                                check_resume_equivalent_catches_weights_only, check_resume_equivalent_comparison)
from .training_loop import (BROKEN_POLICIES, CHECKPOINTING, CORRECT_POLICIES, POLICIES,  # noqa: F401
                            POLICY_PARTS, RESUMING, AccumulationRun, NewRun, ResumeRun, RunningMean,
                            new_run_factory, run_with_a_crash, uninterrupted_run)
