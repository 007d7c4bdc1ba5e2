"""The trusted judge on grading platforms other than nbgrader: what runs inside their containers.

``submission`` does what both need (find the learner's notebook, prepare it from the instructor's source
as nbgrader's autograde does, judge it, one row per test cell, refuse where a protection is missing);
``gradescope`` and ``prairielearn`` are the entry points, each writing its platform's results.json.
``autograder.commands.package`` builds the package each platform is given. README: "Grading on Gradescope",
"Grading on PrairieLearn".
"""
