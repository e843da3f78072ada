"""What DeepSpeed's engine builds for a plan (TrainingSpec.optimizer_impl = 'deepspeed'): the
optimizer wrapper it picks, the gradient buckets that wrapper allocates and how it reduces the
gradients. The ledger (planner.memory), the cost model (planner.cost), the search (planner.space)
and the DeepSpeed emitter read these functions, so the ds_config written is the one priced.

Read in deepspeed 0.19.8, the version the emitter targets (its files under deepspeed/runtime/):
    [Engine]  engine.py: DeepSpeedEngine._do_optimizer_sanity_check (which wrapper), get_data_types
              (the gradient-accumulation dtype defaults to the model's), communication_data_type
              (the model dtype unless configured), allreduce_gradients / buffered_allreduce_fallback
              (BF16_Optimizer and FP16_Optimizer all-reduce the gradients after the last backward,
              MEMORY_OPT_ALLREDUCE_SIZE elements at a time), _configure_zero_optimizer (overlap_comm off
              under the pipeline engine).
    [Zero12]  zero/stage_1_and_2.py: DeepSpeedZeroOptimizer.setup_buckets (contiguous_gradients: a
              reduce bucket of reduce_bucket_size elements, a second with overlap_comm, in
              _gradient_reduction_buffer_dtype: FP32 where stage 1 accumulates FP32 gradients beside
              16-bit ones, else the model dtype).
    [Offload] zero/stage_1_and_2.py with zero_optimization.offload_optimizer.device 'cpu': __init__
              (the FP32 master partition pinned on the host, a pinned 16-bit copy of it,
              param_buffer_of_bit16_for_cpu_offload_groups), initialize_optimizer_states (the FP32
              gradient partition pinned on the host), copy_grads_in_partition (with FP32 gradient
              accumulation of 16-bit weights, _use_compact_grad_partition_buffer: the reduced partition
              accumulates on the GPU and crosses to the host once, at the accumulation boundary), step
              (the optimizer over the host partition, the FP32 partition copied into the 16-bit buffer on
              the host, then to the GPU, non-blocking); engine.py: _do_optimizer_sanity_check
              (BF16_Optimizer is skipped when the optimizer is offloaded); ops/adam/cpu_adam.py:
              DeepSpeedCPUAdam.step (adam_update over the FP32 parameter, gradient, exp_avg and
              exp_avg_sq). Megatron-DeepSpeed hands DeepSpeedCPUAdam to DeepSpeed under --cpu-optimizer
              [deepspeedai/Megatron-DeepSpeed@4efb479 megatron/optimizer/__init__.py: get_megatron_optimizer].
    [Zero3]   zero/stage3.py: DeepSpeedZeroOptimizer_Stage3.__init__ (one reduce bucket of
              reduce_bucket_size elements, allocated at start; gradient partitions in the
              accumulation dtype).
    [Offload3] zero/stage3.py with offload_optimizer.device 'cpu' (self.device is the CPU):
              _setup_for_real_optimizer (grad_partitions_flat_buffer, the gradient partitions in the
              accumulation dtype, pinned on the host), _create_fp32_partitions (the FP32 master
              partition on the host), initialize_optimizer_states (an FP32 gradient buffer per
              sub-group, pinned on the host; DeepSpeedCPUAdam's exp_avg and exp_avg_sq), partition_grads
              (every micro-batch: the reduced partition is copied into the host buffer and back to the
              GPU, or from the second micro-batch on, the host buffer to the GPU, added there and
              copied back; at the accumulation boundary _offload_grad_partition_at_boundary copies it
              as FP32 into the host gradient), step (per sub-group: DeepSpeedCPUAdam on the host, then
              _reassign_or_swap_out_partitioned_parameters copies the FP32 partition into the GPU's
              16-bit partition with a blocking copy_, which converts it on the CPU first [torch
              aten/src/ATen/native/cuda/Copy.cu: copy_kernel_cuda, "For blocking transfers conversions
              are performed on CPU"]). No GPU gradient partition or optimizer state is kept.
    [Zero3P]  zero/partitioned_param_coordinator.py: PartitionedParameterCoordinator (the module
              trace covers forward and backward, parameter_offload.py: pre_sub_module_*_function;
              __params_to_release keeps a parameter reused within max_reuse_distance; prefetching
              stays under max_live_parameters).
    [BF16]    bf16_optimizer.py: BF16_Optimizer (an FP32 gradient buffer of the whole model and the
              FP32 master partition: the ledger's ZeRO-1 bytes; no reduce bucket); backward_prologue
              (clear_lp_grads: torch._foreach_zero_ of every BF16 gradient) and backward_epilogue
              (update_hp_grads: hp_grad.add_(lp.grad.to(float32)) per parameter), called around every
              micro-batch's backward by engine.py: _backward_prologue / _backward_epilogue and, on the
              pipeline's other stages, by pipe/engine.py: PipelineEngine._exec_backward_pass.
    [Pipe]    pipe/module.py: PipelineModule._partition_layers ('type:<regex>': weight 1 for every
              layer spec whose class matches, 0 for the rest, then utils.py: partition_balanced, a
              linear-partition dynamic programme minimising the largest minus the smallest part,
              the last cut of equal cost kept). Megatron-DeepSpeed's GPTModelPipe builds its stages
              with partition_method='type:transformer' over [fp16 cast, embedding, the decoder
              layers, final norm, LM head, fp32 cast] [deepspeedai/Megatron-DeepSpeed@4efb479
              megatron/model/gpt_model.py: GPTModelPipe.__init__].
    [Loss]    Megatron-DeepSpeed's loss [deepspeedai/Megatron-DeepSpeed@4efb479
              megatron/core/tensor_parallel/cross_entropy.py: _VocabParallelCrossEntropy.forward (the
              maximum subtracted out of place, exp in place on that copy, the division in place; the
              softmax saved), backward (the gradient written into the softmax); megatron/model/
              gpt_model.py: post_language_model_processing (cross_entropy(output.float(), labels) while
              `output`, the BF16 logits, is held), GPTModelPipe (the last stage's float16_to_fp32 layer
              and CrossEntropy's no-op .float())]; pipe/engine.py: PipelineEngine._exec_forward_pass
              keeps the stage's output in pipe_buffers['outputs'] until _exec_backward_pass.
    [PipeOut] pipe/engine.py: PipelineEngine._exec_forward_pass keeps every stage's output but the last's
              in pipe_buffers['outputs'] until its backward: with model parallelism (the topology's 'model'
              axis, TP, above 1) and pipeline.pipe_partitioned (config.py: get_pipeline_config, default
              True; the emitter leaves it), a PartitionedTensor of it over the TP group, this rank's 1/tp,
              the whole output freed (first_output.data = torch.zeros(1)); without TP the output itself.
              pipe/schedule.py: TrainSchedule.num_pipe_buffers, min(stages - stage_id, micro_batches)
              buffers: the micro-batches in flight.
"""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache

