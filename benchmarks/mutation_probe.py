"""Mutation probe: plant one-line bugs in the cost and memory terms and see which tests catch them.

    python benchmarks/mutation_probe.py [--tests "tests/test_cost.py tests/test_memory.py ..."]

For each planted bug: does the test selection fail, and does the bug change the recommended layout
of any suite case (planner.plan on a few problems)? A bug that changes a recommendation and passes
every test is a hole in the tests. The working tree is restored after each mutant (git checkout).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (file, exact text, replacement, what the bug means)
MUTANTS = [
    ("planner/memory.py", "kw = dict(tp=t, cp=layout.cp,", "kw = dict(tp=t, cp=1,", "CP ignored in the ledger's activations"),
    ("planner/memory.py", 'layout.dp * layout.cp, "dpcp")', 'layout.dp, "dpcp")', "ZeRO shards over dp only"),
    ("planner/memory.py", "return float(min(p - stage, m))", "return float(min(p, m))", "1F1B in-flight count"),
    ("planner/deepspeed_engine.py", "LOSS_PEAK_SBV = 10\n", "LOSS_PEAK_SBV = 5\n", "DeepSpeed's logits memory halved"),
    ("planner/memory.py", 'grad_bytes = 2 if grad_dtype == "bf16" else 4', "grad_bytes = 2", "fp32 grads priced as bf16"),
    ("planner/memory.py", "MEGATRON_LOSS_PEAK_SBV = 6\n", "MEGATRON_LOSS_PEAK_SBV = 10\n",
     "Megatron's loss at 10 B a logit (saved copy + transient)"),
    ("planner/memory.py", "4 * s_loc * b * h / sp_div + peak * s_loc * b * V / t",
     "4 * s_loc * b * h / sp_div + peak * s_loc * b * V / (2 * t)", "Megatron's logits halved"),
    ("planner/cost.py", "return m * max(0.0, ag + again + rs + copies - window)", "return max(0.0, ag + again + rs + copies - window)",
     "ZeRO-3 gathers once per step"),
    ("planner/cost.py", "emb + self.layers * layer + out, out", "emb + layer + out, out",
     "FSDP units: one collective (one latency) for all layers"),
    ("planner/cost.py", "again = ag - out if uses_torchtitan(training) and not chunked else ag", "again = ag",
     "torchtitan re-gathers [norm, output] for backward"),
    ("planner/cost.py", "layers, out, model.tied_embeddings and p == 1)", "layers, out, False)",
     "torchtitan re-gathers the tied embedding for backward"),
    ("planner/cost.py", "return unit, unit + self.layers * layer, unit",
     "return unit, one(self.embedding) + one(self.output) + self.layers * layer, unit",
     "the tied [embedding, norm, output] unit gathered as two collectives"),
    ("planner/cost.py", "chunked = uses_torchtitan(training) and training.loss_chunks > 1", "chunked = False",
     "torchtitan's chunked loss keeps [norm, output] gathered"),
    ("planner/cost.py", "t += m * out + (m - 1) * max(", "t += out + (m - 1) * max(",
     "chunked loss under PP regathers the output once a step"),
    ("planner/specs.py", "return i >= k and (i - k + 1) % step == 0", "return i >= k and (i - k) % step == 0",
     "interleaved MoE layer first in its group (Megatron's order)"),
    ("planner/memory.py", "if model.moe.layer_step == 1 and layout.pipeline_layers is None:",
     "if layout.pipeline_layers is None:", "interleaved dense layers all counted on rank 0"),
    ("planner/space.py", "if c is None or s <= c:", "if c is None or s <= 2 * c:",
     "chunked attention planned one chunk past the sequence"),
    ("planner/cost.py", "fsdp = layout.zero_stage == 2 and not deepspeed", "fsdp = False",
     "Megatron-FSDP ZeRO-2 in Megatron's DDP buckets"),
    ("planner/comm.py", "return min(ring, pat_latency(cluster, group) + wire / NCCL_PAT_BUSBW)", "return ring",
     "PAT never chosen for one GPU per node"),
    ("planner/comm.py", "+ group.size * NCCL_PAT_RANK_S", "+ 0 * NCCL_PAT_RANK_S", "PAT's linear latency dropped"),
    ("planner/memory.py", 'return NVFP4_ELEMENT_BYTES if training.fp8 == "nvfp4" else 1.0', "return 1.0",
     "NVFP4 copies priced at FP8's byte"),
    ("planner/cost.py", 'peak = gpu.peak_fp4_flops if fp8 == "fp4" else', 'peak = gpu.peak_fp8_flops if fp8 == "fp4" else',
     "NVFP4 GEMMs at the FP8 peak"),
    ("planner/cost.py", "if k := bf16_layers_on(model, training, layout, stage):", "if k := 0:",
     "BF16 first/last layers priced in low precision"),
    ("planner/memory.py", "low = layers - bf16_layers_on(model, training, layout, stage)", "low = layers",
     "BF16 first/last layers keep low-precision weight copies"),
    ("planner/space.py", "return k * vpp if k else 1", "return 1", "the last rank may hold fewer than its BF16 layers"),
    ("planner/cost.py", 'return eff * (cal.fp8_gemm_in_training if kernels == "fused"', 'return eff * (1.0 if kernels == "fused"',
     "FP8 GEMMs at the isolated sweep's speed in training"),
    ("planner/cost.py", '(cal.fp8_gemm_in_training if kernels == "fused" else cal.fp8_gemm_in_training_unfused)',
     '(cal.fp8_gemm_in_training)', "one FP8 share for both kernel families"),
    ("planner/cost.py", "2 * v * send, hidden", "2 * send, hidden", "interleaved p2p not multiplied by v"),
    ("planner/cost.py", "gemm = 3 * n * _gemm_time(", "gemm = 0 * n * _gemm_time(", "last stage's logits GEMM dropped"),
    ("planner/cost.py", "return OutputTime(gemm, loss_seconds(model, cluster, training, layout))", "return OutputTime(gemm, 0.0)",
     "the loss's passes over the logits free"),
    ("planner/cost.py", "logits = output_time(model, cluster, training, layout).total if stage == p - 1 else 0.0",
     "logits = output_time(model, cluster, training, layout).total if stage == 0 else 0.0",
     "the output layer and the loss on the first rank"),
    ("planner/cost.py", "MEGATRON_LOSS_TRAFFIC_BYTES = (2 + 4) + 8 + 8 + (4 + 4 + 2)\n",
     "MEGATRON_LOSS_TRAFFIC_BYTES = 52\n", "Megatron's loss priced unfused while its config fuses it"),
    ("planner/cost.py", '"megatron-deepspeed": deepspeed_engine.LOSS_TRAFFIC_BYTES,',
     '"megatron-deepspeed": MEGATRON_LOSS_TRAFFIC_BYTES,', "Megatron-DeepSpeed's loss at Megatron's fused bytes"),
    ("planner/cost.py", "training.seq_length / layout.cp * model.vocab_size", "training.seq_length * model.vocab_size",
     "the loss over the whole sequence on every CP rank"),
    ("planner/torchtitan_engine.py", "return 76 if tp > 1 else 48", "return 48", "loss_parallel's passes at the one-rank loss's"),
    ("planner/cost.py", '"megatron-unfused": MEGATRON_UNFUSED_LOSS_TRAFFIC_BYTES,', '"megatron-unfused": MEGATRON_LOSS_TRAFFIC_BYTES,',
     "megatron-core's unfused loss priced as its fused one"),
    ("planner/emit/megatron.py", 'if t.cross_entropy != "unfused":', "if True:",
     "the loss fusion flag written for a plan priced unfused"),
    ("planner/comm.py", "reach = 1 - _miss(groups, group_topk, groups // nodes)", "reach = 1 - _miss(num_experts, top_k, per_node)",
     "group-limited routing ignored by DeepEP's node count"),
    ("planner/cost.py", "e.num_experts, e.router_groups, e.router_group_topk)", "e.num_experts)",
     "the MoE time priced without the model's group-limited routing"),
    ("planner/emit/megatron.py", "        if e.router_groups is not None:  # group-limited routing",
     "        if False:  # group-limited routing", "group-limited routing priced but not turned on"),
    ("planner/cost.py", "TE_LOSS_TRAFFIC_BYTES = 2 + 2 + 2\n", "TE_LOSS_TRAFFIC_BYTES = 32\n",
     "Transformer Engine's loss at megatron-core's passes"),
    ("planner/memory.py", "4 * s_loc * b * h / sp_div + 2 * s_loc * b * V / t + 12 * s_loc * b,",
     "4 * s_loc * b * h / sp_div + 6 * s_loc * b * V / t + 12 * s_loc * b,", "Transformer Engine's loss holding an FP32 copy"),
    ("planner/torchtitan_engine.py", "return 76 if tp > 1 else 8", "return 76 if tp > 1 else 48",
     "torchtitan's compiled chunk loss at the eager loss's passes"),
    ("planner/cost.py", "v, top = self.vpp, max(self.stage_units)", "v, top = 1, max(self.stage_units)",
     "bubble ignores interleaving"),
    ("planner/cost.py", "top - sum(self.stage_units)) // v", "top - len(self.stage_units) * top) // v",
     "fill and drain at the slowest stage's pace"),
    ("planner/cost.py", "return max(ranks, key=lambda u: u.units)", "return ranks[0]",
     "DP and optimizer priced on the first rank only"),
    ("planner/cost.py", 'return sum(self.attn_fwd if m == "core_attn"', 'return sum(0.0 if m == "core_attn"',
     "selective recompute free"),
    ("planner/cost.py", 'modules.append(("moe_act", 2 * rows', 'modules.append(("moe_act", 0.0 * rows',
     "moe_act recompute free"),
    ("planner/memory.py", "return model.mla is not None, model.moe is not None and moe_layer",
     "return False, model.moe is not None and moe_layer", "MLA's input norm not a module of its own (layernorm recompute)"),
    ("planner/memory.py", "freed += 2 * sb * a * (2 * (m.qk_head_dim", "freed += 0 * sb * a * (2 * (m.qk_head_dim",
     "mla_up_proj recompute frees nothing"),
    ("planner/memory.py", "freed += act_b * routed_rows(model, sb / sp_div, etp, moe_imbalance)",
     "freed += 2 * routed_rows(model, sb / sp_div, etp, moe_imbalance)", "moe_act under FP8 frees a BF16 FC2 input"),
    ("planner/memory.py", "return tuple(sh.params * MXFP8_GATHER_BYTES for sh in shards)",
     "return tuple(sh.params * 1 for sh in shards)", "MXFP8 weights gathered in FP8"),
    ("planner/cost.py", "rc = lt.fwd + lt.tp_fwd + lt.ep_fwd  #", "rc = lt.fwd + lt.ep_fwd  #", "full recompute skips TP comm"),
    ("planner/cost.py", "tp_fwd = tp_bwd = (attn_pair + mlp_pair) * cal.tp_comm_exposed",
     "tp_fwd = tp_bwd = attn_pair * cal.tp_comm_exposed", "one SP collective pair per layer instead of two"),
    ("planner/cost.py", "        grads *= m\n", "", "ZeRO-2 reduces once per step"),
    ("planner/cost.py", "return max(sum(t for t, _ in parts), total - window)", "return max(0.0, total - window)",
     "the last gradient bucket hidden too"),
    ("planner/cost.py", "cp_fwd = (cp - 1) * max(0.0, step - attn_step)", "cp_fwd = 0.0", "CP ring forward free"),
    ("planner/cost.py", "hidden = 2 * lt.fwd if layout.p2p_overlapped else 0.0", "hidden = 0.0",
     "interleaved p2p overlap ignored"),
    ("planner/cost.py", "+ max(rs / UB_PIPELINE_SPLITS, rs - proj)", "+ max(0.0, rs - proj)",
     "pipelined TP overlap hides its last chunk"),
    ("planner/cost.py", "share = UB_SMS / gpu.sm_count if gpu.sm_count else 0.0", "share = 0.0",
     "TE's reserved SMs free"),
    ("planner/comm.py", 'factor = 2 * (n - 1) / n if op == "allreduce" else (n - 1) / n',
     "factor = (n - 1) / n", "all-reduce priced as one ring pass"),
    ("planner/deepspeed_engine.py", "if cost[i][j] >= spread:", "if cost[i][j] > spread:",
     "DeepSpeed's split keeps the first cut among equal costs"),
    ("planner/torchtitan_engine.py", "shares = [base + (1 if s < extra else 0)",
     "shares = [base + (1 if s >= stages - extra else 0)", "torchtitan's remainder to the last stages"),
    ("planner/torchtitan_engine.py", "shares[-1] -= last_less", "shares[0] -= last_less",
     "torchtitan's output weight taken off the first stage"),
    ("planner/cpsat.py", "if p <= 3 or not sorted_middle:", "if p <= 3:",
     "middle ranks read as sorted in torchtitan's splits"),
    ("planner/cost.py", "share = (tp - 1) / tp", "share = 1.0", "async TP hides under whole GEMMs"),
    ("planner/cost.py", "if tp_comm_overlap and uses_torchtitan(training):", "if False:",
     "torchtitan's async TP priced as Transformer Engine's"),
    ("planner/space.py", '        update["kernels"] = TORCHTITAN_KERNELS\n', "",
     "torchtitan plans priced with Megatron's fused kernels"),
    ("planner/memory.py", "pipelined = fsdp2 and layout.pp > 1", "pipelined = False",
     "FSDP2 under torchtitan's pipeline resharded as without PP"),
    ("planner/cost.py", "t = max(0.0, ag - cluster.calibration.dp_overlap * layers * lt.fwd) + rs",
     "t = m * (max(0.0, ag - cluster.calibration.dp_overlap * layers * lt.fwd) + rs)",
     "FSDP2 under torchtitan's pipeline gathers in every micro-batch"),
    ("planner/space.py", "grad, param, p2p = zero == 0 and pp == 1, False,", "grad, param, p2p = zero == 0, False,",
     "torchtitan's pipeline reduces replicated gradients beside the last backward"),
    ("planner/memory.py", "fsdp2 = uses_torchtitan(training) and layout.zero_stage in (0, 3)",
     "fsdp2 = uses_torchtitan(training) and layout.zero_stage == 3",
     "torchtitan's replication priced with Megatron's bytes"),
    ("planner/uncertainty.py", '        return "moe"\n', '        return "dense"\n', "MoE jobs carry the dense runs' error"),
    ("planner/comm.py", "intra = max(0, twice * (group.size - 1) - inter)", "intra = 0",
     "a multi-node ring's intra-node steps free"),
    ("planner/comm.py", "tree = base + (2 * math.log2(nodes) - 1) * NCCL_NET_TREE_HOP_S", "tree = base + math.log2(nodes) * NCCL_NET_TREE_HOP_S",
     "tree all-reduce crosses log2(nodes) levels, not 2 log2"),
    # Mixture-of-Experts and MLA
    ("planner/cost.py", "alltoall_time(cluster, group, 2 * routed * h)", "alltoall_time(cluster, group, 2 * n * h)",
     "MoE: dispatch ignores top-k"),
    ("planner/comm.py", "net_bytes = tokens * row_bytes * remote_nodes(num_experts, top_k, group.nodes, groups, group_topk)",
     "net_bytes = tokens * row_bytes * top_k * (n - group.per_node) / n", "MoE: DeepEP sends every copy over the network"),
    ("planner/cost.py", "ep_t = 2 * (alltoall_time(", "ep_t = (alltoall_time(", "MoE: combine all-to-all free"),
    ("planner/comm.py", "max(nbytes * (n - k) / n / net, nbytes * (k - 1) / n / nvl)", "nbytes * (n - 1) / n / nvl",
     "MoE: cross-node all-to-all at NVLink speed"),
    ("planner/memory.py", "routed_params_per_layer(model) / (layout.ep * layout.expert_tp)\n    return dense",
     "routed_params_per_layer(model) / layout.ep\n    return dense", "MoE: experts split by EP only"),
    ("planner/memory.py", 'ParamShard(experts, layout.edp, "edp")', 'ParamShard(experts, layout.dp * layout.cp, "edp")',
     "MoE: expert states sharded over dp x cp"),
    ("planner/memory.py", "return tokens * model.moe.top_k * etp * imbalance", "return tokens * etp * imbalance",
     "MoE: routed rows ignore top-k"),
    ("planner/cost.py", "per_expert = rows / local", "per_expert = rows", "MoE: every local expert gets all rows"),
    ("planner/memory.py", "return (n - dup) / layout.tp + dup", "return n / layout.tp", "MoE: MLA down-projections split by TP"),
    ("planner/cost.py", "    if d:  # the leading dense layers", "    if False:  # the leading dense layers",
     "MoE: leading dense layers priced as MoE"),
    ("planner/cost.py", "full = 2 * b * (s / cp) * s * model.num_attention_heads * (dqk + dv) / tp",
     "full = 2 * b * (s / cp) * s * model.num_attention_heads * (2 * dv) / tp", "MoE: MLA core at d_v only"),
    ("planner/cost.py", "return (max(0.0, a_b - pre_f) + max(0.0, a_f - lt.mlp_bwd) + max(0.0, a_b - lt.mlp_fwd)",
     "return (max(0.0, a_b - pre_f) + max(0.0, a_f - lt.mlp_bwd) + max(0.0, a_b - 2 * lt.mlp_fwd)",
     "MoE: EP overlap hides dispatch_bwd behind twice mlp_fwd"),
    ("planner/cost.py", "        ep = paired + (ep - paired) * unpaired\n", "        ep = paired\n",
     "MoE: EP overlap's unpaired first forward / last backward free"),
    ("planner/memory.py", "extra = 1 if layout.ep_overlap else 0", "extra = 0", "MoE: EP overlap's extra micro-batch free"),
    # torchtitan's per-op checkpointing (Recompute.OP)
    ("planner/memory.py", "saved += 2 * sb * f / tp + 2 * sb * h  # w1 output", "saved += 2 * sb * f / tp  # w1 output",
     "op AC: w2's output not kept"),
    ("planner/cost.py", "ag_fwd = tp_fwd * (ag / (ag + rs) if sequence_parallel else 1.0)", "ag_fwd = tp_fwd",
     "op AC re-runs the kept reduce-scatters"),
    ("planner/cost.py", "op_rc = op_gemm + elem_t + cast_fwd * op_gemm / gemm + op_tp", "op_rc = op_gemm + op_tp",
     "op AC: elementwise recompute free"),
    # dropout-free GPT layers (MPT), the fused loss, Megatron's dropout flags
    ("planner/memory.py", 'mask = [(1 * sbh, "R")] if dropout else []', 'mask = [(1 * sbh, "R")]',
     "MPT: dropout masks kept without dropout"),
    ("planner/memory.py", "(2 + 2) * s_loc * b * V / t", "2 * s_loc * b * V / t", "fused loss: its gradient free"),
    ("planner/emit/megatron.py", "    if not m.uses_dropout:  # Megatron's defaults", "    if False:  # Megatron's defaults",
     "Megatron config runs dropout the ledger ignores"),
    # torchao tensor-wise float8: FP8 TP all-gathers, FSDP float8 all-gather
    ("planner/cost.py", "nbytes / 2 if training.fp8 in FLOAT8_TP_RECIPES else nbytes", "nbytes",
     "float8 TP all-gathers priced in BF16"),
    ("planner/memory.py", "per = 1 if training.fp8_param_gather else PARAM_BYTES", "per = PARAM_BYTES",
     "FSDP float8 all-gather: gathered layers kept in BF16"),
    # flash attention's speed by length; the combined 1F1B's extra layer
    ("planner/cost.py", "flash_length_factor(min(d, s / cp)))]",
     "flash_length_factor(min(d, s)))]", "flash speed read at the whole sequence under CP"),
    ("planner/cost.py", "(attn_eff * flash_speed_factor(model, s, cp, training.document_tokens) if flash", "(attn_eff if flash",
     "flash speed flat in the sequence length"),
    ("planner/cost.py", "return interp(math.log(max(keys, 1.0)), xs, ys) / ref",
     "return interp(keys, [math.exp(x) for x in xs], ys) / ref", "flash curve interpolated linearly"),
    ("planner/memory.py", 'items.append(MemoryItem("ep_overlap_layer", one,', 'items.append(MemoryItem("ep_overlap_layer", 0.0 * one,',
     "MoE: the combined 1F1B's extra layer free"),
    ("planner/memory.py", "extra = 1 if layout.ep_overlap else 0  #", "extra = 0  #",
     "MoE: the interleaved EP-overlap warm-up chunk free"),
    # DeepSpeed's engine: its wrapper, reduce buckets and reduction dtype
    ("planner/deepspeed_engine.py", "return REDUCE_BUCKET_ELEMENTS * per * (2 if overlap_comm(layout) else 1)",
     "return REDUCE_BUCKET_ELEMENTS * per", "DeepSpeed: overlap_comm's second bucket free"),
    ("planner/deepspeed_engine.py", "        return REDUCE_BUCKET_ELEMENTS * 2\n", "        return 0.0\n",
     "DeepSpeed: ZeRO-3's reduce bucket free"),
    ("planner/deepspeed_engine.py", 'if zero == 1 and fp32_accum and training.precision == "bf16" and not offload:',
     "if zero == 1 and fp32_accum and not offload:", "DeepSpeed: FP16 ZeRO-1 taken for BF16_Optimizer"),
    ("planner/cost.py", 'grad_b = GRAD_WIRE_BYTES if deepspeed or training.grad_dtype == "bf16" else 4',
     'grad_b = 2 if training.grad_dtype == "bf16" else 4', "DeepSpeed: gradients reduced in FP32"),
    ("planner/cost.py", "allreduce = layout.zero_stage == 0 or (deepspeed and wrapper(training, layout) == Wrapper.BF16)",
     "allreduce = layout.zero_stage == 0", "DeepSpeed: BF16_Optimizer reduce-scatters"),
    ("planner/cost.py", "return REDUCE_BUCKET_ELEMENTS if uses_deepspeed(training) else ddp_bucket_params(dp_cp)",
     "return ddp_bucket_params(dp_cp)", "DeepSpeed: Megatron's bucket size"),
    ("planner/space.py", "        return (1, 2, 3) if pp == 1 else (1,)\n", "        return (0, 1, 2, 3) if pp == 1 else (0, 1)\n",
     "DeepSpeed: BF16 ZeRO-0 searched"),
    ("planner/deepspeed_engine.py", "int(MAX_REUSE_DISTANCE // (2 * layer_params)) + 1", "int(MAX_REUSE_DISTANCE // layer_params) + 1",
     "DeepSpeed: ZeRO-3 reuse distance counted forward only"),
    ("planner/deepspeed_engine.py", "min(kept + PREFETCH_BUCKET_ELEMENTS, MAX_LIVE_PARAMETERS)", "min(kept, MAX_LIVE_PARAMETERS)",
     "DeepSpeed: ZeRO-3 prefetch bucket free"),
    ("planner/deepspeed_engine.py", "BF16_ACCUMULATION_BYTES = 2 + AUTOGRAD_ADD_BYTES + 6 + 12",
     "BF16_ACCUMULATION_BYTES = 2 + AUTOGRAD_ADD_BYTES + 6",
     "DeepSpeed: BF16_Optimizer's FP32 add free"),
    ("planner/cost.py", "    slope = (held[1] - held[0]) * per_param / hbm", "    slope = 0.0",
     "DeepSpeed: BF16_Optimizer accumulates the embedding only"),
    ("planner/cost.py", "kinds = [(i == 0, i == p - 1,", "kinds = [(False, i == p - 1,",
     "the first rank's pieces shared with the middle ones (its embedding's accumulation on every rank)"),
    ("planner/cpsat.py", "    if not any(per.values()):\n        return [None]", "    if True:\n        return [None]",
     "CP-SAT: one pipeline row for every ZeRO stage (ZeRO-1's accumulation priced at ZeRO-0/2)"),
    ("planner/deepspeed_engine.py", "    return LP_GRAD_BYTES\n", "    return 0.0\n",
     "DeepSpeed: BF16_Optimizer's BF16 gradients free"),
    ("planner/deepspeed_engine.py", "    return (m - 1) * AUTOGRAD_ADD_BYTES / m", "    return 0.0",
     "DeepSpeed: autograd's in-place add of later micro-batches free"),
    ("planner/torchtitan_engine.py", "    if not uses_torchtitan(training) or layout.pp == 1:\n        return 0.0\n    m = num",
     "    if True:\n        return 0.0\n    m = num", "FSDP2 under torchtitan's pipeline: the FP32 accumulation free"),
    # FSDP2 as torchtitan applies it
    ("planner/memory.py", "if uses_torchtitan(training) and zero_stage in (None, 0, 3):", "if False:",
     "FSDP2: Megatron's 18 B/param (no FP32 master shard)"),
    ("planner/memory.py", 'items.append(MemoryItem("fsdp2_output_layer", 2 * out * PARAM_BYTES,',
     'items.append(MemoryItem("fsdp2_output_layer", out * PARAM_BYTES,',
     "FSDP2: the output layer's unsharded gradient free"),
    ("planner/memory.py", "n = layers if pipelined else ZERO3_PREFETCH_LAYERS", "n = ZERO3_PREFETCH_LAYERS",
     "FSDP2: blocks resharded after forward under PP"),
    # GPT-OSS: windows, sinks, biases
    ("planner/cost.py", "return min(s, model.sliding_window + FLASH_KEY_TILE - 1)", "return min(s, model.sliding_window)",
     "GPT-OSS: window keys without the kernel's tile"),
    ("planner/cost.py", "return full * computed_score_share(model, s, document_tokens) if causal else full",
     "return full / 2 if causal else full", "GPT-OSS: windows priced as causal"),
    ("planner/specs.py", "return self.num_layers - (self.num_layers // n if n else 0)",
     "return self.num_layers - (self.num_layers // n + 1 if n else 0)", "GPT-OSS: one full-attention layer too many"),
    ("planner/specs.py", "return 3 * h * ffn + ((2 * ffn + h) if self.linear_bias else 0)", "return 3 * h * ffn",
     "GPT-OSS: expert biases not counted"),
    ("planner/emit/megatron.py", 'f"{m.sliding_window - 1},0"', 'f"{m.sliding_window},0"',
     "GPT-OSS: Megatron's window one key wider"),
    ("planner/cost.py", "back: self.gpu + self.h2d}", "back: self.gpu}", "offload: the copy back free"),
    ("planner/cost.py", "return cluster.host.memory_bandwidth * HOST_STREAM_EFFICIENCY / cluster.gpus_per_node",
     "return cluster.host.memory_bandwidth * HOST_STREAM_EFFICIENCY", "offload: CPU Adam with the node's bandwidth alone"),
    ("planner/torchtitan_engine.py", "OFFLOAD_HOST_BYTES = 4 + 4 + 4 + 4", "OFFLOAD_HOST_BYTES = 4 + 4 + 4",
     "FSDP2 offload: host without the FP32 gradient"),
    ("planner/cost.py", "h2d = OFFLOAD_H2D_BYTES_FSDP2 * (2 * shard - units.output_unit / sh.dp) / link",
     "h2d = OFFLOAD_H2D_BYTES_FSDP2 * shard / link", "FSDP2 offload: one H2D copy per micro-batch"),
    ("planner/cost.py", "return first + (m - 1) * later", "return m * first",
     "FSDP2 offload: later micro-batches accumulate on the GPU"),
    ("planner/cost.py", "(CPU_CLIP_BYTES + CPU_ADAM_BYTES) * psi / share", "CPU_ADAM_BYTES * psi / share",
     "FSDP2 offload: clipping on the host free"),
    ("planner/memory.py", "if fsdp2 and training.optimizer_offload:  # CPUOffloadPolicy", "if False:",
     "FSDP2 offload: the shard kept on the GPU"),
    ("planner/cost.py", "if not pairs and not fsdp2_offload:", "if not pairs:",
     "FSDP2 offload: no copies with one shard"),
    ("planner/cost.py", "        return d / (2 * s)\n", "        return 0.5\n", "documents: the whole sequence's triangle"),
    ("planner/cost.py", "work = [(full_layers * d / (2 * s), flash_length_factor(min(d, s / cp)))]",
     "work = [(full_layers * d / (2 * s), flash_length_factor(s / cp))]", "documents: the kernel at the sequence's length"),
    ("planner/cost.py", "k = min(d, _window_keys(model, s))", "k = _window_keys(model, s)",
     "documents: a window wider than its document"),
    ("planner/memory.py", "chunk = chunk_loss_peak_sbv(t) * s_loc * b * V / (t * n)",
     "chunk = chunk_loss_peak_sbv(t) * s_loc * b * V / t", "chunked loss: every chunk's logits held"),
    ("planner/torchtitan_engine.py", "return 4 if tp == 1 else 12", "return 10 if tp == 1 else 12",
     "torchtitan's compiled chunk loss at the eager 10 B a logit"),
    ("planner/memory.py", "(2 / sp_div + 2 + (2 if b > 1 else 0) + 4) * s_loc * b * h",
     "(2 / sp_div + 2 + 4) * s_loc * b * h", "chunked loss: the chunks' copies free"),
    ("planner/memory.py", "out * (2 * PARAM_BYTES + FSDP2_ACCUMULATED_GRAD_BYTES)", "2 * out * PARAM_BYTES",
     "chunked loss: the output layer's FP32 gradient free"),
    ("planner/cost.py", "gemm += ((n - 1) * torchtitan_engine.ACCUMULATE_BYTES", "gemm += ((0) * torchtitan_engine.ACCUMULATE_BYTES",
     "chunked loss: the output-layer accumulation free"),
    ("planner/space.py", "        update[\"loss_chunks\"] = TORCHTITAN_LOSS_CHUNKS\n", "        pass\n",
     "chunked loss: torchtitan priced with a whole-sequence loss"),
    ("planner/cost.py", "return max(self.chains.values()) if self.overlapped else sum(self.chains.values())",
     "return max(self.chains.values())", "ZeRO-Offload: copy, CPU step and copy back overlapped"),
    ("planner/deepspeed_engine.py", "CPU_STEP_BYTES = 28 + 6", "CPU_STEP_BYTES = 28", "ZeRO-Offload: the 16-bit copy on the host free"),
    ("planner/deepspeed_engine.py", "OFFLOAD_HOST_BYTES = 4 + 4 + 8 + 2", "OFFLOAD_HOST_BYTES = 4 + 4 + 8",
     "ZeRO-Offload: host without the pinned 16-bit copy"),
    ("planner/deepspeed_engine.py", 'training.precision == "bf16" and not offload:', 'training.precision == "bf16":',
     "ZeRO-Offload: BF16_Optimizer priced under offload"),
    ("planner/memory.py", "return states + offload_staging_bytes(model, training, layout, stage)", "return states",
     "ZeRO-Offload: the pinned staging buffer not on the host"),
    ("planner/memory.py", "MemoryItem(\"optimizer\", st.optimizer * kept,", "MemoryItem(\"optimizer\", st.optimizer,",
     "offload: the offloaded states kept on the GPU too"),
    ("planner/memory.py", "return deepspeed_offload_host_bytes(training, zero_stage) if uses_deepspeed(training) else OFFLOAD_HOST_BYTES",
     "return deepspeed_offload_host_bytes(training, zero_stage) if uses_deepspeed(training) else 12",
     "offload: host without the FP32 gradient"),
    ("planner/deepspeed_engine.py", "return _accumulation_element_bytes(training) + OFFLOAD3_STATE_BYTES",
     "return OFFLOAD_HOST_BYTES", "ZeRO-3 offload: host bytes priced as ZeRO-1/2's"),
    ("planner/memory.py", "return states + PARAM_BYTES * min(psi, SUB_GROUP_ELEMENTS)", "return states",
     "ZeRO-3 offload: the sub-group's 16-bit conversion not on the host"),
    ("planner/memory.py", 'host_grads = uses_deepspeed(training) and layout.zero_stage == 3 and bool(training.optimizer_offload)',
     'host_grads = False',
     "ZeRO-3 offload: the gradient partition kept on the GPU too"),
    ("planner/space.py", 'return (1, 2, 3) if training.grad_dtype == "fp32" else (3,)', "return (1, 2, 3)",
     "DeepSpeed ZeRO-1/2 offload priced with 16-bit accumulation"),
    ("planner/space.py", "else tuple(z for z in offload_zero_stages(training) if z == 1)", "else (1,)",
     "offload under a pipeline searches ZeRO-1 whatever the engine allows"),
    ("planner/cost.py", "return m * max(0.0, ag + again + rs + copies - window)",
     "return m * max(0.0, ag + again + rs - window) + copies", "ZeRO-3 offload: the gradient copies once a step"),
    ("planner/cpsat.py", "m.add(n[r] <= row.host_most[r]).only_enforce_if(lit)", "pass",
     "offload: host memory not a CP-SAT constraint"),
    ("planner/emit/torchtitan.py", 'FLOAT8_SKIPPED = ("lm_head",)', "FLOAT8_SKIPPED = ()",
     "torchtitan float8: the LM head converted too"),
    ("planner/cost.py", '        return units if sh.axis == "dpcp" else experts', "        return units",
     "Megatron-FSDP MoE: experts collected as the dense units"),
    ("planner/cost.py", '                t += 2 * u.times(cluster, group, "allgather", gather / sh.params)[1]',
     '                t += u.times(cluster, group, "allgather", gather / sh.params)[1]',
     "Megatron-FSDP MoE: weights gathered once per micro-batch"),
    ("planner/cost.py", "    moe_layers = layers - dense_layers_on(model, layout, stage)\n    return ShardUnits(0.0,",
     "    moe_layers = layers\n    return ShardUnits(0.0,", "Megatron-FSDP MoE: dense layers' experts collected"),
    ("planner/cost.py", "        if fsdp:  # Megatron-FSDP's per-unit groups", '        if fsdp and sh.axis == "dpcp":',
     "Megatron-FSDP MoE ZeRO-2: experts in DDP buckets"),
    ("planner/memory.py", "+ routed_params_per_layer(model) / (layout.ep * layout.expert_tp))", "+ 0)",
     "Megatron-FSDP MoE: gathered experts free"),
    ("planner/memory.py", "    if not uses_torchtitan(training):\n        return None\n", "    if True:\n        return None\n",
     "torchtitan's SP saves the sequence shard (as Megatron)"),
    ("planner/memory.py", "return 1.0 if training.fp8 in FLOAT8_TP_RECIPES else 2.0", "return 2.0",
     "torchao's float8 TP input saved in BF16"),
    ("planner/memory.py", "total += nbytes * saved_gather_bytes / 2", "total += nbytes / sp_div",
     "gathered GEMM inputs saved as the shard"),
    ("planner/torchtitan_engine.py", "return (16 if tp > 1 else 12) + (2 if pp > 1 else 0)", "return 10",
     "torchtitan's whole loss at Megatron's 10 B a logit"),
    ("planner/torchtitan_engine.py", "return (16 if tp > 1 else 12) +", "return 12 +",
     "loss_parallel's backward at the one-rank peak"),
    ("planner/torchtitan_engine.py", "(2 if pp > 1 else 0)", "0", "the last stage's held logits free"),
    ("planner/memory.py", "inputs = 2 * s_loc * b * h / sp_div + 2 * s_loc * b * h\n",
     "inputs = 4 * s_loc * b * h / sp_div\n", "torchtitan's output-layer input saved as the shard"),
    ("planner/space.py", "if lay.zero_stage > 1 and (uses_deepspeed(training) or uses_torchtitan(training)):",
     "if False:", "MoE ZeRO-2/3 allowed on engines that do not shard experts so"),
]

CASES = [  # (model, cluster, nodes, gbs, seq, launch target[, constraints])
    ("llama3-8b", "dgx-h100", 1, 64, 4096, "megatron"),
    ("llama3-70b", "dgx-h100", 8, 512, 8192, "megatron"),
    ("gpt3-175b", "dgx-a100-80g", 16, 1536, 2048, "megatron"),
    ("llama3-70b", "dgx-h100", 8, 64, 32768, "megatron"),
    ("qwen3-30b-a3b", "dgx-h100", 2, 1024, 4096, "megatron"),
    ("mixtral-8x7b", "dgx-h100", 4, 512, 4096, "megatron"),
    ("gpt-oss-120b", "dgx-b200", 8, 1280, 4096, "megatron"),
    ("llama3-8b", "dgx-h100", 2, 128, 8192, "deepspeed"),
    ("llama2-7b", "dgx-a100-40g", 4, 512, 4096, "deepspeed"),
    ("llama3.1-405b", "dgx-h100", 64, 1024, 8192, "torchtitan"),
    ("qwen2.5-72b", "hgx-h200", 16, 512, 8192, "torchtitan"),
    ("mixtral-8x7b", "dgx-h100", 2, 64, 4096, "megatron", {"pp": 1}),  # Megatron-FSDP shards the experts
    ("deepseek-v3", "dgx-h100", 32, 512, 4096, "megatron", {"pp": 1}),
]

RECOMMEND = """
import json, planner
out = []
for m, c, n, g, s, f, *kw in {cases}:
    r = planner.plan(planner.load_model(m), planner.load_cluster(c, nodes=n),
                     planner.TrainingSpec(global_batch_size=g, seq_length=s), top_k=1, structural=False,
                     time_limit_s=60, framework=f, **(kw[0] if kw else {{}}))
    out.append(r.best.layout.short() if r.best else r.status)
