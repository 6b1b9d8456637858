"""Build kvstore's optional C extension; all other metadata is in setup.cfg.

The extension only speeds kvstore up (see kvstore/_backend.py): when it cannot
be compiled (no compiler, no zlib headers), the build warns and the install
goes on with the pure-Python code.
"""

from __future__ import annotations

import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SPEEDUPS = Extension(
    "kvstore._speedups",
    sources=["kvstore/_speedups.c"],
    libraries=["z"],
    optional=True,
)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the C extension does not build."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure means "use pure Python"
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - compiler missing, header missing, ...
            self._skip(exc)

    @staticmethod
    def _skip(exc: Exception) -> None:
        warnings.warn(
            f"kvstore: the C extension was not built ({exc}); kvstore will use its "
            "pure-Python code, which is correct but several times slower",
            stacklevel=2,
        )


setup(ext_modules=[SPEEDUPS], cmdclass={"build_ext": OptionalBuildExt})