from planner.errors import SpecError
from planner.specs import Layout, TrainingSpec, num_microbatches

__all__ = [
    "Wrapper",
    "wrapper",
    "uses_deepspeed",
    "zero0_runs",
    "overlaps_reduction",
    "overlap_comm",
    "reduce_bucket_bytes",
    "zero3_gathered_params",
    "REDUCE_BUCKET_ELEMENTS",
    "PREFETCH_BUCKET_ELEMENTS",
    "MAX_REUSE_DISTANCE",
    "MAX_LIVE_PARAMETERS",
    "ALLGATHER_BUCKET_ELEMENTS",
    "GRAD_WIRE_BYTES",
    "pipeline_split",
    "pipe_spec_weights",
    "held_stage_outputs",
    "accumulation_bytes",
    "BF16_ACCUMULATION_BYTES",
    "AUTOGRAD_ADD_BYTES",
    "LP_GRAD_BYTES",
    "lp_grad_bytes",
    "FP16_ACCUMULATION_BYTES",
    "FP16_FIRST_CAST_BYTES",
    "OFFLOAD_HOST_BYTES",
    "OFFLOAD_D2H_BYTES",
    "OFFLOAD_H2D_BYTES",
    "CPU_STEP_BYTES",
    "OFFLOAD3_STATE_BYTES",
    "OFFLOAD3_BOUNDARY_D2H_BYTES",
    "SUB_GROUP_ELEMENTS",
    "offload_host_bytes",
    "offload_micro_batch_link_bytes",
    "LOSS_PEAK_SBV",
    "LOSS_TRAFFIC_BYTES",
]

