"""A class on a real JupyterHub, on loopback: for tests/project/test_jupyterhub.py.

Real Linux users (an instructor and two students, made here and removed afterwards), the hub's
environment built from the student distribution, deploy/jupyterhub/setup_hub.sh run as an administrator
runs it, and JupyterHub with configurable-http-proxy started from the configuration it installed.
Everything the class's users must read lives in one folder under /tmp that they can reach; the hub's
own state is root's alone.

The one shortcut: the hub's environment is not a fresh install of torch, JupyterLab and nbgrader
(minutes, and hundreds of MB) but a venv that sees this environment's site-packages through a .pth file,
with the student distribution's wheel installed into it by setup_hub.sh. This environment's editable
install of the course is not visible there (its finder is a .pth that only this environment's own
site-packages runs), so ``import autograder`` in a student's kernel is the wheel's copy. The instructor's
commands run in this environment itself, as from a clone's .venv.

Where this environment's base Python sits in a folder other users cannot enter (pyenv under /root, 700),
their processes would start it with another Python's library instead, or not at all. Every process of
the class's users, and the hub that starts their servers, then runs in a mount namespace of its own in
which only that installation is reachable there (``class_view``); nothing else about what they can
read changes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from browser_support import ROOT, _free_port, _ServerProcess, chromium_missing_reason

DEPLOY = ROOT / "deploy" / "jupyterhub"
COURSE_ID = "resume-training"
PROXY = os.environ.get("WORKBOOK_HUB_PROXY") or shutil.which("configurable-http-proxy")
COMMAND_TIMEOUT_S = 300


def _readable_by_others(path: Path) -> bool:
    """Every folder from / down to ``path`` can be entered by any user, and ``path`` read."""
    for folder in [*reversed(path.parents), path]:
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def _private_folder_above(path: Path) -> Path | None:
    """The topmost folder above ``path`` that other users cannot enter, if there is one."""
    return next((folder for folder in reversed(path.parents) if not os.stat(folder).st_mode & stat.S_IXOTH), None)


BASE_PYTHON = Path(sys.base_prefix).resolve()
HIDDEN_BY = _private_folder_above(BASE_PYTHON)
_EXPOSE = ('set -e; mount --bind "$1" "$3"; mount -t tmpfs -o mode=755 tmpfs "$2"; mkdir -p "$1"; '
           'mount --move "$3" "$1"; shift 3; exec "$@"')


def class_view(args: list, account: "Account | None" = None, mount_point: Path | None = None) -> list[str]:
    """``args`` (as ``account``, else as root) where the class's users can run this Python: as they are, or,
    when a private folder hides the base installation, in a mount namespace where that folder is an empty
    tmpfs with only the installation mounted back at its place (``mount_point``: an empty folder to pass
    it through)."""
    args = [str(a) for a in args]
    if account is not None:
        args = ["setpriv", f"--reuid={account.name}", f"--regid={account.gid}", "--init-groups", "--", *args]
    if HIDDEN_BY is None:
        return args
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _EXPOSE, "sh", str(BASE_PYTHON),
            str(HIDDEN_BY), str(mount_point), *args]


def hub_missing_reason() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root: it creates Linux users (useradd) and runs JupyterHub's LocalProcessSpawner"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "chpasswd"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (Debian's passwd package)"
    if importlib.util.find_spec("jupyterhub") is None:
        return "JupyterHub is not installed in this environment (pip install jupyterhub==6.1.1)"
    if not PROXY:
        return ("no configurable-http-proxy on PATH (npm install -g configurable-http-proxy) or in "
                "WORKBOOK_HUB_PROXY")
    for needed in (Path(sysconfig.get_paths()["purelib"]), ROOT / "autograder"):
        if not _readable_by_others(needed):
            return (f"{needed} cannot be read by other users (a folder above it is private): the class's users "
                    f"run this environment's packages and the instructor its autograder")
    if HIDDEN_BY is not None and not (shutil.which("unshare") and shutil.which("setpriv")):
        return f"this Python lives in {HIDDEN_BY}, which other users cannot enter, and there is no unshare/setpriv"
    return chromium_missing_reason()


# ---- the class's Linux accounts ---------------------------------------------------------------

@dataclass
class Account:
    name: str
    password: str

    @property
    def home(self) -> Path:
        return Path(pwd.getpwnam(self.name).pw_dir)

    @property
    def gid(self) -> int:
        return pwd.getpwnam(self.name).pw_gid


class ClassAccounts:
    """A Unix group for the class, an instructor and two students in it, homes 700 (as the README's
    ``useradd -m -K HOME_MODE=0700`` makes them); ``remove()`` ends what they still run and deletes them."""

    def __init__(self):
        tag = os.urandom(2).hex()
        self.group = f"wb-class-{tag}"
        self.instructor, self.alice, self.bob = (Account(f"wb-{role}-{tag}", os.urandom(9).hex())
                                                 for role in ("instructor", "alice", "bob"))
        self.created: list[str] = []
        subprocess.run(["groupadd", self.group], check=True)
        for account in self.all:
            subprocess.run(["useradd", "--create-home", "-K", "HOME_MODE=0700", "--shell", "/bin/bash",
                            "--groups", self.group, account.name], check=True)
            self.created.append(account.name)
        subprocess.run(["chpasswd"], input="".join(f"{a.name}:{a.password}\n" for a in self.all), text=True,
                       check=True)

    @property
    def all(self) -> tuple[Account, ...]:
        return self.instructor, self.alice, self.bob

    def remove(self) -> None:
        for name in self.created:
            _end_processes_of(pwd.getpwnam(name).pw_uid)
            subprocess.run(["userdel", "--remove", name], capture_output=True)
        subprocess.run(["groupdel", self.group], capture_output=True)


def _end_processes_of(uid: int) -> None:
    """SIGKILL every process still owned by ``uid`` (one of the test's own users), one by one."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)


def user_env(account: Account, path: list[Path | str], config_path: Path) -> dict:
    """A login-like environment for ``account``: its home, ``path`` first on PATH, the hub's global
    Jupyter config folder (what /etc/jupyter is on a real hub)."""
    return {"HOME": str(account.home), "USER": account.name, "LOGNAME": account.name, "LANG": "C.UTF-8",
            "PATH": os.pathsep.join([*map(str, path), "/usr/local/bin", "/usr/bin", "/bin"]),
            "JUPYTER_CONFIG_PATH": str(config_path), "OMP_NUM_THREADS": "1"}


def run_as(account: Account, args: list, env: dict, mount_point: Path, cwd: Path | None = None,
           check: bool = True) -> subprocess.CompletedProcess:
    """``args`` run as ``account`` (its uid, group and supplementary groups), output captured."""
    result = subprocess.run(class_view(args, account, mount_point), cwd=cwd or account.home, env=env,
                            capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if check and result.returncode != 0:
        raise AssertionError(f"as {account.name}: {' '.join(map(str, args))} exited {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def can_read(account: Account, path: Path, env: dict, mount_point: Path) -> bool:
    """Whether ``account`` can read the file ``path``, or list the folder ``path``."""
    probe = "import os, sys; p = sys.argv[1]; os.listdir(p) if os.path.isdir(p) else open(p, 'rb').read(1)"
    return run_as(account, [sys.executable, "-I", "-c", probe, path], env, mount_point, check=False).returncode == 0


# ---- the hub's environment and configuration -------------------------------------------------------

@dataclass
class HubFolders:
    """Where setup_hub.sh puts things, under one folder the class can reach (/opt, /etc and /srv on a real hub)."""
    root: Path

    def __post_init__(self):
        self.env = self.root / "workbook-hub"              # /opt/workbook-hub
        self.hub_config = self.root / "etc-jupyterhub"    # /etc/jupyterhub
        self.jupyter_config = self.root / "etc-jupyter"   # /etc/jupyter
        self.exchange = self.root / "exchange"            # /srv/nbgrader/exchange
        self.state = self.root / "srv-jupyterhub"         # /srv/jupyterhub
        self.mount_point = self.root / "mnt"              # for class_view
        self.mount_point.mkdir(exist_ok=True)

    def setup_env(self, accounts: ClassAccounts) -> dict:
        """setup_hub.sh's settings: deploy/jupyterhub's defaults moved here, the class's names."""
        return {"WORKBOOK_HUB_ENV": str(self.env), "WORKBOOK_HUB_GROUP": accounts.group,
                "WORKBOOK_HUB_INSTRUCTORS": accounts.instructor.name,
                "WORKBOOK_HUB_CONFIG_DIR": str(self.hub_config),
                "WORKBOOK_HUB_INSTRUCTOR_CONFIG": str(self.hub_config / "instructor"),
                "WORKBOOK_JUPYTER_CONFIG_DIR": str(self.jupyter_config),
                "WORKBOOK_EXCHANGE": str(self.exchange), "WORKBOOK_HUB_STATE": str(self.state)}


def make_hub_folders() -> HubFolders:
    root = Path(tempfile.mkdtemp(prefix="workbook-hub-", dir="/tmp"))
    root.chmod(0o755)
    return HubFolders(root)


def overlay_environment(target: Path) -> None:
    """The hub's environment: a venv on this environment's packages without its editable course (see the
    module's docstring), with JupyterLab's assets (share/jupyter, read only) and its own copy of the
    Jupyter configuration (etc/jupyter, which setup_hub.sh changes)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    site = Path(subprocess.run([str(target / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    # Plain lines: on sys.path, but their folder's own .pth files (the editable course's finder) do not run.
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    (site / "_course_environment.pth").write_text("".join(f"{p}\n" for p in ours))
    (target / "share").mkdir(exist_ok=True)
    (target / "share" / "jupyter").symlink_to(Path(sys.prefix) / "share" / "jupyter")
    shutil.copytree(Path(sys.prefix) / "etc" / "jupyter", target / "etc" / "jupyter")


def run_setup_hub(folders: HubFolders, accounts: ClassAccounts, dist: Path) -> str:
    """deploy/jupyterhub/setup_hub.sh, as root, with the folders moved under ``folders.root``."""
    env = dict(os.environ, **folders.setup_env(accounts))
    result = subprocess.run(["bash", str(DEPLOY / "setup_hub.sh"), str(dist)], env=env, capture_output=True,
                            text=True, timeout=COMMAND_TIMEOUT_S)
    if result.returncode != 0:
        raise AssertionError(f"setup_hub.sh exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result.stdout


# ---- the hub ------------------------------------------------------------------------------------

class Hub(_ServerProcess):
    """``jupyterhub -f <hub_config>/jupyterhub_config.py`` as root in the state folder (in the class's view,
    which the servers it starts inherit), on free loopback ports (the public one, the hub's own and the
    proxy's API), the proxy found on PATH."""

    stop_whole_group = True   # the hub, its proxy and, until the hub stops them, the users' servers

    def __init__(self, folders: HubFolders, log_dir: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # No WORKBOOK_HUB_* settings: setup_hub.sh wrote them into the configuration it installed.
        env = dict(LANG="C.UTF-8", JUPYTER_CONFIG_PATH=str(folders.jupyter_config), HOME=str(folders.state),
                   PATH=os.pathsep.join([str(Path(sys.executable).parent), str(Path(PROXY).parent),
                                         "/usr/local/bin", "/usr/bin", "/bin"]))
        folders.state.mkdir(mode=0o700, exist_ok=True)
        command = [str(Path(sys.executable).parent / "jupyterhub"), "-f",
                   str(folders.hub_config / "jupyterhub_config.py"), f"--port={self.port}",
                   f"--JupyterHub.hub_port={_free_port()}",
                   f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{_free_port()}"]
        self._start(class_view(command, mount_point=folders.mount_point), folders.state, env,
                    log_dir / "jupyterhub.log")
        self._wait_until(self._answers, "JupyterHub")

    def _answers(self) -> bool:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{self.url}/hub/api", timeout=5) as response:
                return response.status == 200
        return False

    def stop(self) -> None:
        """SIGTERM to the hub alone first: it stops the users' servers and its proxy itself (cleanup)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
        super().stop()


class HubUser:
    """One account's JupyterLab through the hub, in a browser page."""

    def __init__(self, hub: Hub, account: Account, page):
        self.hub, self.account, self.page = hub, account, page
        self.url = f"{hub.url}/user/{account.name}"

    def log_in(self, timeout_s: float = 180) -> None:
        """The hub's login form, then wait until the server has started and JupyterLab shows."""
        page = self.page
        page.goto(f"{self.hub.url}/hub/login")
        page.fill("input#username_input", self.account.name)
        page.fill("input#password_input", self.account.password)
        page.click("#login_submit")
        page.wait_for_url(f"{self.url}/lab**", timeout=timeout_s * 1000)
        page.wait_for_selector(".lm-MenuBar-itemLabel", timeout=timeout_s * 1000)

    def log_out(self) -> None:
        self.page.goto(f"{self.hub.url}/hub/logout")
        self.page.wait_for_selector("input#username_input", timeout=60_000)


def wait_for(condition, what: str, timeout_s: float = 60, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
