"""evaluate() on random layouts and workloads: every refusal is a one-line PlannerError naming what it
refuses, never another exception (the house rule: bad input gets a clear error, never a traceback).

Seeded, so a failure reproduces; the draw covers dense and MoE models, six clusters, every ZeRO stage,
recompute mode, FP8 recipe, optimizer engine, dispatcher and overlap flag, and workloads that do not
divide (a global batch of 7, sequences of 3,000 tokens)."""

from __future__ import annotations

import random

import pytest
import planner
from planner.errors import PlannerError
from planner.specs import Layout, TrainingSpec

MODELS = ["llama3-8b", "llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b",
          "llama4-maverick", "gpt3-1.3b"]
CLUSTERS = ["dgx-h100", "gb200-nvl72", "dgx-a100-40g", "dgx-b200", "mi300x", "h800"]
FP8 = [None] * 12 + ["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4", "rowwise", "torchao-tensorwise"]


def _draws(seed: int, count: int):
    """(model, cluster, TrainingSpec, Layout) the specs accept, `count` of them."""
    rng = random.Random(seed)
    models = {m: planner.load_model(m) for m in MODELS}
    out = []
    while len(out) < count:
        model = models[rng.choice(MODELS)]
        cluster = planner.load_cluster(rng.choice(CLUSTERS), nodes=rng.choice([1, 2, 4, 8, 16]))
        lay = dict(tp=rng.choice([1, 2, 4, 8]), pp=rng.choice([1, 1, 2, 2, 3, 4, 8]), cp=rng.choice([1, 1, 1, 2]),
                   zero_stage=rng.choice([0, 1, 1, 1, 2, 3]), micro_batch_size=rng.choice([1, 2, 3, 4]),
                   recompute=rng.choice(["none", "selective", "full"]), vpp=rng.choice([1] * 6 + [2, 3]),
                   sequence_parallel=rng.random() < 0.8, overlap_grad_reduce=rng.choice([True, False]),
                   overlap_param_gather=rng.choice([True, False]), tp_comm_overlap=rng.random() < 0.2,
                   overlap_p2p=rng.choice([True, False]))
        if model.moe is not None:
            lay.update(ep=rng.choice([1, 2, 4, 8, 16]), etp=rng.choice([1, 1, 2]), ep_overlap=rng.choice([True, False]),
                       moe_dispatcher=rng.choice(["alltoall", "allgather", "deepep"]))
        world = cluster.gpus_per_node * cluster.num_nodes
        if world % (lay["tp"] * lay["pp"] * lay["cp"]):
            continue
        lay["dp"] = world // (lay["tp"] * lay["pp"] * lay["cp"])
        tr = dict(global_batch_size=rng.choice([lay["dp"] * k for k in (1, 2, 4, 8)] + [7]),
                  seq_length=rng.choice([2048, 4096, 8192, 3000]), fp8=rng.choice(FP8),
                  optimizer_impl=rng.choice([None] * 6 + ["megatron", "deepspeed", "fsdp2"]),
                  kernels=rng.choice(["fused"] * 3 + ["unfused"]), grad_dtype=rng.choice(["bf16", "fp32"]),
                  optimizer_offload=rng.choice([0] * 8 + [0.5, 1.0]))
        if model.moe is not None:
            tr["moe_imbalance"] = rng.choice([1.0, 1.3])
            if rng.random() < 0.2:
                tr.update(moe_capacity_factor=rng.choice([1.0, 1.25]), moe_pad_to_capacity=rng.choice([True, False]))
        if rng.random() < 0.5:  # half the draws near a launchable layout, so the cost model is reached
            pp = next(p for p in (lay["pp"], 2, 1)
                      if model.num_layers % p == 0 and world % (p * lay["tp"] * lay["cp"]) == 0)
            lay.update(sequence_parallel=lay["tp"] > 1, vpp=1, overlap_param_gather=False, tp_comm_overlap=False,
                       overlap_p2p=False, pp=pp)
            lay["dp"] = world // (lay["tp"] * lay["pp"] * lay["cp"])
            if model.moe is not None:
                lay.update(etp=1, moe_dispatcher="alltoall", ep_overlap=False,
                           ep=max(e for e in (1, 2, 4, 8) if (lay["dp"] * lay["cp"] * lay["tp"]) % e == 0
                                  and model.moe.num_experts % e == 0))
            tr.update(global_batch_size=lay["dp"] * lay["micro_batch_size"] * rng.choice([1, 4]), seq_length=4096,
                      fp8=None, optimizer_impl=None, optimizer_offload=0, kernels="fused")
        try:  # the specs' own validators refuse the rest, which test_specs_catalog covers
            out.append((model, cluster, TrainingSpec(**tr), Layout(**lay)))
        except PlannerError:  # SpecError: the specs turn pydantic's errors into it
            continue
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_random_layouts_are_priced_or_refused_in_one_line(seed):
    priced = refused = 0
    for model, cluster, training, layout in _draws(seed, 60):
        try:
            plan = planner.evaluate(model, cluster, training, layout)
        except PlannerError as err:
            refused += 1
            text = str(err)
            assert text and "\n" not in text, f"{model.name} {layout.short()}: {text!r}"
            assert "Traceback" not in text
            continue
        priced += 1
        assert plan.step_time_s > 0 and plan.peak_memory_bytes > 0, f"{model.name} {layout.short()}"
    assert priced + refused == 60
    assert priced >= 10, f"only {priced} of 60 draws priced: the draw no longer reaches the cost model"