LOSS_PEAK_SBV = 10
"""Bytes per local logit (s b V / tp) Megatron-DeepSpeed's loss holds at its peak [Loss]: without the
pipeline, in forward, the BF16 logits, their FP32 copy and the shifted copy exp overwrites (2 + 4 + 4);
under the pipeline engine, in backward, the FP32 output the engine keeps, the FP32 gradient written over
the softmax and its BF16 cast (4 + 4 + 2). Derived from the source, not measured here."""

LOSS_TRAFFIC_BYTES = (2 + 4) + 4 + 8 + 8 + 4 + 8 + 8 + (4 + 2)
"""HBM bytes per local logit Megatron-DeepSpeed's loss reads and writes in one micro-batch [Loss], one
pass per step (it has no fused loss): the model's FP32 cast of the logits (read 2, write 4; its backward
casts the gradient back, read 4, write 2), the maximum (4), the shifted copy (8), exp in place (8), the
sum (4), the division in place (8) and, backward, the in-place product with the output gradient (8): 52."""

REDUCE_BUCKET_ELEMENTS = 500_000_000
"""zero_optimization.reduce_bucket_size the emitter writes (DeepSpeed's default): elements per
gradient reduction, and the size of each contiguous-gradient bucket [Zero12, Zero3]."""
ALLGATHER_BUCKET_ELEMENTS = 500_000_000
"""zero_optimization.allgather_bucket_size the emitter writes."""
PREFETCH_BUCKET_ELEMENTS = 50_000_000
"""zero_optimization.stage3_prefetch_bucket_size as emitted (DeepSpeed's default): parameters gathered
ahead of the module that needs them [Zero3P]."""
MAX_REUSE_DISTANCE = 1_000_000_000
"""zero_optimization.stage3_max_reuse_distance as emitted (DeepSpeed's default): a gathered parameter is
kept while its next use lies within this many parameters of the module trace [Zero3P]."""
MAX_LIVE_PARAMETERS = 1_000_000_000
"""zero_optimization.stage3_max_live_parameters as emitted (DeepSpeed's default): the cap on gathered
parameters that prefetching respects [Zero3P]."""
GRAD_WIRE_BYTES = 2
"""Bytes per gradient element on the wire: DeepSpeed reduces in communication_data_type, the
model's 16-bit dtype unless configured (the emitter does not), even where it accumulates FP32 [Engine]."""


OFFLOAD_HOST_BYTES = 4 + 4 + 8 + 2
"""Host bytes per element of the optimizer partition ZeRO-Offload keeps: the pinned FP32 master,
the pinned FP32 gradient, DeepSpeedCPUAdam's FP32 exp_avg and exp_avg_sq, and the pinned 16-bit
copy the update crosses back in [Offload]."""
OFFLOAD_D2H_BYTES = 4
"""Bytes per partition element to the host, once per step: the FP32 gradient partition [Offload:
copy_grads_in_partition, compact path]."""
OFFLOAD_H2D_BYTES = 2
"""Bytes per partition element back: the 16-bit parameter partition [Offload: step]."""
CPU_STEP_BYTES = 28 + 6
"""Host-memory bytes per partition element of the step on the host: DeepSpeedCPUAdam reads the
parameter, gradient, exp_avg and exp_avg_sq and writes the first three back (28); the FP32 partition
is then converted to 16 bits on the host, read 4, write 2 (into the pinned 16-bit copy at stages 1-2
[Offload], into the blocking copy_'s temporary at stage 3 [Offload3]). ASSUMPTION: gradient clipping
does not engage (unscale_and_clip_grads multiplies the host gradient, 8 more bytes, only when it does)."""
OFFLOAD3_STATE_BYTES = 4 + 4 + 8
"""Host bytes per partition element ZeRO-3's offload keeps beside its gradient partition: the FP32
master, the pinned FP32 gradient and DeepSpeedCPUAdam's exp_avg and exp_avg_sq [Offload3]."""
OFFLOAD3_BOUNDARY_D2H_BYTES = 4
"""Bytes per partition element to the host at the accumulation boundary: the gradient, cast to FP32 on
the GPU, into the host's FP32 gradient (non-blocking) [Offload3: _offload_grad_partition_at_boundary]."""
SUB_GROUP_ELEMENTS = 1_000_000_000
"""zero_optimization.sub_group_size, DeepSpeed's default (the emitter leaves it): the partition is
stepped and copied back in sub-groups of up to this many elements, each converted to 16 bits on the
host first [Offload3; runtime/zero/config.py: sub_group_size]."""


