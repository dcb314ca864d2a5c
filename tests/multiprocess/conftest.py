"""The multi-process tests' one allowance: a test whose rank died of a native crash (a segfault or an
abort inside a collective's C++ thread, seen rarely in torch's gloo backend on a loaded 2-core machine
under FSDP2 x tensor parallel) runs once more, and the report shows the rerun ("R", "1 rerun").
Nothing else is retried: an assertion, a wrong value, a timeout, a rank that exited with an error or was
killed by the test itself fails at once; a crash that happens again fails too. The crashed rank's
Python stack is in the captured stderr of the first try (the launcher turns on faulthandler)."""

from __future__ import annotations

import pytest

#: WorkerFailed's message for a rank that died of a native signal (trainer/runtime/supervision.py)
NATIVE_CRASH = r"^WorkerFailed: rank \d+ \(pid \d+\) was killed by SIG(SEGV|ABRT|BUS)\b"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/multiprocess/" in item.nodeid.replace("\\", "/") or item.nodeid.startswith("multiprocess/"):
            item.add_marker(pytest.mark.flaky(reruns=1, only_rerun=[NATIVE_CRASH]))
