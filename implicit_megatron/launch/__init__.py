"""The launch of a run, in Python: what launch/pretrain.sh and launch/curriculum.sh ask before they
start anything. hostfile.py reads a DeepSpeed hostfile (each mistake one line naming the file and
line); node_shell.py checks every value and line a launch over several nodes hands another node's
shell, and writes the environment file DeepSpeed exports to each of them.
"""