def _accumulation_element_bytes(training: TrainingSpec) -> int:
    """Bytes of one gradient element in the accumulation dtype the emitter writes (data_types.
    grad_accum_dtype: FP32 with grad_dtype 'fp32', else the model's 16 bits)."""
    return 4 if training.grad_dtype == "fp32" else 2


def offload_host_bytes(training: TrainingSpec, zero_stage: int) -> float:
    """Host bytes per optimizer-partition element DeepSpeed's optimizer offload keeps: ZeRO-1/2's
    OFFLOAD_HOST_BYTES, or ZeRO-3's gradient partition (in the accumulation dtype) and
    OFFLOAD3_STATE_BYTES."""
    if zero_stage == 3:
        return _accumulation_element_bytes(training) + OFFLOAD3_STATE_BYTES
    return OFFLOAD_HOST_BYTES


def offload_micro_batch_link_bytes(training: TrainingSpec) -> float:
    """Bytes per partition element ZeRO-3's offload moves over the host link in every micro-batch's
    backward: its gradient partition to the host buffer and back to the GPU (the first micro-batch), or
    the host buffer to the GPU and the sum back (the later ones), in the accumulation dtype [Offload3:
    partition_grads]."""
    return 2 * _accumulation_element_bytes(training)


AUTOGRAD_ADD_BYTES = 2 + 2 + 2
"""HBM bytes per parameter of autograd adding a weight gradient into an existing .grad in place, read
2 + 2, write 2 [torch csrc/autograd/functions/accumulate_grad.h: accumulateGrad, 'variable_grad +=
new_grad' once the grad is defined; a fresh one is stolen, no copy]. Megatron-DeepSpeed's linears
return their weight gradient to autograd (its gradient-accumulation fusion is commented out,
deepspeedai/Megatron-DeepSpeed@4efb479 megatron/core/tensor_parallel/layers.py:
LinearWithGradAccumulationAndAsyncCommunication.backward)."""

BF16_ACCUMULATION_BYTES = 2 + AUTOGRAD_ADD_BYTES + 6 + 12
"""HBM bytes per local parameter BF16_Optimizer moves around every micro-batch's backward, outside
the backward's own kernels [BF16]: zeroing the BF16 gradient before it (write 2); autograd adding
the weight gradient into that zeroed tensor (AUTOGRAD_ADD_BYTES); lp.grad.to(float32), read 2,
write 4; and hp_grad.add_ of that copy, read 4 + 4, write 4."""


FP16_ACCUMULATION_BYTES = 6 + 12
"""HBM bytes per parameter the ZeRO optimizer spends at stage 1 when FP16 weights accumulate FP32
gradients (use_grad_accum_attribute) in each micro-batch after the first [Zero12:
_fill_param_grad_accum_attribute, run by the gradient hook]: param.grad.to(float32), read 2, write 4,
added into param.grad_accum, read 4 + 4, write 4; param.grad is then dropped, so autograd writes the
next micro-batch's afresh."""
FP16_FIRST_CAST_BYTES = 6
"""The first micro-batch's: param.grad_accum = param.grad.to(float32), read 2, write 4."""


