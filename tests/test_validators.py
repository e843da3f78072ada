"""Every top-k plan of a suite of scenarios is accepted by the frameworks' own validators, and the
layer split Megatron computes equals the plan's; deliberately broken configs are rejected."""

import os

import pytest

import planner
from planner.check import CheckResult, megatron_payload
from planner.memory import stage_layers
from planner.search import plan
from planner.specs import Layout, TrainingSpec

TOP_K = 2

# (model, cluster, nodes, global batch, seq, constraints) -- dense GPT and Llama, 8 to 16384 GPUs
SCENARIOS = [
    ("gpt3-1.3b", "dgx-h100", 1, 256, 2048, {}),
    ("gpt3-2.7b", "dgx-a100-80g", 2, 512, 2048, {}),
    ("gpt3-6.7b", "dgx-a100-40g", 4, 512, 2048, {}),
    ("gpt3-13b", "dgx-a100-80g", 8, 1024, 2048, {"pp": (2, None)}),
    ("gpt3-175b", "dgx-a100-80g", 128, 1536, 2048, {}),
    ("gpt3-175b", "dgx-h100", 64, 512, 2048, {"recompute": "full"}),
    ("megatron-gpt-39b", "dgx-a100-80g", 64, 1536, 2048, {"vpp": (2, None)}),
    ("megatron-gpt-145b", "dgx-a100-80g", 192, 1536, 2048, {}),
    ("megatron-gpt-1t", "dgx-h100", 4096, 4096, 2048, {}),
    ("llama2-7b", "dgx-h100", 1, 256, 4096, {}),
    ("llama2-7b", "dgx-a100-40g", 4, 256, 4096, {"tp": 2}),
    ("llama3-8b", "dgx-h100", 1, 128, 8192, {}),
    ("llama3-8b", "dgx-h100", 8, 64, 32768, {"cp": (2, None)}),
    ("llama3-8b", "hgx-h200", 2, 128, 8192, {"pp": 2, "uneven_stages": True}),
    ("llama3-70b", "dgx-h100", 8, 128, 8192, {}),
    ("llama3-70b", "dgx-h100", 8, 128, 4096, {"cp": 1, "vpp": (2, None)}),
    ("llama3-70b", "dgx-h100", 64, 1024, 8192, {}),
    ("llama3-70b", "hgx-h200", 4, 64, 8192, {}),
    ("llama3-70b", "dgx-b200", 8, 256, 8192, {}),
    ("llama3-70b", "gb200-nvl72", 18, 288, 8192, {}),
    ("llama2-70b", "dgx-a100-80g", 16, 512, 4096, {"recompute": ["full"]}),
    ("llama2-70b", "dgx-h100", 16, 512, 4096, {"pp": (4, None), "cp": 1}),
    ("llama3.1-405b", "dgx-h100", 2048, 2048, 8192, {}),
    ("llama3.1-405b", "dgx-h100", 2048, 128, 131072, {}),
    ("llama3.1-405b", "dgx-h100", 64, 512, 8192, {}),
    ("llama3.1-405b", "dgx-b200", 32, 256, 8192, {}),
    ("mistral-7b", "dgx-h100", 2, 256, 8192, {}),
    ("mistral-7b", "mi300x", 1, 64, 8192, {"tp": 2}),
    ("qwen2.5-72b", "hgx-h200", 16, 512, 8192, {}),
    ("qwen2.5-72b", "dgx-h100", 16, 512, 4096, {"recompute": ["selective"], "cp": 1}),
    ("gpt3-13b", "dgx-h100", 2, 256, 2048, {"recompute": "full", "pp": (2, None)}),
    ("llama2-7b", "dgx-h100", 4, 512, 4096, {"pp": (2, None), "tp": 1}),
    ("llama3-70b", "dgx-h100", 16, 256, 8192, {"pp": (2, None), "rank_order": "tp-cp-pp-dp"}),
]


def _plans(framework):
    out = []
    for mref, cref, nodes, gbs, seq, cons in SCENARIOS:
        if framework != "megatron":
            cons = {k: v for k, v in cons.items() if k not in ("cp", "vpp", "uneven_stages", "rank_order")}
        if framework == "torchtitan" and cons.get("recompute") == ["selective"]:  # its selective is per-op
            cons = dict(cons, recompute=["op"])
        r = plan(planner.load_model(mref), planner.load_cluster(cref, nodes=nodes),
                 TrainingSpec(global_batch_size=gbs, seq_length=seq), top_k=TOP_K, structural=False,
                 framework=framework, **cons)
        if framework != "megatron" and r.status == "infeasible":  # e.g. 128K context without CP: a real answer
            continue
        assert r.status == "optimal", (mref, cref, nodes, r.status)
        out += [(f"{mref}/{cref}x{nodes}/s{seq}", p) for p in (r.best, *r.alternatives)]
    return out


