"""A launch that cannot go on as asked, for a reason the user can fix."""


class RunRefused(ValueError):
    """Refused before training changes anything (a changed data order on resume, a checkpoint that
    does not fit the model, phases that would move trained steps, ...). The rank entry prints its
    message once, from rank 0, and every rank exits with status 2: no traceback."""


REFUSED = 2  # the exit status of a refused launch (as of a config error before any process starts)