class Wrapper(StrEnum):
    """The optimizer wrapper DeepSpeed's engine builds [Engine: _do_optimizer_sanity_check]."""

    BF16 = "BF16_Optimizer"
    """BF16 weights, FP32 gradient accumulation, ZeRO-1, the optimizer on the GPU: FP32 gradients of
    the whole model, the master weights and Adam states sharded over DP; gradients all-reduced after the last backward."""
    ZERO = "DeepSpeedZeroOptimizer"
    """ZeRO-1/2 otherwise: contiguous-gradient reduce buckets; reduced bucket by bucket."""
    ZERO3 = "DeepSpeedZeroOptimizer_Stage3"
    """ZeRO-3: one reduce bucket beside the gradient partitions."""
    FP16 = "FP16_Optimizer"
    """FP16 weights and gradients without ZeRO: FP32 master weights; gradients all-reduced after the
    last backward."""


def uses_deepspeed(training: TrainingSpec) -> bool:
    """The plan runs on DeepSpeed's engine (TrainingSpec.optimizer_impl)."""
    return training.optimizer_impl == "deepspeed"


def wrapper(training: TrainingSpec, layout: Layout) -> Wrapper:
    """The wrapper DeepSpeed builds for the ds_config the emitter writes (bf16/fp16 as
    training.precision, grad_accum_dtype FP32 with grad_dtype 'fp32', else the model dtype).

    Raises:
        SpecError: ZeRO-0 with BF16 weights, which DeepSpeed either refuses (FP32 accumulation:
            'unsupported mix of model_dtype and grad_accum_dtype') or runs as another optimizer
            (BF16 accumulation: DDP_BFLOAT16, Adam on the BF16 weights without FP32 master weights;
            with its pipeline engine, BF16_Optimizer sharding the master like ZeRO-1), or ZeRO-0
            with FP16 weights and FP32 accumulation (refused likewise).
    """
    zero, fp32_accum = layout.zero_stage, training.grad_dtype == "fp32"
    offload = uses_deepspeed(training) and bool(training.optimizer_offload)
    if zero == 0 and not zero0_runs(training):
        if training.precision == "bf16":
            raise SpecError("zero_stage: DeepSpeed without ZeRO cannot train BF16 weights with FP32 master weights "
                            "(FP32 gradient accumulation is refused, BF16 accumulation builds Adam without master "
                            "weights); use zero_stage >= 1", "zero_stage")
        if fp32_accum:
            raise SpecError("grad_dtype: DeepSpeed without ZeRO refuses FP16 weights with FP32 gradient accumulation "
                            "(unsupported mix of dtypes); use grad_dtype='bf16' (16-bit) or zero_stage >= 1", "grad_dtype")
    if zero == 0:
        return Wrapper.FP16
    if zero == 3:
        return Wrapper.ZERO3
    if zero == 1 and fp32_accum and training.precision == "bf16" and not offload:
        return Wrapper.BF16
    return Wrapper.ZERO


def accumulation_bytes(training: TrainingSpec, layout: Layout) -> float:
    """HBM bytes per local parameter that gradient accumulation costs in a micro-batch (the step's
    average over its m micro-batches) beyond the backward kernels:
    - BF16_Optimizer (ZeRO-1): BF16_ACCUMULATION_BYTES in every micro-batch;
    - the ZeRO optimizer at stage 1 with 16-bit weights accumulating FP32 (its grad_accum attribute;
      FP16 weights, or BF16 ones with the optimizer offloaded):
      FP16_FIRST_CAST_BYTES in the first micro-batch, FP16_ACCUMULATION_BYTES in each later one;
    - FP16_Optimizer (ZeRO-0) and stage 1 accumulating in the model dtype: the gradients stay in .grad
      until the step (reduced at the boundary, then set to None by zero_grad) [Zero12:
      reduce_ready_partitions_and_remove_grads; fp16/fused_optimizer.py: zero_grad], so each micro-batch
      after the first pays AUTOGRAD_ADD_BYTES.
    0 for ZeRO-2 and 3 (ASSUMPTION: the accumulation into their 1/dp partitions is not priced)."""
    if _runs_bf16_optimizer(training, layout):
        return BF16_ACCUMULATION_BYTES
    if not uses_deepspeed(training) or layout.zero_stage > 1 or (layout.zero_stage == 0 and not zero0_runs(training)):
        return 0.0  # (ZeRO-0 that DeepSpeed would not run is refused by the layout checks)
    m = num_microbatches(training, layout)
    if layout.zero_stage == 1 and training.grad_dtype == "fp32":  # the ZERO wrapper: FP16, or BF16 offloaded
        return (FP16_FIRST_CAST_BYTES + (m - 1) * FP16_ACCUMULATION_BYTES) / m
    return (m - 1) * AUTOGRAD_ADD_BYTES / m