def test_a_megatron_that_cannot_be_imported_is_a_one_line_error_and_the_next_check_runs(tmp_path, monkeypatch,
                                                                                        megatron_path):
    """The worker is kept between checks, per import path: one whose Megatron fails to import is
    reported in one line naming the cause, and dropped; the real one still serves the next check."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    fake = tmp_path / "megatron" / "training"
    fake.mkdir(parents=True)
    (tmp_path / "megatron" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "arguments.py").write_text("raise RuntimeError('planted import failure')\n")
    p = planner.evaluate(planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1),
                         TrainingSpec(global_batch_size=8, seq_length=4096), Layout(dp=8))
    payload = megatron_payload(p.to_megatron().args, 8, p.to_megatron().env, p.cluster.gpu.arch)
    with monkeypatch.context() as env:
        env.setenv("MEGATRON_PATH", str(tmp_path))
        with pytest.raises(planner.PlannerError, match="could not run: RuntimeError: planted import failure$"):
            check_megatron([payload])
    assert [r.ok for r in check_megatron([payload, payload])] == [True, True]


def _expected_split(p):
    """Layers per rank and virtual stage the plan priced: its explicit split, else even chunks."""
    lay, v = p.layout, p.layout.vpp
    if lay.pipeline_layers is not None:
        return [[lay.pipeline_layers[c * lay.pp + r] for c in range(v)] for r in range(lay.pp)]
    return [[n // v] * v for n in stage_layers(p.model, lay)]


def test_megatron_accepts_every_topk_plan(megatron_path):
    pytest.importorskip("torch")
    from planner.check import check_megatron

    plans = _plans("megatron")
    assert len(plans) >= 2 * 30
    results = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, p.cluster.gpu.arch)
                              for _, p in plans])
    rejected = [(name, p.layout.short(), r.line()) for (name, p), r in zip(plans, results) if not r.ok]
    assert rejected == []
    assert any(p.layout.pipeline_layers is not None for _, p in plans)  # the search's own arbitrary splits
    for (name, p), r in zip(plans, results):
        assert r.details["layers_per_rank"] == _expected_split(p), name
        assert r.details["dp"] == p.layout.dp
        assert r.details["num_microbatches"] == p.time.pipeline.num_microbatches
        # dropout runs where the ledger keeps its masks (GPT), nowhere else (Megatron's default is 0.1)
        dropout = 0.1 if p.model.uses_dropout else 0.0
        assert (r.details["hidden_dropout"], r.details["attention_dropout"]) == (dropout, dropout), name
        # the loss the cost model prices (cost.MEGATRON_LOSS_TRAFFIC_BYTES): megatron-core's fused one
        assert r.details["cross_entropy"] == "native", name


@pytest.mark.parametrize("change,stage", [
    (["--tensor-model-parallel-size", "3"], "validate_args"),  # 64 % 3 != 0
    (["--num-virtual-stages-per-pipeline-rank", "3"], "layer_split"),  # 20 layers per rank % 3 (TransformerBlock)
    (["--recompute-granularity", "full"], "model_config"),  # full needs a method and a count
    (["--bogus-flag"], "argparse"),
])
def test_megatron_rejects_broken_configs(megatron_path, change, stage):
    pytest.importorskip("torch")
    from planner.check import check_megatron

    p = planner.evaluate(planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100", nodes=8),
                         TrainingSpec(global_batch_size=128, seq_length=4096),
                         planner.Layout(tp=4, pp=4, dp=4, zero_stage=1, sequence_parallel=True))
    args = list(p.to_megatron().args) + change
    r = check_megatron([megatron_payload(args, 64, p.to_megatron().env)])[0]
    assert not r.ok and r.stage == stage, r.line()


def test_megatron_needs_cuda_device_max_connections_for_tp(megatron_path):
    pytest.importorskip("torch")
    from planner.check import check_megatron

    p = planner.evaluate(planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100"),
                         TrainingSpec(global_batch_size=16, seq_length=4096), planner.Layout(tp=2, dp=4, zero_stage=1))
    ok, missing = check_megatron([megatron_payload(p.to_megatron().args, 8, p.to_megatron().env),
                                  megatron_payload(p.to_megatron().args, 8, {})])
    assert ok.ok and not missing.ok and "CUDA_DEVICE_MAX_CONNECTIONS" in missing.message


def test_deepspeed_accepts_every_topk_plan():
    pytest.importorskip("deepspeed")
    from planner.check import check_deepspeed

    from planner.deepspeed_engine import wrapper

    plans = _plans("deepspeed")
    assert len(plans) >= 2 * 25
    wrappers = set()
    for name, p in plans:
        files = p.to_deepspeed()
        r = check_deepspeed(files.config, p.num_gpus, tp=p.layout.tp, pp=p.layout.pp, num_layers=p.model.num_layers)
        assert r.ok, (name, p.layout.short(), r.line())
        if p.layout.pp > 1:  # the split priced is the one DeepSpeed's own partitioner makes
            assert r.details["stage_layers"] == stage_layers(p.model, p.layout), (name, p.layout.short())
        assert r.details["gradient_accumulation_steps"] == p.time.pipeline.num_microbatches
        # the wrapper DeepSpeed's engine builds for the config is the one the plan is priced with
        assert r.details["optimizer_wrapper"] == DEEPSPEED_WRAPPER_NAMES[wrapper(p.training, p.layout)], (name, p.layout.short())
        wrappers.add(r.details["optimizer_wrapper"])
    assert wrappers >= {"bf16", "zero_optimization"}


DEEPSPEED_WRAPPER_NAMES = {"BF16_Optimizer": "bf16", "DeepSpeedZeroOptimizer": "zero_optimization",
                           "DeepSpeedZeroOptimizer_Stage3": "zero_optimization", "FP16_Optimizer": "fp16"}
"""DeepSpeed's own constants for the wrappers (deepspeed/runtime/constants.py: BFLOAT16, ZERO_OPTIMIZATION, FP16)."""


@pytest.mark.parametrize("precision,grad_accum,zero,answer", [
    ("bf16", "fp32", 0, "unsupported mix"), ("bf16", "bf16", 0, "ddp_bf16"), ("fp16", "fp32", 0, "unsupported mix"),
    ("bf16", "fp32", 1, "bf16"), ("bf16", "bf16", 1, "zero_optimization")])
