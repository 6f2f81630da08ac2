"""A mutation check: small breaks of the core, each of which the tests that guard it must catch.

    python tools/dev/mutation_check.py              # every break (5-10 minutes on 2 CPU cores)
    python tools/dev/mutation_check.py --only solver-stop-rule,phantom-damping
    python tools/dev/mutation_check.py --list

A break is one edit of one file: an exact snippet of the source replaced by a subtly wrong one (a
comparison turned, a step skipped, a check that always passes). For each, the repository is copied
(the files git tracks, and the new ones it does not ignore) and the break applied to the copy, never
to the working tree; the tests named for it run there and must fail. A table says, per break,
caught or SURVIVED and how long its tests took; the exit status is 1 when one survived or no longer
applies (its snippet is gone: update it here). tests/unit/tools/test_mutation_check.py checks on
every commit that every break still applies; running them is this tool's, not the suite's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Break:
    name: str
    path: str  # relative to the repository
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # pytest paths or node ids
    what: str


MIXER = "implicit_megatron/models/mamba2/mixer.py"
KERNEL_TIER = "tests/kernels/"  # mamba_ssm's Triton kernels on CPU
METHOD_TEST = ("tests/unit/implicit/test_method_once.py::"
               "test_a_training_forward_is_the_papers_solve_then_damped_phantom_steps")

BREAKS = [
    Break("solver-stop-rule", "implicit_megatron/implicit/iteration.py",
          "                return agreed_max(self.r.masked_fill(~active, 0), group_or_none) < tol",
          "                return agreed_max(self.r.masked_fill(~active, 0), group_or_none) > tol",
          ("tests/unit/implicit/test_solver.py",), "the free phase stops when the residual is above the tolerance"),
    Break("row-stop", "implicit_megatron/implicit/iteration.py",
          "            self.active = self.active & ~(measure.r < tol)",
          "            self.active = self.active & ~(measure.r.masked_fill(~self.active, 0).max() < tol)",
          ("tests/unit/implicit/test_padded_batches.py",),
          "rows (sequential mode, eval_stop=sequence) stop at the batch's residual, not each at its own"),
    Break("released-pooled-test", "implicit_megatron/implicit/iteration.py",
          "        return bool(pooled[0].sqrt() / (1e-6 + pooled[1].sqrt()) < tol)",
          "        return bool((self.r.masked_fill(~active, 0).max() < tol).item())",
          ("tests/unit/hf/test_import_released.py",),
          "the released rule's batch test on the largest sample's ratio, not on the batch's pooled norms"),
    Break("released-last-pass", "implicit_megatron/implicit/iteration.py",
          "        self.out = _where(left, f_z, cast(torch.Tensor, self.out))",
          "        self.out = cast(torch.Tensor, self.out)",
          ("tests/unit/hf/test_import_released.py",), "the released rule's last undamped pass is dropped"),
    Break("phantom-damping", "implicit_megatron/implicit/damping.py",
          "return f_z if damping == 1.0 else (1.0 - damping) * z + damping * f_z",
          "return f_z if damping == 1.0 else damping * z + (1.0 - damping) * f_z",
          ("tests/unit/implicit/test_phantom.py",), "the phantom step's damping swapped (lambda <-> 1 - lambda)"),
    Break("damped-update-eager", "implicit_megatron/implicit/damping.py",
          "return f_z if damping == 1.0 else (1.0 - damping) * z + damping * f_z",
          "return f_z if damping == 1.0 else (1.0 - damping) * z + damping * f_z.detach()",
          (METHOD_TEST + "[mamba2-eager-(4+2)]",),
          "the damped update passes no gradient through F, caught with the passes run eagerly"),
    Break("damped-update-graphed", "implicit_megatron/implicit/damping.py",
          "return f_z if damping == 1.0 else (1.0 - damping) * z + damping * f_z",
          "return f_z if damping == 1.0 else (1.0 - damping) * z + damping * f_z.detach()",
          (METHOD_TEST + "[mamba2-graphed-(4+2)]",),
          "the same break, caught with the passes replayed from (emulated) CUDA graphs"),
    Break("stop-rule-graphed", "implicit_megatron/implicit/iteration.py",
          "                return agreed_max(self.r.masked_fill(~active, 0), group_or_none) < tol",
          "                return agreed_max(self.r.masked_fill(~active, 0), group_or_none) > tol",
          (METHOD_TEST + "[llama-graphed-free]",), "the free phase's stop rule turned, caught with graphed passes"),
    Break("injection-off", "implicit_megatron/implicit/core.py",
          "        inj = self.injection(x) if self.injection is not None else None\n        z0 = torch.zeros_like(x)",
          "        inj = None\n        z0 = torch.zeros_like(x)",
          ("tests/unit/hf/test_import_released.py",), "the method ignores the input injection (eager and graphed)"),
    Break("ssd-documents", "implicit_megatron/models/mamba2/ssd.py",
          "    keep = _lower(q, x.device) if one_doc is None else one_doc & _lower(q, x.device)",
          "    keep = _lower(q, x.device)",
          ("tests/unit/models/mamba2/test_ssd_scan.py",), "state crosses a document boundary inside an SSD chunk"),
    Break("ssd-one-chunk", "implicit_megatron/models/mamba2/ssd.py",
          "    if c > 1 or initial_state is not None or return_final_state:",
          "    if initial_state is not None or return_final_state:",
          ("tests/unit/models/mamba2/test_ssd_scan.py",), "the SSD skips the states between its several chunks"),
    Break("conv-crosses-documents", "implicit_megatron/models/mamba2/mixer.py",
          "        if seq_idx is not None:\n            sp = F.pad(seq_idx, (k - 1, 0))",
          "        if False:\n            sp = F.pad(seq_idx, (k - 1, 0))",
          ("tests/unit/models/mamba2/test_mamba2_mixer.py",), "the causal conv's taps reach into an earlier document"),
    Break("conv-taps-reversed", "implicit_megatron/models/mamba2/mixer.py",
          "        taps = [weight[:, 0, j] * xp[:, j:j + t] for j in range(k)]",
          "        taps = [weight[:, 0, k - 1 - j] * xp[:, j:j + t] for j in range(k)]",
          ("tests/unit/models/mamba2/test_mamba2_mixer.py",), "the causal conv applies its taps in reverse order"),
    Break("fused-b-c-swapped", MIXER,
          "fused.mamba_chunk_scan_combined(x, dt, A, B, C, self.chunk_size",
          "fused.mamba_chunk_scan_combined(x, dt, A, C, B, self.chunk_size",
          (KERNEL_TIER + "test_mixer_kernels.py",), "the chunk-scan kernel gets B and C swapped"),
    Break("fused-seq-idx-dropped", MIXER,
          "chunk_size=self.chunk_size, seq_idx=seq_idx, activation=\"silu\",",
          "chunk_size=self.chunk_size, seq_idx=None, activation=\"silu\",",
          (KERNEL_TIER + "test_mixer_kernels.py",), "the split conv + scan kernel runs packed documents as one"),
    Break("fused-d-shape", MIXER, "self.dt_bias, A, D=self._D(),", "self.dt_bias, A, D=self.D,",
          (KERNEL_TIER + "test_mixer_kernels.py",), "the split conv + scan kernel gets D per channel flat, "
          "(d_inner,) for (nheads, headdim)"),
    Break("fused-dt-bias-twice", MIXER, "ssm, x, dt[..., None].expand(-1, -1, p),",
          "ssm, x, (dt + self.dt_bias)[..., None].expand(-1, -1, p),",
          (KERNEL_TIER + "test_generation_kernels.py",), "a generation step adds dt_bias to dt before the kernel does"),
    Break("fused-headdim-dropped", MIXER, "headdim=None if self.D_has_hdim else self.headdim,", "headdim=None,",
          (KERNEL_TIER + "test_mixer_kernels.py",),
          "the split kernel is not told the head size (the former stand-in guessed it from D)"),
    Break("fused-dt-bias-no-gradient", MIXER, "self.conv1d.bias, self.dt_bias, A, D=self._D(),",
          "self.conv1d.bias, self.dt_bias.detach(), A, D=self._D(),",
          (KERNEL_TIER + "test_mixer_kernels.py",), "dt_bias learns nothing on the split kernel's path (its "
          "forward is right: the former stand-ins, checked forward only, missed it)"),
    Break("weight-norm", "implicit_megatron/implicit/weight_norm.py",
          "    return torch._weight_norm(v, g, 0)", "    return g * v / v.norm()",
          ("tests/unit/implicit/test_weight_norm.py",), "weight norm over the whole tensor, not each row"),
    Break("graph-input-copy", "implicit_megatron/implicit/graphs.py",
          "        if z.data_ptr() != graphs.z.data_ptr():\n            graphs.z.copy_(z)",
          "        if False:\n            graphs.z.copy_(z)",
          ("tests/unit/implicit/test_cuda_graphs.py::test_graphed_training_equals_eager",),
          "the graphed passes with gradient replay on the iterate of their capture, not this forward's"),
    Break("graph-gradient-clone", "implicit_megatron/implicit/graphs.py",
          "return (None, *(None if g is None else g.clone() for g in graphs.grads))",
          "return (None, *graphs.grads)",
          ("tests/unit/implicit/test_cuda_graphs.py::test_a_gradient_kept_by_a_hook_is_not_overwritten_by_the_next_"
           "micro_batch",),
          "the graphed backward hands autograd its own buffers, which the next micro-batch overwrites"),
    Break("manifest-size", "implicit_megatron/checkpoints/integrity.py",
          '        if path.stat().st_size != record["size"]:', '        if path.stat().st_size < 0:',
          ("tests/unit/checkpoints/test_integrity.py",), "the manifest's sizes are not compared"),
    Break("resume-position", "implicit_megatron/train/checkpointer.py",
          "                    data.load_state_dict(state)", "                    pass",
          ("tests/distributed/test_training.py::test_killed_runs_resume_exactly",),
          "a resume starts the data from the beginning"),
    Break("phase-launch-overrides", "implicit_megatron/config/reading.py",
          "            cfg.distributed.zero_stage = phase.zero_stage", "            pass",
          ("tests/unit/config/test_config.py",), "a phase launched on its own keeps the run's ZeRO stage"),
    Break("shard-tokenizer-check", "data_pipeline/shard_tokenizer.py",
          '    return "tokenizer_identity" in record and record["tokenizer_identity"] == ours.identity()',
          "    return True", ("tests/unit/data_pipeline/test_shard_tokenizer.py",),
          "shards of another tokenizer are accepted"),
    Break("compile-no-op", "implicit_megatron/models/backbone.py",
          "            layer.compile(dynamic=False, backend=backend)", "            pass",
          ("tests/unit/implicit/test_compile.py",), "train.compile compiles nothing"),
    Break("import-zero-injection", "implicit_megatron/hf/import_explicit.py",
          "    model.load_state_dict({**expected, **state}, strict=True)",
          "    model.load_state_dict({**{k: v.zero_() if k.startswith('core.injection.proj') else v "
          "for k, v in expected.items()}, **state}, strict=True)",
          ("tests/unit/hf/test_import_weights.py",), "an import into an implicit config zeroes the injection"),
    Break("released-norm-eps", "implicit_megatron/hf/released.py",
          '"model.norm_eps=1e-05"', '"model.norm_eps=1e-06"',
          ("tests/unit/hf/test_import_released.py",), "the released models imported with another RMSNorm epsilon"),
    Break("plot-one-run", "implicit_megatron/evaluation/run_plot.py",
          "    for index, run in enumerate(runs):\n        for key, validation in keys:",
          "    for index, run in enumerate(runs[:1]):\n        for key, validation in keys:",
          ("tests/unit/tools/test_plot_run.py",), "plot_run draws only the first run"),
    Break("lm-eval-check-repeated", "implicit_megatron/evaluation/lm_eval_data.py",
          "@functools.lru_cache(maxsize=4)\ndef checked_tasks(", "@functools.lru_cache(maxsize=0)\ndef checked_tasks(",
          ("tests/unit/evaluation/test_lm_eval_data.py",), "a passed lm-eval data check is looked up again"),
    Break("symlinks-vouched", "implicit_megatron/utils/own_files.py",
          "            if path.is_symlink():\n                if not accepted(path):",
          "            if False:\n                if not accepted(path):",
          ("tests/unit/checkpoints/test_universal.py",), "a link inside a tag is taken as its own file"),
    Break("stray-tag-files", "implicit_megatron/checkpoints/integrity.py",
          "        if entry.name in own or (entry.name in (UNIVERSAL, UNIVERSAL_TMP) and entry.is_dir()) or \\",
          "        if True or (entry.name in (UNIVERSAL, UNIVERSAL_TMP) and entry.is_dir()) or \\",
          ("tests/unit/checkpoints/test_tag_files.py",), "a file planted beside a tag's own is taken as its own"),
    Break("deepspeed-full-unpickler", "implicit_megatron/checkpoints/safe_load.py",
          "    torch.load = guarded_load\n    try:", "    torch.load = _torch_load\n    try:",
          ("tests/unit/checkpoints/test_tag_files.py",), "DeepSpeed's loaders unpickle in full what they pick"),
    Break("auto-classes-unregistered", "implicit_megatron/__init__.py",
          "auto.install()  # transformers' Auto classes", "None  # transformers' Auto classes",
          ("tests/unit/hf/test_auto_classes.py",), "transformers runs an export's own modeling file"),
    Break("stall-watch-counts-pauses", "implicit_megatron/train/callbacks/stall.py",
          "                fresh = now  # this process was stopped",
          "                tick = now  # this process was stopped",
          ("tests/unit/train/callbacks/test_stall.py::test_a_paused_job_and_slow_steps_go_on_a_silent_rank_is_named",
           "tests/unit/train/callbacks/test_stall.py::test_a_paused_job_is_not_counted_even_while_its_store_host_is_"
           "still_waking"),
          "a pause of the whole job (Ctrl-Z, a SLURM suspend) ends it as a stall"),
    Break("stall-watch-deaf", "implicit_megatron/train/callbacks/stall.py",
          "            if not watching or said != self.said:", "            if True:",
          ("tests/unit/train/callbacks/test_stall.py",), "a silent rank is never named: the job waits for ever"),
    Break("stall-watch-skips-start-up", "implicit_megatron/train/callbacks/stall.py",
          "            if now - max(self.heard, fresh) > self.limit:",
          '            if now - max(self.heard, fresh) > self.limit and not self.what.startswith("start-up"):',
          ("tests/unit/train/callbacks/test_stall.py::test_a_rank_that_never_comes_is_named_during_start_up",),
          "a rank silent during the start-up (a resume's checkpoint load) hangs the job"),
    Break("stall-watch-leaves-a-call", "implicit_megatron/train/callbacks/stall.py",
          "            conn.shutdown(socket.SHUT_RD)", "            pass",
          ("tests/unit/train/callbacks/test_stall_at_exit.py::test_a_rank_that_ends_while_the_store_host_is_stopped_exits_0",),
          "a store call left in flight at the end returns into a finalizing interpreter: a finished run exits 134"),
    Break("stall-watch-blames-a-deaf-store", "implicit_megatron/train/callbacks/stall.py",
          "            now = max(self.reached, fresh)", "            now = now",
          ("tests/unit/train/callbacks/test_stall_at_exit.py::test_a_store_that_stops_answering_stops_the_count_of_the_"
           "next_rank",), "a suspended store host makes a healthy rank look silent: the job is ended"),
    Break("launch-asks-no-stop", "implicit_megatron/launch/supervisor.py",
          "        StopRequest(STOP_SIGNALS[signum]).write(folder)", "        pass",
          ("tests/unit/launch/test_stop_protocol.py",), "a stop signal to the launch never reaches the ranks"),
    Break("launch-ignores-run-end", "implicit_megatron/launch/supervisor.py",
          "    end = RunEnd.read(folder)", "    end = None",
          ("tests/unit/launch/test_stop_protocol.py",),
          "a graceful stop taken for a finish: a curriculum starts its next phase, a SLURM job does not requeue"),
    Break("rank-deaf-to-the-launch", "implicit_megatron/train/callbacks/preemption.py",
          "            request = StopRequest.read(self.folder)", "            request = None",
          ("tests/unit/train/test_stopping.py",), "rank 0 never reads the launch's stop request: a Ctrl-C trains on"),
    Break("callbacks-in-given-order", "implicit_megatron/train/callbacks/__init__.py",
          "        self.callbacks = sorted(callbacks, key=lambda callback: -callback.priority)",
          "        self.callbacks = list(callbacks)",
          ("tests/unit/train/callbacks/test_hooks.py",), "the loop's concerns run in the order they were registered"),
    Break("loss-jump-window-forgotten", "implicit_megatron/train/callbacks/loss_jump.py",
          "            self.recent.extend(float(v) for v in saved)", "            pass",
          ("tests/unit/train/callbacks/test_hooks.py",),
          "a resumed launch saves a jumped loss: its guard has no window before its first checkpoint"),
    Break("held-action-taken", "implicit_megatron/train/callbacks/__init__.py",
          "        return bool(getattr(self, action)) and action not in self.held",
          "        return bool(getattr(self, action))",
          ("tests/unit/train/callbacks/test_hooks.py",), "a non-finite step's weights are validated and saved"),
    Break("names-unchecked", "implicit_megatron/utils/names.py",
          "    if not SAFE_NAME.fullmatch(value):", "    if not value.strip():",
          ("tests/unit/config/test_received_configs.py",), "a phase or run name with '/' or ';' becomes a path"),
    Break("foreign-tag", "implicit_megatron/train/handoff.py",
          "    if recorded_run is not None and recorded_run != run_id:",
          "    if recorded_run is None and recorded_run != run_id:",
          ("tests/unit/train/test_handoff.py",), "a tag another run saved is resumed from"),
    Break("nonfinite-weights", "implicit_megatron/checkpoints/weights_file.py",
          "    if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):",
          "    if not tensor.is_floating_point() or bool(torch.isfinite(tensor).any()):",
          ("tests/unit/checkpoints/test_integrity.py", "tests/unit/checkpoints/test_weights_file.py"),
          "weights with a few NaN count as finite"),
    Break("divergence-not-held", "implicit_megatron/checkpoints/layout.py",
          "        if old != best and old.name not in held:", "        if old != best:",
          ("tests/unit/train/callbacks/test_guards.py",), "pruning deletes the checkpoint a diverging run names"),
    Break("graphs-unverified", "implicit_megatron/implicit/graph_runtime.py",
          "        if key not in self._unverified:\n            return",
          "        if True:\n            return",
          ("tests/unit/implicit/test_graph_runtime.py::test_a_graph_that_computes_something_else_is_caught_at_its_first_use",),
          "captured graphs are used without their first-use check"),
    Break("eviction-drops-norms", "implicit_megatron/implicit/graph_runtime.py",
          "                self.cache = {k: g for k, g in self.cache.items() if k == WEIGHTS_GRAPH_KEY}",
          "                self.cache = {}",
          ("tests/unit/implicit/test_graph_runtime.py::test_graphs_evicted_for_many_shapes_never_read_stale_weights",),
          "evicting shapes' graphs drops the weights' graph the solver graphs read"),
    Break("capture-stream", "implicit_megatron/implicit/graphs.py",
          "    finally:\n        torch.cuda.set_stream(stream)", "    finally:\n        pass",
          ("tests/unit/implicit/test_graph_runtime.py::test_a_capture_that_fails_at_its_end_leaves_the_run_on_its_own_stream",),
          "a failed capture leaves the run on the capture's side stream"),
    Break("index-cache-key", "data_pipeline/packed.py",
          "        while block := handle.read(chunk):\n            sha.update(block)",
          "        sha.update(handle.read(1 << 16))",
          ("tests/unit/data_pipeline/test_packed.py",), "the index cache is keyed by the start of the .idx only"),
    Break("progress-at-the-end", "implicit_megatron/research/train_progress.py",
          "        if self.shown_at is None or step >= total or now - self.shown_at >= self.every:",
          "        if step >= total:",
          ("tests/unit/research/test_train_progress.py",), "a child's steps are shown only when it ends"),
    Break("validation-with-grad", "implicit_megatron/train/validation.py",
          "@torch.no_grad()\ndef evaluate(", "def evaluate(",
          ("tests/distributed/test_catbabi_training.py",), "validation runs with autograd on"),
    Break("index-cache-pickles", "data_pipeline/index_cache.py",
          '        array = np.load(path, mmap_mode="r", allow_pickle=False)',
          '        array = np.load(path, mmap_mode="r", allow_pickle=True)',
          ("tests/unit/data_pipeline/test_received_index_cache.py",),
          "a received index cache's pickle is loaded (runs code) before megatron-core reads it"),
    Break("index-cache-hard-links", "data_pipeline/index_cache.py",
          "    if entry.stat(follow_symlinks=False).st_nlink > 1:", "    if False:",
          ("tests/unit/data_pipeline/test_received_index_cache.py",),
          "a hard link in a named index cache is written through when megatron-core rebuilds it"),
    Break("shard-digests", "data_pipeline/shard_check.py",
          '        if verify and file_sha256(path) != record["sha256"]:', "        if False:",
          ("tests/unit/data_pipeline/test_shard_check.py",), "a flipped bit in a shard passes --verify"),
    Break("control-characters", "implicit_megatron/utils/names.py",
          'CONTROL_CHARACTERS = re.compile(r"[\\x00-\\x1f\\x7f]")', 'CONTROL_CHARACTERS = re.compile(r"[\\x00-\\x08]")',
          ("tests/unit/config/test_config.py::test_a_control_character_in_any_value_is_refused_naming_its_key",
           "tests/e2e/test_launch_values.py::test_a_received_config_cannot_forge_a_row_of_the_curriculum_plan"),
          "a newline or tab in a config value reaches the curriculum's tab-separated plan"),
    Break("evaluation-output-links", "implicit_megatron/evaluation/runner.py",
          "    inside = foreign_entry_inside if options.output else foreign_entry",
          "    inside = foreign_entry_inside",
          ("tests/unit/evaluation/test_received_outputs.py",),
          "a received export's evaluation/ folder (or a results file) as a link is written through"),
    Break("tracker-links-anywhere", "implicit_megatron/utils/own_files.py",
          "        if len(place) == 2 and place[1] in WANDB_LINKS:\n            return inside",
          "        if len(place) == 2 and place[1] in WANDB_LINKS:\n            return True",
          ("tests/unit/tracking/test_tracker.py::test_weights_and_biases_offline_writes_a_run_that_a_resume_continues",),
          "a link in wandb/ with one of W&B's names is accepted wherever it points"),
    Break("run-folder-hard-links", "implicit_megatron/train/process/run_lock.py",
          "    found = foreign_entries_inside(folder, hard_links=True, accepted=tracker_link(folder))",
          "    found = foreign_entries_inside(folder, accepted=tracker_link(folder))",
          ("tests/e2e/test_received_files.py::test_a_hard_linked_file_in_a_run_folder_is_refused_before_the_run_writes_"
           "through_it",), "a run folder copied with cp -al appends to the other run's metrics.jsonl"),
    Break("launch-half-one-reason", "implicit_megatron/launch/supervisor.py",
          "            StopRequest(STOP_SIGNALS[signum]).write(folder)",
          "            StopRequest(\"SIGTERM\").write(folder)",
          ("tests/unit/launch/test_stop_protocol.py",), "the launch asks every stop as SIGTERM, whatever signal came"),
    Break("launch-half-third-ctrl-c", "implicit_megatron/launch/supervisor.py",
          "        if signum == signal.SIGINT and signals.interrupts() > 1:",
          "        if signum == signal.SIGINT and signals.interrupts() > 2:",
          ("tests/unit/launch/test_stop_protocol.py",), "a second Ctrl-C asks for the graceful stop again"),
    Break("rank-half-request-unread", "implicit_megatron/train/callbacks/preemption.py",
          "            request = StopRequest.read(self.folder)", "            request = None",
          ("tests/unit/train/test_stopping.py",), "rank 0 never reads the launch's stop request"),
    Break("tokenizer-truncation-accepted", "data_pipeline/tokenizer.py", "        if setting:\n",
          "        if setting and False:\n", ("tests/unit/data_pipeline/test_shard_tokenizer.py",),
          "a tokenizer.json that cuts every text to 64 tokens builds shards and prompts"),
    Break("index-cache-other-seed", "data_pipeline/packed.py",
          "    if dataset.shuffle_index is not None and cached_before(dataset, began):",
          "    if False:", ("tests/unit/data_pipeline/test_received_index_cache.py",),
          "a cached shuffle index of another seed trains on another order"),
    Break("run-folder-link", "implicit_megatron/utils/output_paths.py", "    if path.is_symlink():\n",
          "    if False:\n", ("tests/unit/config/test_config.py",),
          "a link as train.output_dir is followed for a new run"),
    Break("domain-finite", "implicit_megatron/utils/domains.py",
          "        inside = ((whole or math.isfinite(value)) and",
          "        inside = ((whole or not math.isnan(value)) and",
          ("tests/unit/config/test_config_domains.py", "tests/unit/tools/test_fuzz_config.py"),
          "an infinite value passes a field's domain (a free phase's tol=.inf: one pass)"),
    Break("yaml-duplicate-key", "implicit_megatron/utils/typed_yaml.py",
          "                if first is not key_node.start_mark:",
          "                if first is not key_node.start_mark and False:",
          ("tests/unit/config/test_config_limits.py",), "a key given twice in one YAML mapping: the last one wins"),
    Break("base-reads-in-all", "implicit_megatron/utils/typed_yaml.py",
          "    if len(reads) >= MAX_BASE_READS:",
          "    if len(reads) >= MAX_BASE_READS * 1000:",
          ("tests/unit/config/test_config_limits.py",), "a fan-out of base: files is read as often as it names them"),
]


def applies(b: Break, root: Path = ROOT) -> str | None:
    """Why `b` cannot be applied to the source at `root` (None: it can)."""
    text = (root / b.path).read_text()
    count = text.count(b.old)
    return None if count == 1 else f"its snippet occurs {count} times in {b.path}"


def copy_repository(to: Path) -> None:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)


def run(b: Break, copy: Path, timeout: int) -> tuple[str, float]:
    """('caught' | 'SURVIVED' | 'error: ...', seconds) for one break applied to `copy`."""
    target = copy / b.path
    original = target.read_text()
    target.write_text(original.replace(b.old, b.new))
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    start = time.monotonic()
    try:
        result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *b.tests],
                                cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        code = result.returncode
    except subprocess.TimeoutExpired:
        code = None
    finally:
        target.write_text(original)
    seconds = time.monotonic() - start
    if code == 1:
        return "caught", seconds
    if code == 0:
        return "SURVIVED", seconds
    return ("error: timed out" if code is None else f"error: pytest exit status {code}"), seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=None, help="comma-separated break names")
    parser.add_argument("--list", action="store_true", help="list the breaks and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds for one break's tests")
    args = parser.parse_args(argv)
    chosen = BREAKS
    if args.only:
        names = args.only.split(",")
        unknown = [n for n in names if n not in {b.name for b in BREAKS}]
        if unknown:
            parser.error(f"unknown break(s) {', '.join(unknown)}; --list shows them")
        chosen = [b for b in BREAKS if b.name in names]
    if args.list:
        for b in chosen:
            print(f"{b.name:<28} {b.path:<48} {b.what}")
        return 0
    rows, failed = [], False
    with tempfile.TemporaryDirectory(prefix="mutation-check-") as folder:
        copy = Path(folder)
        copy_repository(copy)
        for b in chosen:
            problem = applies(b, copy)
            outcome, seconds = (f"error: {problem}", 0.0) if problem else run(b, copy, args.timeout)
            failed |= outcome != "caught"
            rows.append((b.name, b.path, ", ".join(t.rsplit("/", 1)[-1] for t in b.tests), outcome, seconds))
            print(f"{b.name}: {outcome} ({seconds:.0f} s)", file=sys.stderr, flush=True)
    print("| break | file | tests | outcome | s |\n| --- | --- | --- | --- | --- |")
    for name, path, tests, outcome, seconds in rows:
        print(f"| {name} | {path} | {tests} | {outcome} | {seconds:.0f} |")
    caught = sum(row[3] == "caught" for row in rows)
    print(f"\n{caught} of {len(rows)} breaks caught")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
