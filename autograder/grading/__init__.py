"""Trusted grading: the submission runs confined in a sandbox, the verdicts come from a judge outside it.

``judge`` (verdicts), ``sandbox`` (the grading process's side: start, talk to, end a sandbox), ``server``
(the sandbox's side), ``confine`` (how a sandbox confines itself), ``zygote`` (sandboxes forked from a
process that imported torch), ``wire`` (what crosses between them), ``scratch`` (files, as copies only),
``nbgrader_plugins`` (the judge and the feedback redaction as nbgrader preprocessors) and ``cluster``
(the judging done by a Dask worker instead of here). The threat
model is in docs/grading.md.
"""