def test_deepspeed_engine_picks_the_wrapper_the_planner_prices_or_refuses(precision, grad_accum, zero, answer):
    """DeepSpeed's own _do_optimizer_sanity_check on the config: ZeRO-0 with BF16 weights is refused
    (FP32 accumulation) or runs Adam on the BF16 weights without master weights (ddp_bf16), which
    the planner refuses too; ZeRO-1 with FP32 accumulation is BF16_Optimizer."""
    pytest.importorskip("deepspeed")
    from planner.check import check_deepspeed
    from planner.deepspeed_engine import wrapper
    from planner.errors import SpecError

    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
           precision: {"enabled": True}, "zero_optimization": {"stage": zero}, "data_types": {"grad_accum_dtype": grad_accum}}
    r = check_deepspeed(cfg, 8)
    got = r.details.get("optimizer_wrapper") if r.ok else r.message
    assert answer in got, r.line()
    t = TrainingSpec(global_batch_size=64, seq_length=4096, precision=precision,
                     grad_dtype="fp32" if grad_accum == "fp32" else "bf16", optimizer_impl="deepspeed")
    if zero == 0:
        with pytest.raises(SpecError, match="DeepSpeed without ZeRO"):
            wrapper(t, planner.Layout(dp=8, zero_stage=zero))
    else:
        assert DEEPSPEED_WRAPPER_NAMES[wrapper(t, planner.Layout(dp=8, zero_stage=zero))] == answer


@pytest.mark.parametrize("mutate,fragment", [
    (lambda c: c.update(gradient_accumulation_steps=c["gradient_accumulation_steps"] + 1), "train_batch_size is not equal"),
    (lambda c: c["zero_optimization"].update(bogus_knob=1), "ValidationError"),
    (lambda c: c.update(fp16={"enabled": True}), ""),
    (lambda c: c["zero_optimization"].update(stage=4), "ValidationError"),
])
def test_deepspeed_rejects_broken_configs(mutate, fragment):
    pytest.importorskip("deepspeed")
    import copy

    from planner.check import check_deepspeed

    p = planner.evaluate(planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=2),
                         TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_impl="deepspeed"),
                         planner.Layout(tp=2, dp=8, zero_stage=2))
    cfg = copy.deepcopy(p.to_deepspeed().config)
    mutate(cfg)
    r = check_deepspeed(cfg, 16, tp=2)
    assert not r.ok and fragment in r.message, r.line()


