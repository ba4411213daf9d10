"""Task kinds, retry policies, error kinds, task states and object states are compared
through the enums of ``protocol/vocab.py`` (``m.TaskKind.ACTOR_TASK``,
``m.TaskState.RUNNING``), never as the bare ints and strings they travel as: a walk over
the sources finds none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
_STATES = "SUBMITTED|PENDING_ARGS|SCHEDULED|RETRIED|RUNNING|FINISHED|FAILED|CANCELLED"
_ERRORS = "requeue|cancelled|actor_died|exiting"

#: What each pattern finds -> the pattern (matched per line, and across lines for calls).
MAGIC = {
    "task kind as a number or name": re.compile(r"\b(spec|template|running|task\.spec)\.kind\s*(==|!=)\s*[0-2]\b"
                                        r"|kind not in \(0, 1, 2\)|\"ACTOR_TASK\"\)\[\w+\.kind\]"
                                        r"|\"type\": \"(NORMAL_TASK|ACTOR_TASK|ACTOR_CREATION_TASK)\""),
    "object state as a number": re.compile(r"\bst(atus)?\.status\s*(==|!=)\s*[0-3]\b|ObjectStatus\([0-3],"),
    "retry policy as a number": re.compile(r"\.retry_exceptions\s*(==|!=)\s*[0-2]\b|retry_kind, retry_types = [0-2]"),
    "error kind as a string": re.compile(rf'error_kind\s*(==|!=|=)\s*"|_system_reply\([^()]*?,\s*"({_ERRORS})"'),
    "task state as a string": re.compile(
        rf'(record_event|_events\.append|events\.append|TaskEvent)\(\(?[^()]*?"({_STATES})"'
        rf'|state = "({_STATES})" if|\b(t|task|rec|ev)\.state\s*(==|!=)\s*"({_STATES})"'
        rf'|\b(t|task)\.state (not )?in \("({_STATES})"'),
}


def _sources() -> list[Path]:
    files = sorted((ROOT / "runtime").rglob("*.py")) + sorted((ROOT / "dashboard").rglob("*.py"))
    return [p for p in files if p.name != "vocab.py"]


def test_no_magic_task_kinds_policies_error_kinds_or_states():
    found = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for what, pattern in MAGIC.items():
            for hit in pattern.finditer(text):
                line = text.count("\n", 0, hit.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {what}: {hit.group(0)[:80]!r}")
    assert not found, "compare through lumos._private.protocol.vocab's enums:\n" + "\n".join(found)


def test_the_walk_finds_each_kind_of_magic_value(tmp_path):
    samples = {
        "task kind as a number or name": "if task.spec.kind == 2:",
        "retry policy as a number": "if spec.retry_exceptions == 1:",
        "object state as a number": "if st.status != 1:",
        "error kind as a string": 'return self._system_reply(spec,\n    "why", "actor_died", start)',
        "task state as a string": 'self._events.append((tid, 0, "SUBMITTED", now))',
    }
    for what, code in samples.items():
        assert MAGIC[what].search(code), what
    assert not any(p.search("if job.state == \"RUNNING\":") for p in MAGIC.values())  # a job's state