LP_GRAD_BYTES = 2
"""Bytes per parameter of the BF16 .grad tensors BF16_Optimizer keeps beside its FP32 gradient buffer:
backward_prologue zeroes them (clear_lp_grads without set_to_none), so from the second micro-batch on
they exist whole when its backward starts; zero_grad after the step frees them [BF16, Engine:
_take_model_step]."""


def held_stage_outputs(pp: int, stage: int, in_flight: float, tp: int) -> float:
    """Stage edges' worth (one micro-batch's output of a stage, as that stage's TP rank holds it) pipeline stage
    `stage` keeps until the backward [PipeOut]: its `in_flight` micro-batches' outputs (planner.memory.
    in_flight_microbatches: min(pp - stage, micro-batches), num_pipe_buffers' count), each this rank's 1/tp
    partition under TP (pipe_partitioned), whole without; none on the last stage (its outputs are losses)."""
    if pp == 1 or stage == pp - 1:
        return 0.0
    return in_flight / tp


def lp_grad_bytes(training: TrainingSpec, layout: Layout) -> float:
    """Bytes per local parameter of 16-bit gradients a wrapper holds at the activation peak beside the
    gradient buffer the ledger counts: LP_GRAD_BYTES under BF16_Optimizer (ASSUMPTION: also with one
    micro-batch, where they build up while the activations drain), else 0 (the other wrappers' .grad
    is that buffer, or is dropped once reduced)."""
    if not _runs_bf16_optimizer(training, layout):
        return 0.0
    return LP_GRAD_BYTES


def _runs_bf16_optimizer(training: TrainingSpec, layout: Layout) -> bool:
    """The plan runs on DeepSpeed's BF16_Optimizer (ZeRO-1 only: wrapper)."""
    return uses_deepspeed(training) and layout.zero_stage == 1 and wrapper(training, layout) == Wrapper.BF16


def zero0_runs(training: TrainingSpec) -> bool:
    """DeepSpeed without ZeRO trains what the ledger prices (FP32 master weights) only with FP16
    weights and 16-bit gradient accumulation (FP16_Optimizer); see wrapper."""
    return training.precision == "fp16" and training.grad_dtype != "fp32"


def overlaps_reduction(training: TrainingSpec, zero_stage: int) -> bool:
    """The wrapper at this ZeRO stage reduces gradient buckets during the backward (overlap_comm):
    DeepSpeed's ZeRO optimizer; BF16_Optimizer and FP16_Optimizer all-reduce after the last
    backward [Engine: allreduce_gradients]; ZeRO-3's prefetch is priced by calibration.dp_overlap."""
    if zero_stage == 0:
        return False
    return wrapper(training, Layout(zero_stage=zero_stage)) == Wrapper.ZERO


def overlap_comm(layout: Layout) -> bool:
    """zero_optimization.overlap_comm as emitted: ZeRO-3's default (on), else the plan's
    overlap_grad_reduce (the search sets it only where the wrapper overlaps: planner.space.overlaps)."""
    return layout.zero_stage == 3 or layout.overlap_grad_reduce