def test_deepspeed_pipeline_rejects_zero2():
    pytest.importorskip("deepspeed")
    from planner.check import check_deepspeed

    r = check_deepspeed({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16,
                         "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}, 16, tp=2, pp=2)
    assert not r.ok and r.stage == "pipeline_engine"


def test_checkresult_line():
    assert CheckResult(False, "config", "boom").line() == "ERROR [config] boom"
    assert CheckResult(True, "done", "", {"dp": 2}).line() == "OK dp=2"


def test_torchtitan_accepts_every_topk_plan():
    pytest.importorskip("torchtitan")
    from planner.check import check_torchtitan
    from planner.emit.torchtitan import torchtitan_config_name

    plans = _plans("torchtitan")
    assert len(plans) >= 2 * 25
    for name, p in plans:
        module, config = torchtitan_config_name(p)
        r = check_torchtitan(list(p.to_torchtitan().args), p.num_gpus, module=module, config=config,
                             num_layers=p.model.num_layers)
        assert r.ok, (name, p.layout.short(), r.line())
        if p.layout.tp > 1:  # torchtitan turns sequence parallelism on with TP unless the flags say otherwise
            assert r.details["sequence_parallel"] == p.layout.sequence_parallel, (name, p.layout.short())
        if p.layout.pp > 1:  # torchtitan's own pipeline code places the plan's layers per virtual stage
            stages = p.layout.pp * p.layout.vpp
            assert r.details["virtual_stages"] == stages
            assert r.details["stage_layers"] == list(p.layout.pipeline_layers or [p.model.num_layers // stages] * stages)


@pytest.mark.parametrize("sp", [True, False])
def test_torchtitan_runs_the_plans_sequence_parallelism(sp):
    """torchtitan 0.3 turns sequence parallelism on with TP by default (config/configs.py:
    ParallelismConfig.enable_sequence_parallel = True), and its ledger differs (DTensor keeps the gathered
    QKV and FC1 inputs): a TP plan without SP must say so, and torchtitan's parser must read it back."""
    pytest.importorskip("torchtitan")
    from planner.check import check_torchtitan
    from planner.space import framework_training

    t = framework_training(TrainingSpec(global_batch_size=64, seq_length=4096), "torchtitan")
    p = planner.evaluate(planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1), t,
                         Layout(tp=2, dp=4, zero_stage=3, sequence_parallel=sp, recompute="full"))
    files = p.to_torchtitan()
    r = check_torchtitan(list(files.args), p.num_gpus)
    assert r.ok, r.line()
    assert (r.details["tp"], r.details["sequence_parallel"]) == (2, sp)
    # torchtitan 0.2 has no key to turn SP off: no 0.2-style TOML for such a plan, and asked for, a one-line refusal
    assert ("job.toml" in files.files) == sp
    if not sp:
        from planner.emit.torchtitan import torchtitan_toml

        with pytest.raises(planner.PlannerError, match="TOML is not written for TP without sequence parallelism"):
            torchtitan_toml(p)


@pytest.mark.parametrize("mref, nodes, cons", [("llama3-8b", 2, {}), ("llama3-70b", 8, {"tp": [8], "pp": [1]})])
def test_torchtitan_runs_float8_on_exactly_the_linears_the_plan_prices(tmp_path, mref, nodes, cons):
    """An FP8 (torchao rowwise) torchtitan plan: train.sh names the emitted planner_job.py as --module
    and --config, and torchtitan 0.3's own ConfigManager, building the registry model through its
    Float8LinearConverter, turns every decoder linear into Float8Linear (torchtitan fuses Q, K, V:
    wqkv, wo, w1, w2, w3 per layer) and keeps the LM head in BF16 -- the linears the cost model prices
    in FP8 and the logits GEMM it prices in BF16. No 0.2-style TOML is written for it."""
    pytest.importorskip("torchtitan")
    from planner.check import check_torchtitan

    m = planner.load_model(mref)
    r = plan(m, planner.load_cluster("dgx-h100", nodes=nodes), TrainingSpec(global_batch_size=64, seq_length=4096,
             fp8="rowwise"), framework="torchtitan", top_k=1, structural=False, **cons)
    files = r.best.to_torchtitan()
    assert sorted(files.files) == ["planner_job.py", "train.sh"]
    assert '--module "${MODULE:-planner_job}" --config "${CONFIG:-planner_job}"' in files.files["train.sh"]
    files.write(tmp_path)
    res = check_torchtitan(list(files.args), r.best.num_gpus, module="planner_job", config="planner_job",
                           folder=str(tmp_path), num_layers=m.num_layers)
    assert res.ok, res.line()
    assert res.details["float8_linears"] == 5 * m.num_layers and res.details["high_precision_linears"] == ["lm_head"]


def test_torchtitan_rejects_broken_overrides():
    pytest.importorskip("torchtitan")
    from planner.check import check_torchtitan

    bad_product = ["--parallelism.data_parallel_shard_degree", "3", "--parallelism.tensor_parallel_degree", "2"]
    r = check_torchtitan(bad_product, 8)
    assert not r.ok and r.stage == "parallel_dims"
    r = check_torchtitan(["--parallelism.tensor_paralel_degree", "2"], 8)  # misspelt key
    assert not r.ok and r.stage == "config"


def test_megatron_accepts_explicit_splits_with_the_plans_layer_counts(megatron_path):
    """--pipeline-model-parallel-layout from Layout.pipeline_layers (any split, uneven interleaved
    chunks included): megatron-core 0.19.2 accepts it and builds exactly the plan's layers per
    rank and virtual stage."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    m, c = planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100", nodes=8)
    t = TrainingSpec(global_batch_size=64, seq_length=4096)
    layouts = [Layout(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True, pipeline_layers=(18, 21, 21, 20)),
               Layout(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True, vpp=2,
                      pipeline_layers=(8, 11, 11, 10, 10, 10, 10, 10)),
               Layout(tp=4, pp=2, dp=8, zero_stage=1, sequence_parallel=True, vpp=2, pipeline_layers=(19, 21, 21, 19))]
    plans = [planner.evaluate(m, c, t, lay) for lay in layouts]
    results = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, p.cluster.gpu.arch)
                              for p in plans])
    for p, r in zip(plans, results):
        lay = p.layout
        assert r.ok, r.line()
        assert r.details["layers_per_rank"] == [[lay.pipeline_layers[v * lay.pp + k] for v in range(lay.vpp)]
                                                for k in range(lay.pp)]


def test_megatron_accepts_nvfp4_plans_and_runs_te_nvfp4(megatron_path):
    """An NVFP4 plan on B200: megatron-core 0.19.2 accepts --fp4-format e2m1 --fp4-recipe nvfp4 and its
    TransformerConfig carries FP4 and no FP8 (the two exclude each other in validate_args)."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    c = planner.load_cluster("dgx-b200", nodes=1)
    p = plan(planner.load_model("llama3-8b"), c, TrainingSpec(global_batch_size=16, seq_length=4096, fp8="nvfp4"),
             top_k=1, structural=False, time_limit_s=60).best
    args = p.to_megatron().args
    assert "--fp4-format" in args and "--fp8-format" not in args
    r, = check_megatron([megatron_payload(args, p.num_gpus, p.to_megatron().env, p.cluster.gpu.arch)])
    assert r.ok, r.line()
    assert r.details["fp4"] == "e2m1" and r.details["fp4_recipe"].endswith("nvfp4") and not r.details["fp8"]


def test_megatron_accepts_bf16_first_last_layers(megatron_path):
    """--first-last-layers-bf16 with its two counts, under NVFP4 over two pipeline ranks and under FP8
    current scaling on one: accepted (megatron-core 0.19.2 bounds each count by num_layers // pp) and
    carried into TransformerConfig as emitted."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    m = planner.load_model("llama3-8b")
    plans = [planner.evaluate(m, planner.load_cluster("dgx-b200", nodes=1),
                              TrainingSpec(global_batch_size=16, seq_length=4096, fp8="nvfp4", bf16_first_layers=2,
                                           bf16_last_layers=1), Layout(tp=2, pp=2, dp=2, sequence_parallel=True)),
             planner.evaluate(m, planner.load_cluster("dgx-h100", nodes=1),
                              TrainingSpec(global_batch_size=16, seq_length=4096, fp8="tensorwise", bf16_first_layers=1,
                                           bf16_last_layers=1), Layout(dp=8))]
    results = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, p.cluster.gpu.arch)
                              for p in plans])
    for p, r in zip(plans, results):
        assert r.ok, r.line()
        assert r.details["bf16_end_layers"] == [p.training.bf16_first_layers, p.training.bf16_last_layers]


def test_megatron_accepts_fp8_plans_and_runs_their_recipe(megatron_path):
    """Every FP8 recipe Megatron offers, on a GPU that runs it: accepted, and TransformerConfig
    carries the recipe (the flag is not dropped)."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    m = planner.load_model("llama3-8b")
    plans = []
    for cluster, nodes, recipe in (("dgx-h100", 1, "delayed"), ("dgx-h100", 1, "tensorwise"),
                                   ("hgx-h200", 1, "blockwise"), ("gb200-nvl72", 18, "mxfp8")):
        c = planner.load_cluster(cluster, nodes=nodes)
        r = plan(m, c, TrainingSpec(global_batch_size=c.world_size * 2, seq_length=4096, fp8=recipe), top_k=1,
                 structural=False, time_limit_s=60)
        plans.append(r.best)
    results = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, p.cluster.gpu.arch)
                              for p in plans])
    for p, r in zip(plans, results):
        assert r.ok, r.line()
        assert r.details["fp8"] == "hybrid" and r.details["fp8_recipe"] == p.training.fp8
        assert r.details["fp8_param"] is False
    gathered = plan(m, planner.load_cluster("dgx-h100", nodes=1),
                    TrainingSpec(global_batch_size=16, seq_length=4096, fp8="delayed", fp8_param_gather=True),
                    top_k=1, structural=False, time_limit_s=60, zero_stage=1).best
    r = check_megatron([megatron_payload(gathered.to_megatron().args, gathered.num_gpus, gathered.to_megatron().env, 9)])[0]
    assert r.ok and r.details["fp8_param"] is True
    assert r.details["fp8_dot_product_attention"] is False


