"""The processes of a launch, apart from what they train: torchrun kept quiet (torchrun.py), one
launch per run folder (run_lock.py), third-party output said once (quiet.py)."""
