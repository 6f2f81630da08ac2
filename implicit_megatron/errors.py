"""A launch that cannot go on as asked, for a reason the user can fix."""


class RunRefused(ValueError):
    """Refused before training changes anything (a changed data order on resume, a checkpoint that
    does not fit the model, phases that would move trained steps, ...). The rank entry prints its
    message once, from rank 0, and every rank exits with status 2: no traceback."""


class RunStopped(RuntimeError):
    """A run that cannot go on, for a cause its message says in full (a save into a full disk,
    non-finite losses in a row, a conversion that failed): the rank entry prints it once, from rank
    0, without a traceback, and every rank exits with status 1."""


REFUSED = 2  # the exit status of a refused launch (as of a config error before any process starts)
ORPHANED = 3  # the exit status of a rank that ended because its launch is gone (a kill -9): said once, by rank 0


def first_line(err: BaseException) -> str:
    """A foreign error in one line for a message of ours: its type and the first line of its text."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:160]}"
