"""The layering is a contract (pyproject.toml, [tool.importlinter]): api > coordinator > storage, the three
formats independent of one another, the commit machinery free of any format, and no import cycles."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"   # import-linter's command, in the test venv
    run = subprocess.run([str(lint_imports), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
