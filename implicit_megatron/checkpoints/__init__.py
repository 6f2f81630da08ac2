"""A run's checkpoint files, for everyone who reads or writes them: training, export, evaluation
and the tools. It knows the on-disk layout (tags, `latest`, manifests, each rank's files), whether a
tag is complete (`integrity`), how to read checkpoint pickles without running code (`safe_load`),
how to get full fp32 weights out of any ZeRO layout (`weights`) and how to convert a tag to
DeepSpeed's universal format (`universal`). It imports the config and nothing of `train`: which
checkpoint a launch starts from is training's decision (train/handoff.py).
"""
