"""Builds libproteus.so (shim/*.c) into the package as part of `pip install`."""

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # proteus_rewrite.inject.shim needs nothing beyond the standard library

from proteus_rewrite.inject import shim  # noqa: E402


class BuildPyWithShim(build_py):
    def run(self):
        super().run()
        root = HERE if getattr(self, "editable_mode", False) else Path(self.build_lib)
        shim.build(root / "proteus_rewrite" / "_shim" / shim.SHIM_NAME, HERE / "shim")


class PlatformWheel(bdist_wheel):
    """The shim is native code for this platform, though for no particular Python: a wheel
    tagged py3-none-<platform>, not one that claims to run anywhere."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])


setup(cmdclass={"build_py": BuildPyWithShim, "bdist_wheel": PlatformWheel})