print(json.dumps(out))
"""


def recommendations() -> list[str]:
    done = subprocess.run([sys.executable, "-c", RECOMMEND.format(cases=CASES)], cwd=ROOT, capture_output=True,
                          text=True)
    return json.loads(done.stdout) if done.returncode == 0 else ["error: " + done.stderr.strip().splitlines()[-1]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", default="tests/test_cost.py tests/test_memory.py tests/test_moe.py tests/test_gpt_oss.py "
                                       "tests/test_fidelity.py tests/test_fp8.py tests/test_deepspeed.py "
                                       "tests/test_torchtitan_engine.py tests/test_offload.py")
    ap.add_argument("--only", default=None, help="run only the planted bugs whose description contains this text")
    args = ap.parse_args(argv)
    base = recommendations()
    holes = 0
    print(f"{'planted bug':45s} {'tests':>7s} {'changes a recommendation':>25s}")
    for path, old, new, what in MUTANTS:
        if args.only and args.only not in what:
            continue
        f = ROOT / path
        text = f.read_text()
        if old not in text:
            print(f"{what:45s} {'(text not found: probe out of date)':>33s}")
            holes += 1
            continue
        f.write_text(text.replace(old, new, 1))
        try:
            tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                    *args.tests.split()], cwd=ROOT, capture_output=True, text=True)
            if tests.returncode not in (0, 1, 2):  # 1: a test failed, 2: collection broke; else pytest did not run
                raise SystemExit(f"pytest exited {tests.returncode}: {tests.stdout.strip()[-300:]} {tests.stderr.strip()[-300:]}")
            caught = tests.returncode != 0
            changed = recommendations() != base
        finally:
            f.write_text(text)
        holes += changed and not caught
        print(f"{what:45s} {'caught' if caught else 'MISSED':>7s} {'yes' if changed else 'no':>25s}")
    print(f"\n{len(MUTANTS)} planted bugs; holes (a changed recommendation no test catches): {holes}")
    return 1 if holes else 0


if __name__ == "__main__":
    sys.exit(main())
