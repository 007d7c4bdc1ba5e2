"""nbgrader's settings for instructors' servers (the hub points them at this folder): the course folder,
and its own nbgrader_config.py (the trusted judge, solutions/ as the source, notebooks/ as the release),
which nbgrader would otherwise read only when started in the course folder. The formgrader starts in the
instructor's home. An instructor who keeps the course elsewhere sets CourseDirectory.root in
~/.jupyter/nbgrader_config.py, which comes first.
"""

import os

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

c.CourseDirectory.root = os.path.expanduser("~/resume-training")
load_subconfig(os.path.join(c.CourseDirectory.root, "nbgrader_config.py"))  # noqa: F821 (nbgrader provides it)
