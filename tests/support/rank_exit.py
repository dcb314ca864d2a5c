"""How a rank's end shows on stderr when it goes wrong (shared by the multi-process tests)."""

#: the gloo abort at interpreter exit, and trainer/runtime/distributed.py's warning that a destroyed process
#: group was still referenced as the rank ended (its threads then live into the finalization)
PROBLEMS = ("terminate called", "SIGABRT", "still referenced as this rank ends")


def assert_ranks_ended_cleanly(stderr: str) -> None:
    """No rank aborted at exit and none ended with its process group still alive."""
    found = [line for line in stderr.splitlines() if any(problem in line for problem in PROBLEMS)]
    assert not found, f"a rank did not end cleanly: {found}"
