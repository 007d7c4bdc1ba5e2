#!/usr/bin/env bash
# The administrator's part of a course hub (README: "Teaching a class on JupyterHub"). Run as root,
# after the class's accounts exist, with the student distribution the instructor built:
#
#   sudo WORKBOOK_HUB_INSTRUCTORS=alice deploy/jupyterhub/setup_hub.sh /path/to/student-dist
#
# It builds the hub's environment (or updates the course's package in it), turns nbgrader's
# instructor extensions off for everyone in it (the hub turns them on for instructors' servers),
# installs the configuration, creates the exchange and makes the class's homes private.
# Running it again is safe. Where things go (the defaults):
#
#   WORKBOOK_HUB_ENV                  /opt/workbook-hub        the environment every server runs in
#   WORKBOOK_HUB_GROUP                resume-training          the class's Unix group
#   WORKBOOK_HUB_INSTRUCTORS          instructor               the first one owns the course's exchange folder
#   WORKBOOK_HUB_CONFIG_DIR           /etc/jupyterhub          jupyterhub_config.py and instructor/
#   WORKBOOK_JUPYTER_CONFIG_DIR       /etc/jupyter             the global nbgrader_config.py
#   WORKBOOK_EXCHANGE                 /srv/nbgrader/exchange   nbgrader's exchange
#   WORKBOOK_HUB_STATE                /srv/jupyterhub          the hub's database and cookie secret
#   WORKBOOK_HUB_AUTHENTICATOR        pam                      or dummy: any password (a trial nobody else reaches)
#
# The hub's settings among these are written into the installed jupyterhub_config.py.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dist=${1:?usage: setup_hub.sh STUDENT_DIST_DIR (made by: python3 workbook.py release --student-package DIR)}
hub_env=${WORKBOOK_HUB_ENV:-/opt/workbook-hub}
group=${WORKBOOK_HUB_GROUP:-resume-training}
instructors=${WORKBOOK_HUB_INSTRUCTORS:-instructor}
hub_config=${WORKBOOK_HUB_CONFIG_DIR:-/etc/jupyterhub}
jupyter_config=${WORKBOOK_JUPYTER_CONFIG_DIR:-/etc/jupyter}
exchange=${WORKBOOK_EXCHANGE:-/srv/nbgrader/exchange}
state=${WORKBOOK_HUB_STATE:-/srv/jupyterhub}
authenticator=${WORKBOOK_HUB_AUTHENTICATOR:-pam}
course_id=$(sed -n 's/^c\.CourseDirectory\.course_id = "\(.*\)"$/\1/p' "$here/nbgrader_config.py")
owner=${instructors%% *}

say() { echo "[setup_hub] $*"; }
quietly() { local out; out=$("$@" 2>&1) || { echo "$out" >&2; echo "setup_hub.sh: failed: $*" >&2; exit 1; }; }
[ "$(id -u)" = 0 ] || { echo "setup_hub.sh: run it as root (it installs into $hub_env, /etc and /srv)" >&2; exit 1; }
wheel=$(ls "$dist"/torch_resume_workbook-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "setup_hub.sh: no torch_resume_workbook-*.whl in $dist" >&2; exit 1; }
getent group "$group" >/dev/null || { echo "setup_hub.sh: no Unix group $group (groupadd $group)" >&2; exit 1; }
id -u "$owner" >/dev/null 2>&1 || { echo "setup_hub.sh: no user $owner" >&2; exit 1; }

# 1. The environment: torch's CPU build, JupyterHub, and the course's package (which brings JupyterLab
#    and nbgrader). On an update only the course's package is replaced.
py="$hub_env/bin/python"
if [ ! -x "$py" ]; then
  say "building $hub_env (torch is the big one)"
  python3 -m venv "$hub_env"
  "$py" -m pip install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  "$py" -m pip install --quiet jupyterhub==6.1.1 "$wheel"
else
  say "installing $(basename "$wheel") into $hub_env"
  "$py" -m pip install --quiet --no-deps --force-reinstall "$wheel"
fi

# 2. Students get the Assignments tab and Validate, not Create Assignment, the formgrader or the course
#    list: off (and locked) for everyone in the environment; instructor/ turns them on again.
lab_only=(@jupyter/nbgrader:formgrader @jupyter/nbgrader:create-assignment @jupyter/nbgrader:course-list)
quietly "$py" -m jupyterlab.labextensions disable --level=sys_prefix "${lab_only[@]}"
quietly "$py" -m jupyterlab.labextensions lock --level=sys_prefix "${lab_only[@]}"
quietly "$py" -m jupyter_server.extension.serverextension disable --sys-prefix \
  nbgrader.server_extensions.formgrader nbgrader.server_extensions.course_list
say "instructor extensions off in $hub_env, on for: $instructors"
# Terminals: a plain bash keeps the PATH the hub gives each server (the environment's bin/ first, with
# workbook-check and nbgrader). Started by a hub, Jupyter makes it a login shell, and /etc/profile resets PATH.
cat > "$hub_env/etc/jupyter/jupyter_server_config.py" <<'PY'
c = get_config()  # noqa: F821 (written by setup_hub.sh: a terminal keeps the PATH the hub gives the server)
c.ServerApp.terminado_settings = {"shell_command": ["/bin/bash"]}
PY

# 3. The configuration: the hub's, the instructors' servers', and nbgrader's for everyone.
install -d -m 755 "$hub_config" "$hub_config/instructor/labconfig" "$jupyter_config"
{ # the settings this was run with, so that the hub starts with them (variables set then still win)
  echo "import os"
  for setting in "WORKBOOK_HUB_ENV=$hub_env" "WORKBOOK_HUB_GROUP=$group" "WORKBOOK_HUB_INSTRUCTORS=$instructors" \
                 "WORKBOOK_HUB_INSTRUCTOR_CONFIG=$hub_config/instructor" "WORKBOOK_HUB_AUTHENTICATOR=$authenticator"; do
    echo "os.environ.setdefault('${setting%%=*}', '${setting#*=}')"
  done
  cat "$here/jupyterhub_config.py"
} > "$hub_config/jupyterhub_config.py"
chmod 644 "$hub_config/jupyterhub_config.py"
install -m 644 "$here"/instructor/*.py "$here"/instructor/*.json "$hub_config/instructor/"
install -m 644 "$here/instructor/labconfig/page_config.json" "$hub_config/instructor/labconfig/"
sed "s#^c\.Exchange\.root = .*#c.Exchange.root = \"$exchange\"#" "$here/nbgrader_config.py" \
  > "$jupyter_config/nbgrader_config.py"
chmod 644 "$jupyter_config/nbgrader_config.py"

# 4. The exchange, as nbgrader documents it (everyone may write; the sticky bit keeps each one's files
#    their own), and the course's folder in it owned by the instructor before a student can take the name.
install -d -m 1777 "$exchange"
install -d -m 755 -o "$owner" -g "$(id -gn "$owner")" "$exchange/$course_id"
say "exchange $exchange, $course_id/ owned by $owner"

# 5. Every home of the class private (the hub also checks at each server start), and the hub's state.
for user in $(getent group "$group" | cut -d: -f4 | tr , ' ') $instructors; do
  home=$(getent passwd "$user" | cut -d: -f6)
  [ -d "$home" ] && chmod 700 "$home"
done
install -d -m 700 "$state"
say "done: start the hub with  cd $state && $hub_env/bin/jupyterhub -f $hub_config/jupyterhub_config.py"
