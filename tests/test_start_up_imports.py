"""What the package costs a run before it reads a file: every boot pays it while the runtime
waits (issue 17). The package never imports typing at run time: its annotations are strings
(`from __future__ import annotations`), its typing names are imported under a module-level
`TYPE_CHECKING = False`, which mypy and ruff read as typing.TYPE_CHECKING, and typing's own
import was 1.3 ms (3.9) to 2.1 ms (3.13) of each run, about 3 % of a 1,000-entry dry run."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import cni_reaper

REPO = Path(__file__).resolve().parent.parent

# __main__ runs the reaper; journal_files is imported only to read a journal, and then loads
# systemd-python, which is not the package's to keep light.
NOT_IMPORTED_HERE = {"cni_reaper.__main__", "cni_reaper.evidence.journal_files"}


def package_modules() -> list[str]:
    found = pkgutil.walk_packages(cni_reaper.__path__, "cni_reaper.")
    return sorted(m.name for m in found if m.name not in NOT_IMPORTED_HERE)


def loaded_by(modules: list[str]) -> dict[str, bool]:
    """In a fresh interpreter with no site (nothing a .pth file loads): whether typing was
    loaded before the package's modules were imported, and after."""
    code = (
        "import importlib, json, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "before = 'typing' in sys.modules\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps({'before': before, 'after': 'typing' in sys.modules}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True
    )
    found: dict[str, bool] = json.loads(done.stdout)
    return found


def test_no_module_of_the_package_imports_typing() -> None:
    modules = package_modules()
    assert "cni_reaper.cli" in modules and "cni_reaper.record" in modules
    assert loaded_by(modules) == {"before": False, "after": False}


def test_a_module_that_imports_typing_is_caught() -> None:
    # The check itself sees an import of typing, made the way a module would make it.
    assert loaded_by(["cni_reaper.cli", "typing"]) == {"before": False, "after": True}
