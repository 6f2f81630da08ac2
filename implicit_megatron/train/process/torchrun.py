"""torchrun for launch/pretrain.sh on machines without GPUs, without its wall of text.

    python -m implicit_megatron.train.process.torchrun [torchrun's arguments]

It runs torch.distributed.run itself. When a rank fails, torchrun prints a traceback of its own
and a table of every rank's exit around the one line that matters; a rank that refuses to go on
(a changed data order, a checkpoint that does not fit: exit status 2) has said why in one line
already. Here the launcher's own messages are dropped and its exit status is the failed rank's: 2
for a refusal and 3 for ranks that ended because their launch was killed (nothing more is printed),
otherwise one line naming the rank, its exit status and where to look. SIGTERM still reaches every
rank (they save and stop); the launcher then exits 128 + the signal, which the launch reads with
the run's end that rank 0 wrote (implicit_megatron.run_control.RunEnd).
"""

from __future__ import annotations

import logging
import sys

from implicit_megatron.errors import ORPHANED, REFUSED


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    for name in [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")]:
        logging.getLogger(name).setLevel(logging.CRITICAL)  # each module's logger has its own level
    args = get_args_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        code = failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
        if code not in (REFUSED, ORPHANED):  # both said why in one line already
            print(f"torchrun: rank {rank} failed with exit status {failure.exitcode} (its output above says why)",
                  file=sys.stderr, flush=True)
        return code
    except SignalException as err:
        return 128 + int(err.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
