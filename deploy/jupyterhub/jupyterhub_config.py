"""JupyterHub for a class of this course: real Linux users, each server in the course's environment.

The README's "Teaching a class on JupyterHub" has the steps; setup_hub.sh installs this file as
/etc/jupyterhub/jupyterhub_config.py. Start the hub as root (LocalProcessSpawner starts each user's
server as that user):

    cd /srv/jupyterhub && /opt/workbook-hub/bin/jupyterhub -f /etc/jupyterhub/jupyterhub_config.py

The settings below read these environment variables (setup_hub.sh writes the values it was given at the
top of the installed copy), so that the same file serves a class and a trial (the repository's
end-to-end test starts the hub with it):

    WORKBOOK_HUB_ENV            the environment every server and kernel runs in, built from the student
                                distribution (default /opt/workbook-hub)
    WORKBOOK_HUB_GROUP          the Unix group of the class, students and instructors (resume-training)
    WORKBOOK_HUB_INSTRUCTORS    the instructors' user names, space-separated (instructor)
    WORKBOOK_HUB_INSTRUCTOR_CONFIG   the Jupyter config folder only instructors' servers read
                                (/etc/jupyterhub/instructor: formgrader, Create Assignment, course list)
    WORKBOOK_HUB_AUTHENTICATOR  pam (default: the users' Linux passwords) or dummy (any password: a
                                trial on a machine no one else can reach, never a class)
"""

import grp
import os
import pwd
import stat

c = get_config()  # noqa: F821 (provided by JupyterHub when it loads this file)

HUB_ENV = os.environ.get("WORKBOOK_HUB_ENV", "/opt/workbook-hub")
GROUP = os.environ.get("WORKBOOK_HUB_GROUP", "resume-training")
INSTRUCTORS = set(os.environ.get("WORKBOOK_HUB_INSTRUCTORS", "instructor").split())
INSTRUCTOR_CONFIG = os.environ.get("WORKBOOK_HUB_INSTRUCTOR_CONFIG", "/etc/jupyterhub/instructor")
AUTHENTICATOR = os.environ.get("WORKBOOK_HUB_AUTHENTICATOR", "pam")

# On loopback: put a TLS-terminating proxy (or JupyterHub's ssl_cert/ssl_key) in front before opening it
# to a network.
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = 8000

# Who may log in: the members of the class's Unix group (and the instructors).
if AUTHENTICATOR == "dummy":
    c.JupyterHub.authenticator_class = "dummy"
    c.Authenticator.allowed_users = set(grp.getgrnam(GROUP).gr_mem) | INSTRUCTORS
else:
    c.JupyterHub.authenticator_class = "pam"
    c.PAMAuthenticator.allowed_groups = {GROUP}
    c.Authenticator.allowed_users = INSTRUCTORS

# Every user's server runs as that user, from the course's environment, in their home folder.
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [f"{HUB_ENV}/bin/python", "-m", "jupyterhub.singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.environment = {"PATH": f"{HUB_ENV}/bin:/usr/local/bin:/usr/bin:/bin"}   # workbook-check, nbgrader
# Passed on from the hub's own environment: a Jupyter config folder beside /etc/jupyter (the test's).
c.Spawner.env_keep = ["LANG", "LC_ALL", "JUPYTER_CONFIG_PATH"]
c.Spawner.http_timeout = 120   # a server's first start imports JupyterLab and nbgrader: slow on a busy machine


def prepare_server(spawner):
    """Before a user's server starts: their home readable by them alone (Debian's default, 755, lets
    classmates read each other's work and the instructor's course), and for instructors, their config
    folder (the nbgrader extensions students do not get, the formgrader's frame policy)."""
    name = spawner.user.name
    home = pwd.getpwnam(name).pw_dir
    mode = stat.S_IMODE(os.stat(home).st_mode)
    if mode & 0o077:
        spawner.log.warning("%s's home %s was mode %o: made private (700)", name, home, mode)
        os.chmod(home, 0o700)
    if name in INSTRUCTORS:
        inherited = os.environ.get("JUPYTER_CONFIG_PATH")
        spawner.environment = {**spawner.environment,
                               "JUPYTER_CONFIG_PATH": os.pathsep.join(filter(None, [INSTRUCTOR_CONFIG, inherited]))}


c.Spawner.pre_spawn_hook = prepare_server