def test_megatron_accepts_bf16_adam_states(megatron_path):
    pytest.importorskip("torch")
    from planner.check import check_megatron

    p = planner.evaluate(planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100"),
                         TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_states="bf16"),
                         planner.Layout(tp=2, dp=4, zero_stage=1, sequence_parallel=True))
    r = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, 9)])[0]
    assert r.ok, r.line()
    assert r.details["precision_aware_optimizer"] and r.details["exp_avg_dtype"] == "torch.bfloat16"


def test_megatron_accepts_optimizer_offload(megatron_path):
    """The searched 70B-on-one-node plan offloads its whole optimizer shard: megatron-core 0.19.2's
    validate_args accepts the flags (its offload check needs --use-precision-aware-optimizer) and keeps
    the fraction and the overlap; half a shard on H100 too."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    m, c = planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100", nodes=1)
    full = plan(m, c, TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=1.0), top_k=1,
                structural=False, time_limit_s=60).best
    half = planner.evaluate(planner.load_model("llama3-8b"), c,
                            TrainingSpec(global_batch_size=64, seq_length=4096, optimizer_offload=0.5),
                            planner.Layout(tp=2, dp=4, zero_stage=1, sequence_parallel=True))
    results = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, 9)
                              for p in (full, half)])
    for p, r in zip((full, half), results):
        assert r.ok, r.line()
        assert r.details["optimizer_cpu_offload"] and r.details["precision_aware_optimizer"]
        assert r.details["optimizer_offload_fraction"] == p.training.optimizer_offload
        assert r.details["overlap_cpu_optimizer_d2h_h2d"]
        assert p.to_megatron().env["OMP_NUM_THREADS"] == "14"  # 112 cores over 8 ranks


def test_megatron_accepts_qwen2_moe_and_builds_its_shared_expert_gate(megatron_path):
    """A searched Qwen1.5-MoE-A2.7B plan (from its Hugging Face config): megatron-core 0.19.2 accepts
    --moe-shared-expert-gate, and its TransformerConfig gates a shared expert of the config's width."""
    pytest.importorskip("torch")
    from planner.catalog import model_from_hf_config
    from planner.check import check_megatron
    from tests.test_moe import QWEN15_MOE_HF

    m = model_from_hf_config(QWEN15_MOE_HF, "qwen1.5-moe")
    c = planner.load_cluster("dgx-h100", nodes=1)
    p = plan(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), top_k=1, structural=False, time_limit_s=60).best
    assert "--moe-shared-expert-gate" in p.to_megatron().args
    r, = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, 9)])
    assert r.ok, r.line()
    assert r.details["moe_shared_expert_gate"] and r.details["moe_shared_expert_intermediate_size"] == 5632


def test_megatron_accepts_moe_plans_and_builds_their_expert_grid(megatron_path):
    """Searched MoE plans (Mixtral, Qwen3-30B-A3B; etp = tp and etp = 1) are accepted, and Megatron's
    own process groups have the plan's expert degrees: ep, etp and edp = tp cp dp / (ep etp)."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    plans = []
    for ref, nodes, fp8, kw in (("qwen3-30b-a3b", 2, "blockwise", {}), ("mixtral-8x7b", 2, None, {"tp": 2, "etp": 1}),
                                ("mixtral-8x7b", 4, None, {"tp": 4, "etp": 4})):
        c = planner.load_cluster("dgx-h100", nodes=nodes)
        r = plan(planner.load_model(ref), c, TrainingSpec(global_batch_size=512, seq_length=4096, fp8=fp8), top_k=2,
                 structural=False, time_limit_s=60, **kw)
        plans += [r.best, *r.alternatives[:1]]
    results = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, p.cluster.gpu.arch)
                              for p in plans])
    for p, r in zip(plans, results):
        lay = p.layout
        assert r.ok, (lay.short(), r.line())
        assert (r.details["ep"], r.details["etp"], r.details["edp"]) == (lay.ep, lay.expert_tp, lay.edp), lay.short()
        assert r.details["num_experts"] == p.model.moe.num_experts
    assert any(p.layout.ep > 1 for p in plans)


def test_megatron_fsdp_with_experts_is_searched_emitted_and_accepted_by_megatron(megatron_path):
    """Mixtral on two DGX H100 without a pipeline (pp 1) at GBS 256, the ZeRO stage left to the search: it
    shards weights, gradients and experts with Megatron-FSDP (each layer's experts over the expert-data-parallel
    group), faster than the best it finds held to ZeRO 0/1, and megatron-core 0.19.2 accepts both plans'
    arguments and builds the expert grid they describe."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    m, c = planner.load_model("mixtral-8x7b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=256, seq_length=4096)
    free = plan(m, c, t, top_k=1, pp=1)
    held = plan(m, c, t, top_k=1, pp=1, zero_stage=[0, 1])
    assert free.status == held.status == "optimal"
    best = free.best
    assert best.layout.zero_stage in (2, 3) and best.layout.ep > 1
    assert best.time.total < held.best.time.total
    e = best.to_megatron()
    assert "--use-megatron-fsdp" in e.args and "--expert-model-parallel-size" in e.args
    results = check_megatron([megatron_payload(p.to_megatron().args, 16, p.to_megatron().env, c.gpu.arch)
                              for p in (best, held.best)])
    for p, r in zip((best, held.best), results):
        assert r.ok, (p.layout.short(), r.line())
        assert (r.details["ep"], r.details["edp"]) == (p.layout.ep, p.layout.edp)


