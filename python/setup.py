"""Records, in the built package, the source tree it was built from (a
clone of the repository): the package builds its Go binaries from there
with Go when none are given (durabletrain/_binaries.py). pip builds a local
directory in place, so this is the clone's path."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self):
        super().run()
        src = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        if os.path.isfile(os.path.join(src, "go.mod")) and os.path.isdir(os.path.join(src, "cmd", "worker")):
            with open(os.path.join(self.build_lib, "durabletrain", "_source.txt"), "w") as f:
                f.write(src)


setup(cmdclass={"build_py": BuildPy})
