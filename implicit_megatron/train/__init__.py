"""Training: DeepSpeed engine set-up, learning-rate schedule, loop, checkpoints, tracking."""
