"""The planner's choice against NVIDIA's published recipes, in the planner's own model.

    python benchmarks/recipes.py [--dense | --moe | --torchtitan]

Dense: NeMo 24.07's performance-summary recipes (FP8 delayed scaling, Apex's DistributedFusedAdam,
the rows of benchmarks/data/published_runs.yaml with a complete layout): the recipe's layout priced by
`evaluate`, the planner's proven optimum over the same workload (framework 'any', since Megatron-LM does
not run Apex's optimizer; its default space, then, where the recipe interleaves more than
`space.MAX_VPP` virtual stages, a space widened to the recipe's), the gain and the terms behind it.

For DeepSeek-V3, Qwen3-235B-A22B and GPT-OSS-120B on the GPU counts NVIDIA published: the
recipe's layout priced by `evaluate`, the planner's proven optimum over the same workload (with
the dispatchers the recipe could use, the EP overlap on and off, megatron-core's loss, which is what
Megatron-LM launches), priced with the recipe's loss, how much faster the optimum is in the planner's model, and the step-time terms that make the difference (largest first; they sum
to the gap). The published throughput sits beside both so the reader can judge the model too.

torchtitan (--torchtitan): its published BF16 layouts (torchtitan's own benchmark pages, the compiled runs or
those that do not say; every one FSDP2, with TP where it ran it), each priced by `evaluate`, against the
planner's proven optimum for framework 'torchtitan' on the same workload, with the model's error on the
published layout beside it: a claim of the planner's is only as good as that error on the term it names.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import planner
from planner.report import term_deltas
from planner.space import MAX_VPP
from intervals import measured_step
from runs import load_moe_runs, load_runs

DENSE_RECIPES = [  # rows of benchmarks/data/published_runs.yaml: NeMo 24.07's performance summary
    "nemo2407_gpt3_175b_128gpu",
    "nemo2407_gpt3_175b_512gpu",
    "nemo2407_llama2_7b_8gpu",
    "nemo2407_llama2_13b_16gpu",
    "nemo2407_llama2_70b_64gpu",
    "nemo2407_llama3_8b_8gpu",
    "nemo2407_llama3_70b_64gpu",
]

RECIPES = [  # rows of benchmarks/data/moe_runs.yaml
    "dgxc_v25.05_deepseek_v3_h100_1024gpu_bf16",
    "mbridge_26.06_dgx-gb300_deepseek_v3_256gpu_mxfp8",
    "mbridge_26.06_dgx-gb300_qwen3_235b_a22b_256gpu_mxfp8",
    "mbridge_26.02_dgx-gb200_gpt_oss_120b_64gpu_bf16",
    "mbridge_26.06_dgx-gb200_gpt_oss_120b_64gpu_mxfp8",
]


TORCHTITAN_RECIPES = [  # rows of benchmarks/data/published_runs.yaml: torchtitan's own BF16 benchmarks
    "torchtitan_8b_8gpu_FSDP_torchcompile",
    "torchtitan_8b_128gpu_FSDP_torchcompile",
    "torchtitan_a100_llama3_8b_64gpu_selective_op",
    "torchtitan_a100_llama3_70b_64gpu_full",
    "torchtitan_h100_405b_128gpu_bf16",
]


def dense_runs() -> list:
    """The rows of DENSE_RECIPES, in that order."""
    runs = {r.id: r for r in load_runs(low_precision=True)}
    return [runs[rid] for rid in DENSE_RECIPES]


def widened(r) -> dict:
    """The plan() bound that holds the recipe's layout where the default space cannot (vpp above
    space.MAX_VPP); {} where it can."""
    return {"vpp": (1, r.layout.vpp)} if r.layout.vpp > MAX_VPP else {}


def dense_search(r, widen: dict):
    """The planner's proven optimum over a dense recipe's workload (framework 'any': Megatron-LM does not
    run Apex's optimizer), within the default space or `widen`."""
    return planner.plan(r.model, r.cluster, r.training, time_limit_s=60, framework="any", **widen)


def dense() -> list[float]:
    """Each dense recipe against the planner's optimum; returns the recipe's extra step time per recipe
    (the widened search's, where the default space cannot express the recipe)."""
    gains = []
    for r in dense_runs():
        rid = r.id
        nv = planner.evaluate(r.model, r.cluster, r.training, r.layout)
        print(f"{rid}  ({r.cluster.world_size} GPUs, published {r.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
              f"measured step {measured_step(r):.2f} s)")
        print(f"  NVIDIA  {nv.layout.short()[:100]}  {nv.step_time_s:.2f} s")
        spaces = [("default space", {})] + ([(f"vpp up to {r.layout.vpp}", widened(r))] if widened(r) else [])
        for name, widen in spaces:
            t0 = time.perf_counter()
            found = dense_search(r, widen)
            best = found.best  # priced on the recipe's own workload already
            gain = nv.step_time_s / best.step_time_s - 1
            print(f"  planner {best.layout.short()[:100]}  {best.step_time_s:.2f} s  ({name}: {found.status}, "
                  f"{time.perf_counter() - t0:.0f} s)")
            print(f"  the recipe takes {gain:+.1%} in the planner's model; terms: "
                  + (", ".join(f"{k} {a - b:+.2f} s" for k, a, b in term_deltas(nv, best)[:4]) or "none"))
        gains.append(gain)
    print(f"median of the {len(gains)}: {statistics.median(gains):+.1%}")
    return gains


def moe() -> None:
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


def torchtitan() -> list[float]:
    """Each torchtitan layout against the planner's optimum for framework 'torchtitan'; returns the
    published layout's extra step time in the planner's model, per layout."""
    runs = {r.id: r for r in load_runs()}
    gains = []
    for rid in TORCHTITAN_RECIPES:
        r = runs[rid]
        tt = planner.evaluate(r.model, r.cluster, r.training, r.layout)
        t0 = time.perf_counter()
        found = planner.plan(r.model, r.cluster, r.training, time_limit_s=60, framework="torchtitan")
        best = found.best
        gain = tt.step_time_s / best.step_time_s - 1
        err = tt.tokens_per_second / tt.num_gpus / r.tokens_per_s_per_gpu - 1
        print(f"{rid}  ({r.cluster.world_size} GPUs, published {r.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
              f"predicted {err:+.1%})")
        print(f"  torchtitan {tt.layout.short()[:100]}  {tt.step_time_s:.2f} s")
        print(f"  planner    {best.layout.short()[:100]}  {best.step_time_s:.2f} s  ({found.status}, "
              f"{time.perf_counter() - t0:.0f} s)")
        step = measured_step(r)
        print(f"  the published layout takes {gain:+.1%} in the planner's model ({step / best.step_time_s - 1:+.1%} "
              f"against its published step of {step:.2f} s); terms: "
              + (", ".join(f"{k} {a - b:+.2f} s" for k, a, b in term_deltas(tt, best)[:4]) or "none"))
        gains.append(gain)
    print(f"median of the {len(gains)}: {statistics.median(gains):+.1%}")
    return gains


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--dense", action="store_true", help="only NeMo 24.07's dense recipes")
    which.add_argument("--moe", action="store_true", help="only NVIDIA's MoE recipes")
    which.add_argument("--torchtitan", action="store_true", help="only torchtitan's published layouts")
    a = ap.parse_args(argv)
    everything = not (a.dense or a.moe or a.torchtitan)
    if everything or a.dense:
        dense()
    if everything or a.moe:
        moe()
    if everything or a.torchtitan:
        torchtitan()
    return 0


if __name__ == "__main__":
    sys.exit(main())
