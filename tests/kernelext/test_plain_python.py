"""Outside notebooks: ``import lumos`` pulls in no IPython; ``lumos.progress`` is a text bar."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.conftest import TEST_CONFIG

SCRIPT = textwrap.dedent(f"""
    import sys
    import lumos
    ctx = lumos.init(num_cpus=2, _system_config={TEST_CONFIG!r})
    session = ctx.address_info["session_dir"]

    @lumos.remote
    def f(x):
        print("worker says", x)
        return x * 2

    refs = [f.remote(i) for i in range(3)]
    p = lumos.progress(refs, "work")
    assert p.wait(30)
    assert lumos.get(refs, timeout=30) == [0, 2, 4]
    html = refs[0]._repr_html_()
    assert "ready" in html, html
    lumos.shutdown()
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("IPython", "ipywidgets", "ipykernel")
                    or m.startswith("lumos.kernelext"))
    print("LEAKED", leaked)
    print("SESSION", session)
""")


def test_plain_import_never_loads_ipython_and_progress_is_a_text_bar() -> None:
    env = dict(os.environ)
    env.pop("LUMOS_ADDRESS", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=90, env=env)
    assert p.returncode == 0, p.stderr
    assert "LEAKED []" in p.stdout, p.stdout
    assert "work: [" in p.stderr and "3/3" in p.stderr, p.stderr


def test_progress_rejects_bad_input() -> None:
    import pytest

    import lumos
    with pytest.raises(TypeError, match="ObjectRef"):
        lumos.progress([1, 2])
    with pytest.raises(TypeError, match="ObjectRef"):
        lumos.progress("nope")  # type: ignore[arg-type]
