"""python -m implicit_megatron.launch [CONFIG] [key=value ...]: one launch (launch/pretrain.sh's).

The stop signals are taken before anything else is imported: a stop while the launch imports its
config reader (a second or more on a busy node) is then a stop asked before the ranks, not a death
without a word.
"""

import sys

from implicit_megatron.run_control import install_stop_signals

signals = install_stop_signals(interrupt=False)  # Ctrl-C: once the ranks run (before, it ends the launch)

from implicit_megatron.launch.pretrain import main  # noqa: E402 - after the signals are taken

sys.exit(main(signals=signals))
