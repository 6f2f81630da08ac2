"""The loop's step function names no concern outside its hooks (issue 78): Trainer._fit and
train_step reach the stall watch, reporting, preemption, guards, validation and checkpoints only
through `self.hooks`."""

from __future__ import annotations

import ast
import inspect

from implicit_megatron.train import loop

CONCERNS = ("stall", "reporter", "preemption", "loss_jump", "phases", "checkpointer", "interval", "tracker",
            "nonfinite", "validation", "evaluate", "save", "timers")


def attributes_of_self(function) -> set[str]:
    tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(function)))
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"}


def test_the_loop_and_the_step_reach_concerns_only_through_hooks():
    loop_names = attributes_of_self(loop.Trainer._fit) - {"resume", "steps_to_train", "log"}  # the start
    step_names = attributes_of_self(loop.Trainer.train_step)
    for names in (loop_names, step_names):
        assert not [n for n in names if n.startswith(CONCERNS)], names
    assert "hooks" in loop_names and "step" in step_names