def test_megatron_accepts_deepseek_v3_with_mla_and_leading_dense_layers(megatron_path):
    """DeepSeek-V3 (MLA, 3 dense layers then 58 MoE layers) on 1,024 H100 in NVIDIA's layout: Megatron
    accepts the flags and builds the plan's split and expert grid."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    p = planner.evaluate(planner.load_model("deepseek-v3"), planner.load_cluster("dgx-h100", nodes=128),
                         TrainingSpec(global_batch_size=8192, seq_length=4096),
                         planner.Layout(tp=2, pp=16, dp=32, ep=64, etp=1, sequence_parallel=True, zero_stage=1,
                                        recompute="selective", pipeline_layers=(4,) * 15 + (1,)))
    args = p.to_megatron().args
    assert "--multi-latent-attention" in args and "([0]*3+[1]*58)" in args
    r = check_megatron([megatron_payload(args, p.num_gpus, p.to_megatron().env, 9)])[0]
    assert r.ok, r.line()
    assert [sum(x) for x in r.details["layers_per_rank"]] == list(stage_layers(p.model, p.layout))
    assert (r.details["ep"], r.details["etp"], r.details["edp"]) == (64, 1, 1)
    assert r.details["moe_layer_freq"] == [0] * 3 + [1] * 58
    assert (r.details["moe_router_num_groups"], r.details["moe_router_group_topk"]) == (8, 4)  # its node-limited routing
    assert (r.details["mtp_num_layers"], r.details["mtp_ranks"]) == (1, [15])  # its MTP depth beside the loss


def test_megatron_builds_the_allgather_dispatcher(megatron_path):
    """Qwen3-30B-A3B at ep 2 with Megatron's all-gather dispatcher: the flags pass validate_args and the
    TransformerConfig runs the dispatcher the plan priced."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    p = planner.evaluate(planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=1),
                         TrainingSpec(global_batch_size=64, seq_length=4096),
                         Layout(pp=4, dp=2, ep=2, zero_stage=1, recompute="full", moe_dispatcher="allgather"))
    r = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, 9)])[0]
    assert r.ok, r.line()
    assert (r.details["moe_token_dispatcher_type"], r.details["ep"]) == ("allgather", 2)


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_megatron_builds_token_dropping_padded_to_capacity(megatron_path, dispatcher):
    """Qwen3-30B-A3B at ep 2 dropping tokens at capacity factor 1.1, padded: the flags pass validate_args and
    TransformerConfig carries the factor and the padding the router and dispatcher read (the rows the plan
    priced: memory.routed_rows)."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    p = planner.evaluate(planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=1),
                         TrainingSpec(global_batch_size=64, seq_length=4096, moe_capacity_factor=1.1,
                                      moe_pad_to_capacity=True),
                         Layout(pp=4, dp=2, ep=2, zero_stage=1, recompute="full", moe_dispatcher=dispatcher))
    args = p.to_megatron().args
    assert args[args.index("--moe-expert-capacity-factor") + 1] == "1.1" and "--moe-pad-expert-input-to-capacity" in args
    r = check_megatron([megatron_payload(args, p.num_gpus, p.to_megatron().env, 9)])[0]
    assert r.ok, r.line()
    assert (r.details["moe_expert_capacity_factor"], r.details["moe_pad_expert_input_to_capacity"]) == (1.1, True)
    assert r.details["moe_token_dispatcher_type"] == dispatcher


@pytest.mark.parametrize("split", [None, (17, 15)])
def test_megatron_builds_the_mtp_depth_on_the_last_rank(megatron_path, split):
    """A dense model with one MTP depth at pp 2, with Megatron's even split and with an explicit layout:
    Megatron accepts --mtp-num-layers and builds the depth on the rank the cost model puts it on."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    m = planner.load_model("llama3-8b").model_copy(update={"mtp_layers": 1})
    p = planner.evaluate(m, planner.load_cluster("dgx-h100", nodes=1), TrainingSpec(global_batch_size=8, seq_length=4096),
                         Layout(pp=2, dp=4, zero_stage=1, pipeline_layers=split))
    r = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, 9)])[0]
    assert r.ok, r.line()
    assert (r.details["mtp_num_layers"], r.details["mtp_ranks"]) == (1, [1])
    assert [sum(x) for x in r.details["layers_per_rank"]] == list(stage_layers(p.model, p.layout))


def test_megatron_builds_llama4_maverick_alternating_dense_and_moe_layers(megatron_path):
    """Llama-4 Maverick (MoESpec.layer_step 2: layers 1, 3, ..., 47 MoE) in NVIDIA's H100 layout
    (tp 4, ep 128, etp 4 on 512 GPUs): Megatron accepts --moe-layer-freq and its TransformerConfig
    marks the same layers MoE as the plan prices."""
    pytest.importorskip("torch")
    from planner.check import check_megatron
    from tests.test_moe import llama4_maverick

    m = llama4_maverick()
    p = planner.evaluate(m, planner.load_cluster("dgx-h100", nodes=64), TrainingSpec(global_batch_size=1024, seq_length=8192),
                         planner.Layout(tp=4, dp=128, ep=128, etp=4, sequence_parallel=True, zero_stage=1))
    r = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, 9)])[0]
    assert r.ok, r.line()
    assert r.details["moe_layer_freq"] == [0, 1] * 24 == [int(m.is_moe_layer(i)) for i in range(48)]
    assert (r.details["ep"], r.details["etp"], r.details["edp"]) == (128, 4, 1)


