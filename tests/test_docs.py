"""The README and the docs name only files that exist, and describe every operator of the table.

Checked: a backticked path that starts in this repository (``src/``, ``tests/``, ``docs/``, ``benchmarks/``,
``examples/``, ``.ci/``, or a package folder such as ``reference/``, ``csrc/``, ``ops/``) must exist relative
to the repository, the package, its ``backends/`` or the C sources (the docs name files by their shortest
unambiguous path); a bare source file name (``nn.py``, ``mx.h``, ``test_layouts.py``) must be a file of the
repository. Upstream sources the docs cite (CANN's ``op_kernel/...``, transformers', torchao's) are not ours.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from swiglu_ops.ops.table import PUBLIC

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "swiglu_ops"
BASES = [
    ROOT,
    PACKAGE,
    PACKAGE / "backends",
    PACKAGE / "backends" / "cpu",
    PACKAGE / "backends" / "cpu" / "csrc",
]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Files of other projects that the docs cite as sources, by their path there (CANN's hicann/ops-nn, PyTorch).
UPSTREAM = ("docs/aclnn", "examples/arch35/", "tests/assets/golden.py", "swiglu_group_grad_simt.h",
            "test_scaled_matmul_cuda.py")  # fmt: skip
_TICKED = re.compile(r"`([^`\s]+)`")


_LOCAL = ("src/", "tests/", "docs/", "benchmarks/", "examples/", ".ci/", "numerics/", "ops/", "backends/",
          "reference/", "cpu/", "triton/", "csrc/", "training/", "integrations/")  # fmt: skip
_CODE = (".py", ".h", ".c", ".sh")


def named_paths(text: str) -> set[str]:
    paths = set()
    for word in _TICKED.findall(text):
        word = word.rstrip(".,:;)").split("::")[0]
        if "*" in word or "<" in word or "{" in word:
            continue
        if word.startswith(UPSTREAM):
            continue
        if word.startswith(_LOCAL) or ("/" not in word and word.endswith(_CODE)):
            paths.add(word.rstrip("/"))
    return paths


_ALL_FILES = None


def exists(path: str) -> bool:
    global _ALL_FILES
    if "/" not in path:
        if _ALL_FILES is None:
            _ALL_FILES = {p.name for p in ROOT.rglob("*") if ".git" not in p.parts}
        return path in _ALL_FILES
    return any((base / path).exists() for base in BASES)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_name_only_files_that_exist(doc):
    missing = sorted(p for p in named_paths(doc.read_text()) if not exists(p))
    assert missing == [], f"{doc.name} names files that do not exist: {missing}"


def test_the_checker_sees_a_missing_file():
    assert named_paths("see `src/swiglu_ops/nowhere.py` and `docs/design.md`") == {
        "src/swiglu_ops/nowhere.py",
        "docs/design.md",
    }
    assert not exists("src/swiglu_ops/nowhere.py") and exists("docs/design.md") and exists("ops/table.py")
    assert named_paths("`_api.py`, `op_kernel/arch35/x.h`, `swiglu_ops.ops.api`") == {"_api.py"}
    assert not exists("_api.py") and exists("table.py")


def test_readme_and_operator_docs_describe_every_operator():
    readme = (ROOT / "README.md").read_text()
    operators = (ROOT / "docs" / "operators.md").read_text()
    for op in PUBLIC:
        assert op.name in readme, op.name
        assert op.cann in operators, op.cann
