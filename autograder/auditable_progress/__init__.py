"""Checks for notebook 10: progress you can audit beyond fixed samples, one module per exercise.

- ``token_cursor``: judged by resuming the packing loader (``token_streams``) at the cursor it returns and
  auditing the source-token positions of the committed batches plus the resumed stream against the
  uninterrupted stream (notebook 06's per-position audit), for padded packed blocks, concatenate-and-chunk
  blocks and batches built to a token budget, on streams that start at the first document or where an earlier
  resume left them, with nothing committed yet or nothing fetched beyond the commit.
- ``resume_plan``: judged by reading, for every new owner (rank x worker), the records its plan names, and
  counting every record of every partition.
- ``verify_resume``: gets manifests, checkpoints and resumed jobs built here, each wrong in one way (or in
  none), as plain dicts that carry numbers and strings, never the name of the scenario.
- ``judge_deviation``: gets audit reports per stratum, every one over the same strata.

Everything the learner's code gets is data, so no probe is needed; what it is handed must come back unchanged.

The test cells import every check from here (``from autograder.auditable_progress import ...``): those names
never move.
"""

from .judge_deviation import (JUDGE_DEVIATION_CHECKS, check_judge_deviation_accepts,  # noqa: F401
                              check_judge_deviation_omission, check_judge_deviation_rates,
                              check_judge_deviation_recompute, check_judge_deviation_replay)
from .resume_plan import RESUME_PLAN_CHECKS, check_resume_plan_no_gap, check_resume_plan_no_overlap  # noqa: F401
from .token_cursor import TOKEN_CURSOR_CHECKS, check_token_cursor_resume, check_token_cursor_tokens  # noqa: F401
from .verify_resume import (VERIFY_RESUME_CHECKS, check_verify_resume_accepts,  # noqa: F401
                            check_verify_resume_dataset_version, check_verify_resume_generation,
                            check_verify_resume_next_identifiers, check_verify_resume_one_update,
                            check_verify_resume_world_size)