def test_megatron_builds_gpt_oss_layers_as_the_plan_prices_them(megatron_path):
    """GPT-OSS-120B on 64 B200 in NVIDIA's perf layout (ep 64): Megatron accepts the flags and, by its
    own is_layer_window_attention, windows 18 of the 36 layers (the odd ones) with 127 keys left of
    the query, learnable sinks, biased linears and the clamped quick-GELU GLU (offset 1, clamp 7)."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    m = planner.load_model("gpt-oss-120b")
    p = planner.evaluate(m, planner.load_cluster("dgx-b200", nodes=8), TrainingSpec(global_batch_size=1280, seq_length=4096),
                         planner.Layout(tp=1, pp=1, dp=64, ep=64, zero_stage=1, micro_batch_size=4))
    r = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, 10)])[0]
    assert r.ok, r.line()
    d = r.details
    assert d["windowed_layers"] == m.windowed_layers == 18 and d["window_size"] == [127, 0]
    assert d["softmax_type"] == "learnable" and d["add_bias_linear"] and d["gated_linear_unit"]
    assert (d["activation"], d["glu_linear_offset"], d["activation_func_clamp_value"]) == ("quick_gelu", 1.0, 7.0)
    assert (d["ep"], d["edp"], d["num_experts"], d["moe_router_topk"]) == (64, 1, 128, 4)


def test_megatron_accepts_the_combined_1f1b_the_plan_prices(megatron_path):
    """EP all-to-all overlap on Qwen3-30B-A3B, without a pipeline and interleaved over pp 2: Megatron's
    TransformerConfig (which asserts ep > 1, no full recompute, vpp with pp > 1) builds it."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    m, c = planner.load_model("qwen3-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=256, seq_length=4096)
    plans = [planner.evaluate(m, c, t, lay) for lay in (
        planner.Layout(tp=1, pp=1, dp=16, ep=8, zero_stage=1, ep_overlap=True, recompute="selective"),
        planner.Layout(tp=1, pp=2, dp=8, ep=8, vpp=4, zero_stage=1, ep_overlap=True))]
    results = check_megatron([megatron_payload(p.to_megatron().args, p.num_gpus, p.to_megatron().env, 9) for p in plans])
    for p, r in zip(plans, results):
        assert r.ok, (p.layout.short(), r.line())
        assert r.details["overlap_moe_expert_parallel_comm"]


def test_megatron_accepts_recompute_modules_and_mxfp8_gathered_through_the_gradient_buffer(megatron_path):
    """DeepSeek-V3 as Megatron-Bridge's GB300 MXFP8 recipe runs it (on 256 B300): selective recompute of MLA's
    up-projections, the norms and the routed activation (--recompute-modules), MXFP8 weights gathered
    through the gradient buffer. TransformerConfig carries the modules; the arguments the flag."""
    pytest.importorskip("torch")
    from planner.check import check_megatron

    p = planner.evaluate(planner.load_model("deepseek-v3"), planner.load_cluster("dgx-b300", nodes=32),
                         TrainingSpec(global_batch_size=4096, seq_length=4096, fp8="mxfp8", fp8_param_gather=True,
                                      grad_dtype="bf16"),
                         planner.Layout(tp=1, pp=2, dp=128, ep=32, etp=1, zero_stage=1, micro_batch_size=1,
                                        recompute="selective", recompute_modules=("mla_up_proj", "moe_act", "layernorm"),
                                        vpp=2, pipeline_layers=(16, 15, 15, 15)))
    args = p.to_megatron().args
    i = args.index("--recompute-modules")
    assert list(args[i + 1:i + 4]) == ["layernorm", "mla_up_proj", "moe_act"]
    assert "--reuse-grad-buf-for-mxfp8-param-ag" in args and "--fp8-param-gather" in args
    r = check_megatron([megatron_payload(args, p.num_gpus, p.to_megatron().env, 10)])[0]
    assert r.ok, r.line()
    assert r.details["recompute_modules"] == ["layernorm", "mla_up_proj", "moe_act"]
    assert r.details["reuse_grad_buf_for_mxfp8_param_ag"] and r.details["fp8_param"]


