"""What NeMo 1.x's optimizer 'distributed_fused_adam' keeps and sends (TrainingSpec.optimizer_impl = 'apex'):
Apex's DistributedFusedAdam as NeMo's MegatronDistributedFusedAdam configures it. The ledger (planner.memory),
the cost model (planner.cost) and the layout checks (planner.space) read these functions. No launch file is
written for it: the emitters write Megatron-LM, DeepSpeed and torchtitan configs, and refuse a plan priced
on this engine (planner.emit.refuse_other_engine).

Read in NVIDIA/apex@6424da3 apex/contrib/optimizers/distributed_fused_adam.py and NVIDIA/NeMo@7ed5455
nemo/collections/nlp/models/language_modeling/megatron_base_model.py (MegatronBaseModel.setup_optimization):
    [Setup]   setup_optimization: contiguous_grad_buffer defaults to True; the optimizer dtype to FP32;
              param_sync_dtype is the model's (BF16 under megatron_amp_O2); a BF16 model with an FP32
              optimizer gets store_params=False, store_param_remainders=True; FP8 parameters (fp8_params)
              or any other pair of dtypes, store_params=True. The word and position embeddings and the
              output layer are marked _with_fp32_optimizer.
    [State]   StateBucket.__init__: per bucket, the local shard of exp_avg and exp_avg_sq in the optimizer
              dtype (FP32) and either the FP32 parameters (store_params) or their 16-bit remainders
              (store_param_remainders, int16).
    [Grads]   _init_grad_buffer: one contiguous gradient buffer per dtype triple, in its grad_sync_dtype
              (grad_sync_dtype defaults to the optimizer dtype, FP32; NeMo's FP8 recipes set 'bf16'); the
              _with_fp32_optimizer parameters' buckets sync in FP32 whatever grad_sync_dtype says
              (NeMo's core/optim/distributed_adam.py: MegatronDistributedFusedAdam.init_params_bucket).
              _start_bucket_grad_sync reduce-scatters each bucket into a new shard (sync_grads_shard, the
              bucket's size / the distributed group), which _finish_bucket_grad_sync keeps as the bucket's
              grads_shard until zero_grad: at the end of the last backward the buffer and 1/dp of it.
    [Buckets] __init__: bucket_size = 1024 * 1024 * bucket_cap_mb / the grad_sync dtype's size. NeMo-
              Framework-Launcher's configs set bucket_cap_mb 125 with overlap_grad_sync, overlap_param_sync
              and both contiguous buffers [NVIDIA/NeMo-Framework-Launcher@14860f7
              launcher_scripts/conf/training/llama/llama3_8b.yaml: model.optim].
"""

from __future__ import annotations

from planner.specs import Layout, ModelSpec, TrainingSpec

__all__ = ["uses_apex", "LIMITS", "state_bytes", "STATE_BYTES_REMAINDERS", "STATE_BYTES_PARAMS", "FP32_SYNC_BYTES",
           "fp32_sync_params", "gradient_bytes", "BUCKET_CAP_BYTES", "bucket_params", "problems"]

STATE_BYTES_REMAINDERS = 2 + 4 + 4
"""Optimizer shard bytes per parameter of a BF16 model: the int16 remainders of the FP32 master, FP32
exp_avg and exp_avg_sq [State, Setup]."""
STATE_BYTES_PARAMS = 4 + 4 + 4
"""The same with store_params: the FP32 master whole (FP8 parameters, or an FP16 model) [State, Setup]."""
FP32_SYNC_BYTES = 4
"""Gradient bytes of the embeddings and the output layer, which sync in FP32 [Grads]."""
BUCKET_CAP_BYTES = 125 * 2**20
"""NeMo-Framework-Launcher's bucket_cap_mb, 125 MiB [Buckets]."""


LIMITS = {"uneven_stages": False}
"""What a search may choose for a NeMo 1.x run (planner.space.build_space applies it as FRAMEWORK_LIMITS):
even layer splits only -- NeMo's GPT model places num_layers / pp layers on each rank and asserts its
virtual chunks are equal ((num_layers // pp) % vp == 0: MegatronBaseModel._validate_and_override_config)."""


def uses_apex(training: TrainingSpec) -> bool:
    """The plan is priced on NeMo 1.x's distributed_fused_adam (TrainingSpec.optimizer_impl)."""
    return training.optimizer_impl == "apex"


def state_bytes(training: TrainingSpec) -> float:
    """Optimizer shard bytes per parameter: the remainders of a BF16 model's FP32 master (10), or the whole
    master where NeMo stores it -- FP8 parameters (fp8_param_gather, NeMo's fp8_params) or FP16 (12)."""
    whole = training.precision == "fp16" or training.fp8_param_gather
    return STATE_BYTES_PARAMS if whole else STATE_BYTES_REMAINDERS


def fp32_sync_params(model: ModelSpec, layout: Layout, stage: int) -> float:
    """Parameters on one GPU of pipeline `stage` whose gradients sync in FP32: its TP slice of the word
    (and position) embeddings on the first stage and of the output layer, or the tied embedding's copy,
    on the last [Setup, Grads]."""
    n = model.embedding_params if stage == 0 else 0
    if stage == layout.pp - 1 and (layout.pp > 1 or not model.tied_embeddings):
        n += model.vocab_size * model.hidden_size  # the output weight, or the last stage's copy of the tied one
    return n / layout.tp


def gradient_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, stage: int, params: float) -> float:
    """Gradient bytes one GPU of pipeline `stage` holds for its `params` parameters at the end of the last
    backward: the contiguous buffer in grad_sync_dtype (training.grad_dtype; FP32 for the embeddings and the
    output layer) and the reduced shards beside it, 1/(dp cp) of it [Grads]."""
    per = 2 if training.grad_dtype == "bf16" else 4
    fp32 = min(params, fp32_sync_params(model, layout, stage))
    buffer = per * (params - fp32) + FP32_SYNC_BYTES * fp32
    return buffer * (1 + 1 / (layout.dp * layout.cp))


def bucket_params(training: TrainingSpec) -> int:
    """Parameters per gradient (and parameter) bucket: 125 MiB of the grad_sync dtype [Buckets]."""
    return BUCKET_CAP_BYTES // (2 if training.grad_dtype == "bf16" else 4)


def problems(model: ModelSpec, training: TrainingSpec, layout: Layout, zero_rules: bool = True) -> list[str]:
    """What this engine does not run as the layout and workload say, or the planner does not price on it
    (zero_rules=False leaves out the ZeRO stage: a search offers 1 only, planner.space.zero_stages)."""
    bad = []
    if zero_rules and layout.zero_stage != 1:
        bad.append(f"optimizer_impl 'apex': DistributedFusedAdam shards the optimizer states and reduce-scatters the "
                   f"gradients over the data-parallel group (zero_stage 1), got zero_stage {layout.zero_stage}")
    if model.moe is not None or model.hybrid or model.mtp_layers:
        bad.append(f"optimizer_impl 'apex' is priced for dense transformer models only; {model.name} has "
                   f"{'experts' if model.moe is not None else 'Mamba-2 layers' if model.hybrid else 'MTP depths'}")
    return bad
