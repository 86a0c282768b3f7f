"""Build step of the wheel: the top-level ``policies/`` (the source users edit) ships inside the package as
``fcd_secure/policies/``, where :func:`fcd_secure.data.paths.policy_dir` finds it once installed. Everything else
is declared in ``pyproject.toml``."""

from pathlib import Path
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithPolicies(build_py):
    """``build_py`` that also copies ``policies/*.toml`` and its README into ``<build>/fcd_secure/policies/``."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "fcd_secure" / "policies"
        target.mkdir(parents=True, exist_ok=True)
        for src in sorted((ROOT / "policies").glob("*.toml")) + [ROOT / "policies" / "README.md"]:
            shutil.copy2(src, target / src.name)


setup(cmdclass={"build_py": BuildPyWithPolicies})
