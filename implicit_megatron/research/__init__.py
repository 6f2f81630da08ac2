"""The library code of the research sweeps (tools/research/): running a sweep's training launches
with progress, and the results pages of docs/results/ (tables, intervals over seeds, plots).

Nothing of the training or evaluation path imports it; it imports them.
"""
