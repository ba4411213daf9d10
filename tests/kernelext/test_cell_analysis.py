"""What a cell reads and binds (pure; no kernel)."""

from __future__ import annotations

import pytest

from lumos.kernelext.cell import analyze


def test_reads_exclude_names_assigned_first_and_nested_locals() -> None:
    a = analyze("y = x + 1\nz = y * w\ndef f(p):\n    return p + q\nfor i in items:\n    total += i\n")
    assert a.reads == ["x", "w", "q", "items", "total"]
    assert set(a.assigns) == {"y", "z", "f", "i", "total"}


def test_binds_cover_imports_classes_globals_del_and_walrus() -> None:
    a = analyze("import numpy as np\nimport os.path\nfrom json import dumps as d\nclass C: pass\n"
                "def g():\n    global hidden\n    hidden = 1\ndel old\n(n := 3)\n")
    assert set(a.assigns) == {"np", "os", "d", "C", "g", "hidden", "old", "n"}
    assert a.reads == ["old"]  # `del old` needs it remotely


def test_values_leave_out_imports_loop_targets_defs_and_nested_names() -> None:
    a = analyze("import json\nfrom os import path as p\ntotal = 0\nfor i in range(3):\n    total += i\n"
                "sq = [j for j in range(3) if (w := j)]\ndef f(x):\n    global g\n    local = x\n    g = 1\n"
                "class C: pass\nwith open('f') as fh:\n    pass\ntry:\n    pass\nexcept Exception as err:\n"
                "    pass\ny: int = 3\na, (b, *c) = 1, (2, 3)\ndel old\n")
    assert a.values[:2] == ["total", "sq"] and set(a.values) == {"total", "sq", "g", "fh", "y", "a", "b", "w", "c"}
    assert {"json", "p", "i", "f", "C", "err", "old"} <= set(a.assigns) - set(a.values)
    assert "j" not in a.assigns and "local" not in a.assigns


def test_augmented_assignment_reads_the_name() -> None:
    assert analyze("count += 1").reads == ["count"]


def test_last_expression_and_semicolon() -> None:
    assert analyze("x = 1\nx + 1").last_expr
    assert not analyze("x = 1").last_expr
    assert analyze("x + 1;").quiet
    assert not analyze("x + 1").quiet


def test_syntax_error_is_raised() -> None:
    with pytest.raises(SyntaxError):
        analyze("def (:")
