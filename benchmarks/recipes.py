"""The planner's choice against NVIDIA's published MoE recipes, in the planner's own model.

    python benchmarks/recipes.py

For DeepSeek-V3, Qwen3-235B-A22B and GPT-OSS-120B on the GPU counts NVIDIA published: the
recipe's layout priced by `evaluate`, the planner's proven optimum over the same workload (with
the dispatchers the recipe could use, the EP overlap on and off, megatron-core's loss, which is what
Megatron-LM launches), priced with the recipe's loss, how much faster the optimum is in the planner's model, and the step-time terms that make the difference (largest first; they sum
to the gap). The published throughput sits beside both so the reader can judge the model too.
"""

from __future__ import annotations

import sys
import time

import planner
from planner.report import term_deltas
from runs import load_moe_runs

RECIPES = [  # rows of benchmarks/data/moe_runs.yaml
    "dgxc_v25.05_deepseek_v3_h100_1024gpu_bf16",
    "mbridge_26.06_dgx-gb300_deepseek_v3_256gpu_mxfp8",
    "mbridge_26.06_dgx-gb300_qwen3_235b_a22b_256gpu_mxfp8",
    "mbridge_26.02_dgx-gb200_gpt_oss_120b_64gpu_bf16",
    "mbridge_26.06_dgx-gb200_gpt_oss_120b_64gpu_mxfp8",
]


def main() -> int:
    runs = {r.id: r for r in load_moe_runs()[0]}
    for rid in RECIPES:
        r = runs[rid]
        nv = planner.evaluate(r.model, r.cluster, r.training, r.layout)
        dispatchers = ["alltoall", "deepep"] if r.layout.moe_dispatcher == "deepep" else ["alltoall"]
        t0 = time.perf_counter()
        # the planner searches what Megatron-LM launches (megatron-core's loss: it rejects Transformer
        # Engine's, which Megatron-Bridge's recipes run; BF16 attention: megatron-core 0.19.2 has no flag for
        # FP8 attention, which some of those recipes run); its choice is then priced with the recipe's loss
        # and attention, so the two layouts are compared on one loss and one attention kernel
        own = r.training.model_copy(update={"cross_entropy": "fp32", "fp8_attention": False})
        found = planner.plan(r.model, r.cluster, own, time_limit_s=120, moe_dispatcher=dispatchers, ep_overlap="both")
        took = time.perf_counter() - t0
        best = planner.evaluate(r.model, r.cluster, r.training, found.best.layout)
        print(f"{rid}  ({r.cluster.world_size} GPUs, published {r.tokens_per_s_per_gpu:,.0f} tokens/s/GPU)")
        print(f"  NVIDIA  {nv.layout.short()[:100]}  {nv.step_time_s:.2f} s")
        print(f"  planner {best.layout.short()[:100]}  {best.step_time_s:.2f} s  ({found.status}, {took:.0f} s)")
        print(f"  the recipe takes {nv.step_time_s / best.step_time_s - 1:+.1%} in the planner's model; terms: "
              + ", ".join(f"{k} {a - b:+.2f} s" for k, a, b in term_deltas(nv, best)[:4]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
