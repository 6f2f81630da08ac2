"""The launch of a run, in Python: launch/pretrain.sh and launch/curriculum.sh are its front doors.

pretrain.py runs one launch in order (settings, world, config, launcher, supervision);
curriculum.py runs a curriculum's phases as launches of their own. Every part is a module of one
job: environment.py, world.py, hostfile.py, node_shell.py, command.py, supervisor.py.
"""
