"""python -m implicit_megatron.launch [CONFIG] [key=value ...]: one launch (launch/pretrain.sh's)."""

import sys

from implicit_megatron.launch.pretrain import main

sys.exit(main())