def reduce_bucket_bytes(training: TrainingSpec, layout: Layout) -> float:
    """Bytes of the contiguous-gradient reduce buckets (contiguous_gradients, as emitted): two under
    overlap_comm for ZeRO-1/2 (double buffering) [Zero12: setup_buckets], one for ZeRO-3 [Zero3];
    FP32 where stage 1 accumulates FP32 gradients of FP16 weights, else the model's 2 B; none for
    BF16_Optimizer and FP16_Optimizer [BF16, Engine]."""
    w = wrapper(training, layout)
    if w in (Wrapper.BF16, Wrapper.FP16):
        return 0.0
    if w == Wrapper.ZERO3:
        return REDUCE_BUCKET_ELEMENTS * 2
    per = 4 if layout.zero_stage == 1 and training.grad_dtype == "fp32" else 2
    return REDUCE_BUCKET_ELEMENTS * per * (2 if overlap_comm(layout) else 1)


def zero3_gathered_params(layer_params: float, layers: int) -> float:
    """Parameters ZeRO-3 holds gathered when the backward begins (the activation peak), on a GPU
    holding `layers` layers of `layer_params` each: layer j's next use after its forward is its
    backward, 2 (L - 1 - j) layers' parameters further along the trace, so the last
    floor(D / 2P) + 1 layers are not released (D = max_reuse_distance), plus the prefetch bucket
    gathered ahead; at most the stage's layers, and prefetching stops at max_live_parameters [Zero3P]."""
    kept = min(layers, int(MAX_REUSE_DISTANCE // (2 * layer_params)) + 1) * layer_params
    return min(layers * layer_params, max(kept, min(kept + PREFETCH_BUCKET_ELEMENTS, MAX_LIVE_PARAMETERS)))


PIPE_SPECS_BEFORE = 2
"""Layer specs of GPTModelPipe before the decoder layers (the fp16 cast, the embedding) [Pipe]."""
PIPE_SPECS_AFTER = 3
"""Layer specs after them (final norm, LM head, fp32 cast) [Pipe]."""


def pipe_spec_weights(num_layers: int) -> list[int]:
    """The 'type:transformer' weight of each of GPTModelPipe's layer specs: 1 per decoder layer, 0 for
    the casts, embedding, final norm and head around them [Pipe]."""
    return [0] * PIPE_SPECS_BEFORE + [1] * num_layers + [0] * PIPE_SPECS_AFTER


@lru_cache(maxsize=256)
def pipeline_split(num_layers: int, pp: int) -> tuple[int, ...]:
    """Decoder layers on each pipeline stage as DeepSpeed's pipeline engine places Megatron-DeepSpeed's
    GPT model (partition_method='type:transformer', [Pipe]): the binary weights of its layer specs cut
    into pp parts whose largest and smallest weight differ least (the last cut among equal costs).
    Balanced counts that differ by at most one; which stages take the extra layer is the programme's
    choice (30 layers on 4 stages: 8, 8, 7, 7; 61 on 16: thirteen 4s, then three 3s)."""
    weights = pipe_spec_weights(num_layers)
    n, inf = len(weights), float("inf")
    if pp <= 1:
        return (num_layers,)
    if pp > num_layers:
        raise SpecError(f"pp({pp}) > num_layers({num_layers}): DeepSpeed would leave stages without a decoder layer")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    # cost[i][j], hi[i][j], lo[i][j]: the first i specs in j parts (spread, largest, smallest part)
    cost = [[inf] * (pp + 1) for _ in range(n + 1)]
    hi = [[inf] * (pp + 1) for _ in range(n + 1)]
    lo = [[inf] * (pp + 1) for _ in range(n + 1)]
    cut = [[0] * (pp + 1) for _ in range(n + 1)]
    cost[0][0] = hi[0][0] = 0
    for i in range(1, n + 1):
        for j in range(1, min(i, pp) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                big, small = max(hi[k][j - 1], part), min(lo[k][j - 1], part)
                spread = big - small  # inf where the first k specs cannot make j - 1 parts
                if cost[i][j] >= spread:
                    cost[i][j], hi[i][j], lo[i][j], cut[i][j] = spread, big, small, k
    bounds = [n]
    for j in range(pp, 0, -1):
        bounds.append(cut[bounds[-1]][j])
    bounds.reverse()
    return tuple(prefix[b] - prefix[a] for a, b in zip(bounds, bounds[1:]))