def test_deepspeed_places_layers_its_partitioner_places(tmp_path):
    """Megatron-DeepSpeed's GPT model on DeepSpeed's pipeline engine: a pipeline degree that does not
    divide the layers is what DeepSpeed runs (PipelineModule partition_method='type:transformer'),
    so evaluate prices DeepSpeed's own split, the search offers it, the emitter writes it and
    DeepSpeed's partitioner, run here, makes the same one; any other split is refused."""
    pytest.importorskip("deepspeed")
    from planner.check import check_deepspeed
    from planner.errors import InvalidLayout

    m = planner.load_model("gpt3-1.3b").model_copy(update={"num_layers": 30})
    c = planner.load_cluster("dgx-a100-80g", nodes=1)
    t = TrainingSpec(global_batch_size=64, seq_length=2048, optimizer_impl="deepspeed")
    p = planner.evaluate(m, c, t, planner.Layout(pp=4, dp=2, zero_stage=1))
    assert p.layout.pipeline_layers == (8, 8, 7, 7) and "DeepSpeed's pipeline engine" in p.warnings[0]
    with pytest.raises(InvalidLayout, match=r"places 30 layers on pp\(4\) as \[8, 8, 7, 7\]"):
        planner.evaluate(m, c, t, planner.Layout(pp=4, dp=2, zero_stage=1, pipeline_layers=(7, 7, 8, 8)))
    with pytest.raises(InvalidLayout, match=r"vpp\(2\) > 1: DeepSpeed's pipeline engine has no interleaved"):
        planner.evaluate(m, c, t, planner.Layout(pp=2, dp=4, vpp=3, zero_stage=1).model_copy(update={"vpp": 2}))
    with pytest.raises(InvalidLayout, match=r"pp\(32\) > num_layers\(30\)"):
        planner.evaluate(m, planner.load_cluster("dgx-a100-80g", nodes=4), t, planner.Layout(pp=32, dp=1, zero_stage=1))
    # Megatron runs it only with its account-for-ends split ((30 + 2) / 4: 7, 8, 8, 7), not DeepSpeed's
    megatron = planner.evaluate(m, c, t.model_copy(update={"optimizer_impl": None}), planner.Layout(pp=4, dp=2, zero_stage=1))
    assert megatron.layout.pipeline_layers == (7, 8, 8, 7)
    r = plan(m, c, TrainingSpec(global_batch_size=64, seq_length=2048), framework="deepspeed", pp=4, top_k=1,
             structural=False)
    assert r.status == "optimal" and r.best.layout.pipeline_layers == (8, 8, 7, 7)
    files = r.best.to_deepspeed()
    check = check_deepspeed(files.config, 8, tp=r.best.layout.tp, pp=4, num_layers=30)
    assert check.ok and check.details["stage_layers"] == [8, 8, 7, 7]
    import subprocess
    import sys
    cfg = tmp_path / "ds_config.json"
    files.write(tmp_path)
    out = subprocess.run([sys.executable, "-m", "planner", "check", "deepspeed", str(cfg), "--world-size", "8",
                          "--tp", str(r.best.layout.tp), "--pp", "4", "--num-layers", "30"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0 and "stage_layers=[8, 8, 7, 7]" in out.stdout, out.stderr
    from planner.oracle import enumerate_plans
    best = enumerate_plans(m, c, r.best.training, framework="deepspeed", constraints={"pp": 4})[0]
    assert best.time.objective_us == r.best.time.objective_us and best.layout == r.best.layout


def test_concurrent_megatron_fetches_into_one_folder_leave_one_whole_tree(tmp_path, monkeypatch):
    """Parallel test workers may fetch Megatron into the same cache at once: each unpacks apart and
    renames into place, so the tree is whole and nothing is left beside it (pip stubbed: no network)."""
    import subprocess
    import threading
    import zipfile

    from planner.check import fetch_megatron

    def fake_pip(cmd, **kw):
        dest = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(os.path.join(dest, "megatron_core-0.19.2-cp312-cp312-linux_x86_64.whl"), "w") as z:
            for i in range(200):
                z.writestr(f"megatron/core/m{i}.py", "x = 1\n" * 200)
            z.writestr("megatron/training/arguments.py", "# planted\n")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    got, errors = [], []

    def fetch():
        try:
            got.append(fetch_megatron(str(tmp_path)))
        except Exception as e:  # noqa: BLE001 - the test reports whatever a racing fetch raises
            errors.append(e)
    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and set(got) == {str(tmp_path / "megatron-core")}
    assert sorted(os.listdir(tmp_path)) == ["megatron-core"]
    tree = tmp_path / "megatron-core" / "megatron"
    assert (tree / "training" / "arguments.py").read_text() == "# planted\n"
    assert len(list((tree / "core").iterdir())) == 200


def test_the_megatron_workers_verdict_lines_stay_whole_whatever_its_children_print():
    """Children validate side by side; one that writes to its stdout without a newline (Megatron's
    prints and logs) must not land inside another's verdict line: the protocol stream carries
    verdicts only (worker setup and Megatron stubbed)."""
    import json
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "import planner.check._megatron_worker as w\n"
        "w._setup = lambda: None\n"
        "def fake(p):\n"
        "    os.write(1, b'a stray print without its newline')\n"
        "    return {'ok': True, 'stage': 'done', 'message': '', 'details': {'n': p['n']}}\n"
        "w._validate = fake\n"
        "sys.exit(w.main())\n")
    batch = json.dumps({"env": dict(os.environ), "payloads": [{"n": i} for i in range(12)]}) + "\n"
    out = subprocess.run([sys.executable, "-c", script], input=batch, capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert lines[0] == "VERDICT READY"
    assert [json.loads(ln.removeprefix("VERDICT "))["details"]["n"] for ln in lines[1:]] == list(range(12))
    assert "a stray print" in out.stderr


def test_megatron_runs_the_unfused_loss_the_plan_prices(megatron_path):
    """cross_entropy 'unfused' (megatron-core's loss without the fusion, priced at 52 B a logit): the launch
    files leave --cross-entropy-loss-fusion out and Megatron builds the unfused loss; torchtitan and
    DeepSpeed run their own and refuse it in one line."""
    pytest.importorskip("torch")
    from planner.check import check_megatron
    m, c = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    p = planner.plan(m, c, TrainingSpec(global_batch_size=64, seq_length=4096, cross_entropy="unfused"), top_k=1,
                     structural=False).best
    files = p.to_megatron()
    assert "--cross-entropy-loss-fusion" not in files.args
    r = check_megatron([megatron_payload(files.args, p.num_gpus, files.env, p.cluster.gpu.arch)])[0]
    assert r.ok and r.details["cross_entropy"] == "unfused"
    with pytest.raises(planner.PlannerError, match="'unfused' is megatron-core's loss"):
        planner.plan(m, c, TrainingSpec(global_batch_size=64, seq_length=4096, cross_entropy="unfused"),
                     framework="torchtitan")
    with pytest.raises(planner.SpecError, match="cross_entropy.*'unfused' is megatron-core's loss"):
        TrainingSpec(global_batch_size=64, seq_length=4096, cross_entropy="unfused", optimizer_impl="fsdp2")
