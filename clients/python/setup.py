"""The build of memsvc-client (metadata in pyproject.toml): its generated stubs are written
into the wheel from the server's (stubs.py), so the repository holds them once."""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).parent))
from stubs import write_stubs


class BuildWithStubs(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "memsvc_client" / "v1"
        target.mkdir(parents=True, exist_ok=True)
        write_stubs(target)


setup(cmdclass={"build_py": BuildWithStubs})
