import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# nbgrader shells out to `alembic`: the environment's bin/ must be on PATH.
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
sys.path.insert(0, str(Path(__file__).resolve().parent))
