"""The stop rule of each mode of the method, made from the solver's settings; the passes themselves
are implicit.iteration's `iterate`, the same for all of them.

- Training (`solve_rule(s, training=True)`): z^0 = 0, z^s = F(z^{s-1}) without gradient until the
  batch's largest relative residual ||F(z) - z|| / ||F(z)|| is below tol (agreed over the
  data-parallel group: ranks that disagree crash ZeRO-3 on gloo and hang it on NCCL), or max_iter
  passes; per sample the F(z) of lowest residual is returned, as the released code's solver
  (torchdeq) does. tol None is a bounded phase: exactly max_iter passes.
- Evaluation (`solve_rule(s, training=False)`): the released code's rule, whose numbers the paper's
  tables report (damped passes, ||F(z) - z|| / (1e-6 + ||z||), a last undamped pass), or the training
  solver's (`implicit.eval_rule`), tested over the batch, each sequence or each position
  (`implicit.eval_stop`), up to the evaluation's cap.
- Sequential mode (`token_rule`): one token's solve, each row on its own and frozen once it stops
  (or the batch's one test, `implicit.sequential_stop`), returning its last iterate, or the released
  rule's F of the next one.
- The unrolled ablation and warm-up (`unrolled`): backpropagation through every one of max_iter passes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from implicit_megatron.config import AndersonSettings, SolverSettings
from implicit_megatron.implicit.iteration import Function, Scope, SolverStats, StopRule, eager, iterate

EVAL_SCOPES: dict[str, Scope] = {"batch": "batch", "sequence": "sample", "token": "position"}  # eval_stop -> scope


def solve_rule(s: SolverSettings, training: bool) -> StopRule:
    """The rule of a simultaneous-mode solve. Without a tolerance there is no test, hence no scope."""
    tol, cap = s.stop_tol(training), s.cap(training)
    scope: Scope = "batch" if training or tol is None else EVAL_SCOPES[s.eval_stop]
    if not training and s.eval_rule == "released":
        return StopRule(cap, tol, scope, residual="released", damping=s.damping, keep="next")
    return StopRule(cap, tol, scope, keep="lowest", anderson=s.anderson)


def token_rule(s: SolverSettings, training: bool) -> StopRule:
    """The rule of one token's solve in sequential mode."""
    tol, cap = s.stop_tol(training), s.cap(training)
    scope: Scope = "batch" if s.sequential_stop == "batch" else "sample"
    if not training and s.eval_rule == "released":
        return StopRule(cap, tol, scope, residual="released", damping=s.damping, keep="next")
    return StopRule(cap, tol, scope, keep="last")


def unrolled(f: Function, z0: torch.Tensor, s: SolverSettings) -> tuple[torch.Tensor, SolverStats]:
    """Backpropagation through every one of max_iter passes: z = F(0), then z <- (1 - damping) z
    + damping F(z). Undamped ("unrolled"), the weight-tied ablation; damped ("unrolled_damped"), the
    released warm-up. Every pass has gradient: the statistics count them as phantom passes."""
    damping = s.damping if s.gradient == "unrolled_damped" else 1.0
    solution = iterate(eager(f), z0, StopRule(s.max_iter, damping=damping, undamped_first=True))
    residual = solution.stats.residual
    converged = residual < s.tol if s.tol is not None else torch.ones_like(residual, dtype=torch.bool)
    return solution.z, SolverStats(0, residual, converged, phantom_passes=s.max_iter)


@torch.no_grad()
def solve(f: Function, z0: torch.Tensor, max_iter: int, tol: float | None,
          anderson: AndersonSettings | None = None, group: dist.ProcessGroup | None = None
          ) -> tuple[torch.Tensor, SolverStats]:
    """The training solve of a function F from z0: the last F(z), or per sample the one of lowest
    residual where it stops at `tol`, and the statistics. Every pass calls F exactly once."""
    solution = iterate(eager(f), z0, StopRule(max_iter, tol, keep="lowest", anderson=anderson), group=group)
    return solution.z, solution.stats
