"""The console commands: ``check`` (workbook-check, a learner's self-check), ``grade`` (workbook-grade,
a class into nbgrader's gradebook, with ``submission``: one submission, ``class_run``: the grading
children, and ``class_summary``), ``worker`` (workbook-worker, a grading worker of a Dask cluster)
and ``demo`` (workbook-demo, the classroom renderer). ``workbook.py`` runs them from the course's
environment.
"""
