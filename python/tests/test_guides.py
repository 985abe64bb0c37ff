"""The Python in the README and the guides: the README's example runs as
written against a real local cluster, and every Python block of the guides
is valid Python (the shell and JSON blocks are checked by the Go tests)."""

import ast
import glob
import os
import re
import textwrap

from conftest import REPO

BLOCK = re.compile(r"```python\n(.*?)^\s*```", re.S | re.M)


def guides():
    for path in [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))):
        with open(path) as f:
            yield path, f.read()


def test_every_python_block_of_the_guides_parses():
    n = 0
    for path, text in guides():
        for block in BLOCK.findall(text):
            n += 1
            try:
                ast.parse(textwrap.dedent(block))
            except SyntaxError as e:
                raise AssertionError("%s: a Python block that does not parse (%s):\n%s" % (path, e, block))
    assert n >= 3


def test_the_readme_example_trains(cluster, capsys):
    text = dict(guides())[os.path.join(REPO, "README.md")]
    examples = [b for b in BLOCK.findall(text) if ".fit()" in b]
    assert examples, "the README shows no fit()"
    for block in examples:
        scope = {"__name__": "readme_example"}
        exec(compile(block, "README.md", "exec"), scope)
        result = scope["result"]
        assert result.error is None, result.error
        assert result.metrics["loss"] == 1.0 / 3 and result.metrics["epoch"] == 2, result.metrics
    assert "'loss'" in capsys.readouterr().out
