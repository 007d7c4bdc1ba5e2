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

The modules: ``problem`` (the regression the notebook provides and the torch.optim.Adam reference),
``adam_step``, ``train_n_steps`` and ``save_checkpoint`` (each exercise's checks), ``round_trip`` (the save in
a forked child and the resume in a fresh process) and ``resume`` (the two resume checks). The notebook and the
test cells import every name from here: those never move.
"""

from .adam_step import ULPS, check_adam_step, check_adam_step_state  # noqa: F401
from .problem import HYPER, RegressionProblem, hyper, new_adam_state, regression_problem  # noqa: F401
from .resume import check_resume_from_full_checkpoint, check_resume_from_weights_only  # noqa: F401
from .round_trip import probe_resume_after_save, warm_up_fresh_processes  # noqa: F401
from .save_checkpoint import check_save_checkpoint, probe_save_checkpoint  # noqa: F401
from .train_n_steps import check_train_n_steps  # noqa: F401
