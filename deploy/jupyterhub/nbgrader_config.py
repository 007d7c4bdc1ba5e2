"""nbgrader's settings for everyone on the hub: install as /etc/jupyter/nbgrader_config.py (setup_hub.sh
does), where every user's nbgrader reads it, whichever environment it runs from.

The exchange is the folder through which assignments, submissions and feedback travel. setup_hub.sh
creates it as nbgrader documents (writable by everyone: mode 1777, the sticky bit so no one removes
another's files) with the course's own folder in it owned by the instructor, before any student can
take the course's name.
"""

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

c.CourseDirectory.course_id = "resume-training"
c.Exchange.root = "/srv/nbgrader/exchange"
