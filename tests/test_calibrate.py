"""Training logs, calibration from them, prediction intervals, OOM risk and ties."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

import planner
from planner.calibration import PARAMETERS, apply_factors, calibrate, megatron_setup, observation
from planner.cli import main
from planner.logs import LogError, parse_log, read_log
from planner.specs import Layout, PredictionError, TrainingSpec
from planner.uncertainty import interval, oom_risk, peak_for_risk

from log_writers import GIB, MB, deepspeed_log, megatron_log, nemo_log, torchtitan_log

LOGS = Path(__file__).parent / "logs"


# --- parsing: fixtures in each framework's print format, numbers worked out by hand from the file


def test_megatron_fixture():
    m = read_log(LOGS / "megatron_llama3_8b.log")
    assert m.framework == "megatron" and m.rate == "step_s"
    assert m.steps == (20, 30, 40, 50)  # iteration 10 (the first logged) is warm-up
    assert m.value == pytest.approx((7906.7 + 7911.0) / 2 / 1e3)  # median of 7911.0, 7906.7, 7918.2, 7906.1 ms
    assert m.peak_memory_bytes == pytest.approx(41216.00 * MB) and m.memory_kind == "max reserved"
    assert m.args["tensor_model_parallel_size"] == "2" and m.args["recompute_granularity"] == "selective"


def test_megatron_arguments_give_the_layout():
    m = read_log(LOGS / "megatron_llama3_8b.log")
    training, layout = megatron_setup(m.args, planner.load_model("llama3-8b"), m.source)
    assert (training.global_batch_size, training.seq_length, training.grad_dtype) == (128, 8192, "fp32")
    assert (layout.tp, layout.pp, layout.cp, layout.dp, layout.zero_stage) == (2, 2, 1, 4, 1)
    assert layout.recompute == "selective" and layout.sequence_parallel and layout.vpp == 1
    assert layout.overlap_grad_reduce and layout.overlap_param_gather and not layout.tp_comm_overlap


def test_megatron_arguments_must_match_the_model():
    m = read_log(LOGS / "megatron_llama3_8b.log")
    with pytest.raises(LogError, match="num_layers = 32, the model llama3-70b has 80"):
        megatron_setup(m.args, planner.load_model("llama3-70b"), m.source)


def test_nemo_fixture():
    m = read_log(LOGS / "nemo2_llama3_8b.log")
    assert m.framework == "nemo" and m.steps == (4, 5, 6)  # iterations 0-3 are warm-up
    assert m.value == pytest.approx(3.5)  # median of 3.497, 3.503, 3.5
    assert m.peak_memory_bytes is None


def test_torchtitan_fixture_with_colours():
    m = read_log(LOGS / "torchtitan_llama3_8b.log")
    assert m.framework == "torchtitan" and m.rate == "tokens_per_s_per_gpu"
    assert m.steps == (10, 20, 30) and m.value == 6505  # median of 6,512 / 6,498 / 6,505
    assert m.peak_memory_bytes == pytest.approx(47.91 * GIB)
    # step time = global tokens / (tokens/s per GPU x GPUs): 128 x 8192 / (6505 x 16)
    assert m.step_time_s(128, 8192, 16) == pytest.approx(128 * 8192 / (6505 * 16))


@pytest.mark.parametrize("head,compiled", [
    ("Model llama3 8B size: 8,030,261,248 total parameters\n", False),  # built, never compiled: eager
    ("Model llama3 8B size: 8,030,261,248 total parameters\nCompiling each TransformerBlock with torch.compile\n",
     True),
    ("", None),  # the log starts at the training loop: cannot tell
])
def test_a_torchtitan_log_says_whether_its_blocks_were_compiled(tmp_path, head, compiled):
    """torchtitan prints the model's size before it parallelises and compiles it, and apply_compile prints
    'Compiling each TransformerBlock with torch.compile'; an eager run calibrates the cluster slower than the
    compiled blocks the planner prices and launches, and calibrate says so."""
    prefix = "".join(f"[titan] 2026-11-30 09:59:00,000 - root - INFO - {ln}\n" for ln in head.splitlines())
    text = prefix + (LOGS / "torchtitan_llama3_8b.log").read_text()
    assert parse_log(text).compiled is compiled
    log = tmp_path / "titan.log"
    log.write_text(text)
    out = io.StringIO()
    rc = main(["calibrate", MODEL, "dgx-h100", str(log), "--out", str(tmp_path / "c.yaml"), "--nodes", "2",
               "--global-batch-size", "128", "--seq-length", "8192", "--zero", "3"], stdout=out, stderr=io.StringIO())
    assert rc == 0 and ("ran its blocks eager" in out.getvalue()) == (compiled is False)


SIZE_LINE = "Model llama3 8B size: 8,030,261,248 total parameters"


@pytest.mark.parametrize("head, fp8, error", [
    (["Float8 training active with recipe rowwise", SIZE_LINE], None, None),  # the log names it: priced so
    (["Float8 training active with recipe rowwise", SIZE_LINE], "rowwise", None),
    (["Float8 training active with recipe rowwise", SIZE_LINE], "torchao-tensorwise", "give fp8 'rowwise' (--fp8 rowwise)"),
    (["Float8 training active", SIZE_LINE], None, "give fp8 'rowwise' or 'torchao-tensorwise' (--fp8)"),
    ([SIZE_LINE], "rowwise", "its linears in BF16 (no quantisation converter in its log), the workload says "
                             "fp8='rowwise': leave fp8 unset (drop --fp8)"),
    ([SIZE_LINE], None, None),
    ([], "rowwise", None),  # the log starts at the training loop: cannot tell
    (["Float8 training active with recipe rowwise_with_gw_hp", SIZE_LINE], "rowwise", "rowwise_with_gw_hp"),
])
def test_calibrate_refuses_a_torchtitan_log_whose_precision_is_not_the_workloads(tmp_path, head, fp8, error):
    """torchtitan's converters log what they quantise while the model config is built, before the model's size
    line [torchtitan 0.3 components/quantization/float8.py: 'Float8 training active with recipe R'; mx.py:
    'Converted Linear layers to MXFP8Linear']; a workload that prices another precision would fit the cluster to
    the wrong run, so calibrate refuses it in one line naming the flag to give; where the log names a recipe the
    planner prices and no --fp8 is given, the log's sets the workload."""
    prefix = "".join(f"[titan] 2026-11-30 09:59:00,000 - root - INFO - {ln}\n" for ln in head)
    log = tmp_path / "titan.log"
    log.write_text(prefix + (LOGS / "torchtitan_llama3_8b.log").read_text())
    out, err = io.StringIO(), io.StringIO()
    rc = main(["calibrate", MODEL, "dgx-h100", str(log), "--out", str(tmp_path / "c.yaml"), "--nodes", "2",
               "--global-batch-size", "128", "--seq-length", "8192", "--zero", "3",
               *(["--fp8", fp8] if fp8 else [])], stdout=out, stderr=err)
    if error is None:
        assert rc == 0, err.getvalue()
        named = "Float8 training active with recipe rowwise" in head or fp8 == "rowwise"
        assert ("[fp8=rowwise]" in out.getvalue()) == named  # priced in the log's recipe
    else:
        assert rc != 0 and error in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1, err.getvalue()


def test_torchtitan_logs_name_the_recipe_of_linears_and_experts():
    """MXFP8 linears and experts (mx.py's two converters), float8 experts without float8 linears (not priced:
    the planner prices one recipe for both), and an older torchtitan's recipe-less float8 line."""
    from planner.logs import LowPrecision

    def low(*head):
        text = "".join(f"[titan] 2026-11-30 09:59:00,000 - root - INFO - {ln}\n" for ln in head)
        return parse_log(text + (LOGS / "torchtitan_llama3_8b.log").read_text()).low_precision

    mx = low("Converted Linear layers to MXFP8Linear",
             "Converted GroupedExperts to use dynamic mxfp8_rceil quantization for grouped_mm ops", SIZE_LINE)
    assert mx == LowPrecision("torchao-mxfp8", "torchao-mxfp8") and mx.problem("torchao-mxfp8", moe=True) is None
    experts = low("Converted GroupedExperts to use dynamic float8 rowwise quantization with scaled grouped GEMMs",
                  SIZE_LINE)
    assert "linears in BF16 and its routed experts in rowwise, which is not priced" in experts.problem("rowwise", True)
    assert "not the routed" not in (LowPrecision("rowwise").problem("rowwise", moe=True) or "")
    assert "routed experts in BF16" in LowPrecision("rowwise").problem("rowwise", moe=True)
    # the Python API too: a workload that leaves fp8 unset takes the log's recipe, one that sets it is checked
    text = "".join(f"[titan] 2026-11-30 09:59:00,000 - root - INFO - {ln}\n" for ln in
                   ("Float8 training active with recipe rowwise", SIZE_LINE))
    m = parse_log(text + (LOGS / "torchtitan_llama3_8b.log").read_text())
    tr, lay = TrainingSpec(global_batch_size=128, seq_length=8192, kernels="unfused", optimizer_impl="fsdp2"), \
        Layout(dp=16, zero_stage=3)
    assert observation(m, planner.load_model(MODEL), tr, lay).training.fp8 == "rowwise"
    bf16 = TrainingSpec(global_batch_size=128, seq_length=8192, kernels="unfused", optimizer_impl="fsdp2", fp8=None)
    with pytest.raises(LogError, match="the workload says fp8=None"):  # set, though to None
        observation(m, planner.load_model(MODEL), bf16, lay)
    old = low("Float8 training active", SIZE_LINE)  # torchtitan 2024-12 names no recipe
    assert old.problem("torchao-tensorwise", moe=False) is None and "'rowwise' or" in old.problem(None, False)


def test_deepspeed_fixture():
    m = read_log(LOGS / "deepspeed_gpt.log")
    assert m.framework == "deepspeed" and m.steps == (20, 30, 40)
    assert m.value == pytest.approx(60.52404149)  # median of CurrSamplesPerSec at steps 20-40
    assert m.step_time_s(512, 2048, 64) == pytest.approx(512 / 60.52404149)  # samples = the global batch
    # DeepSpeedConfig.print: 29-wide dots, none for the 30-character micro-batch name
    assert m.config == {"bfloat16_enabled": "True", "gradient_accumulation_steps": "4", "train_batch_size": "512",
                        "train_micro_batch_size_per_gpu": "2", "world_size": "64", "zero_enabled": "True",
                        "zero_optimization_stage": "3"}
    assert m.peak_memory_bytes == 56 * GIB and m.memory_kind == "max reserved"  # Max_CA, whole GiB


@pytest.mark.parametrize("text, match", [
    ("", "no training step lines"),
    ("hello\nworld\n", "no training step lines"),
    (" iteration       10/     100 | elapsed time per iteration (ms): 12.5 |\n", "only warm-up steps"),
    (" iteration       10/     100 | elapsed time per iteration (ms): 1.0 |\n"
     " iteration       20/     100 | elapsed time per iteration (ms): abc |\n", "bad.log:2: iteration line without"),
    (" iteration       10/     100 | elapsed time per iteration (ms): 1.0 |\n"
     " iteration       20/     100 | elapsed time per iteration (ms): 1e999 |\n", ":2: '1e999' is not a finite number"),
    ("CurrSamplesPerSec is 12\n", ":1: a step line in an unexpected shape"),
    (" iteration       10/     100 | elapsed time per iteration (ms): 1.0 |\n"
     " iteration       20/     100 | elapsed time per iteration (ms): 0.0 |\n", "step 20: step times must be positive"),
    ("------------------------ arguments ------------------------\n  bf16 ........ True\n"
     " iteration       10/     100 | elapsed time per iteration (ms): 1.0 |\n"
     " iteration       20/     100 | elapsed time per iteration (ms): 1.0 |\n", "never ends"),
    ("[Rank 0] (after 10 iterations) memory (MB) | allocated: 1.0\n"
     " iteration       20/     100 | elapsed time per iteration (ms): 1.0 |\n", ":1: memory line without"),
    ("[Rank 0] (after 10 iterations) memory (MB) | max reserved: -5.0\n", ":1: memory '-5.0' is negative"),
])
def test_malformed_logs_fail_with_one_line(text, match):
    with pytest.raises(LogError, match=match) as err:
        parse_log(text, "bad.log")
    assert "\n" not in str(err.value)


def test_a_log_of_two_frameworks_is_refused():
    with pytest.raises(LogError, match="several frameworks"):
        parse_log(megatron_log(1.0, GIB) + torchtitan_log(1000, GIB))


def test_truncated_log_keeps_what_it_has_or_says_why():
    text = megatron_log(2.0, 10 * GIB)
    cut = text[: text.index("iteration       30")]  # cut mid-line after step 20
    assert parse_log(cut).steps == (20,)
    with pytest.raises(LogError, match="only warm-up"):
        parse_log(text[: text.index("iteration       20")])


def test_cli_bad_log_is_one_line(tmp_path):
    bad = tmp_path / "x.log"
    bad.write_bytes(b"\xff\xfe garbage \x00\n")
    err = io.StringIO()
    rc = main(["calibrate", "llama3-8b", "dgx-h100", str(bad), "--out", str(tmp_path / "c.yaml")], stdout=io.StringIO(), stderr=err)
    assert rc == 2 and err.getvalue().count("\n") == 1 and "x.log" in err.getvalue()


# --- calibration: recover known perturbations from synthesised logs

MODEL = "llama3-8b"
RUNS = [  # layouts chosen to expose every parameter: DP across nodes, TP-heavy, long sequences, PP
    (TrainingSpec(global_batch_size=32, seq_length=8192), Layout(tp=1, dp=32, zero_stage=1)),
    (TrainingSpec(global_batch_size=64, seq_length=4096), Layout(tp=1, dp=32, zero_stage=1, micro_batch_size=2)),
    (TrainingSpec(global_batch_size=32, seq_length=2048), Layout(tp=1, dp=32, zero_stage=1)),  # DP-bound: scale-out
    (TrainingSpec(global_batch_size=256, seq_length=8192), Layout(tp=2, dp=16, zero_stage=1, sequence_parallel=True)),
    (TrainingSpec(global_batch_size=256, seq_length=8192), Layout(tp=8, dp=4, zero_stage=1, sequence_parallel=True)),
    (TrainingSpec(global_batch_size=64, seq_length=32768), Layout(tp=4, cp=2, dp=4, zero_stage=1, sequence_parallel=True)),
    (TrainingSpec(global_batch_size=256, seq_length=4096),
     Layout(tp=2, pp=2, dp=8, zero_stage=1, micro_batch_size=2, sequence_parallel=True, overlap_grad_reduce=True)),
]
TRUE_FACTORS = {"gemm": 0.8, "scaleout": 0.5}  # 20 % slower GEMMs, half the NIC bandwidth


@pytest.fixture(scope="module")
def recovered():
    model, base = planner.load_model(MODEL), planner.load_cluster("dgx-h100", nodes=4)
    truth = apply_factors(base, TRUE_FACTORS, overhead=base.memory_overhead + 2 * GIB)  # and 2 GiB more overhead
    obs = []
    for i, (t, lay) in enumerate(RUNS):
        p = planner.evaluate(model, truth, t, lay)
        text = megatron_log(p.step_time_s, p.peak_memory_bytes)
        obs.append(observation(parse_log(text, f"run{i}.log"), model, t, lay))
    return model, base, truth, calibrate(base, obs)


def test_calibration_recovers_the_perturbation(recovered):
    _, base, truth, r = recovered
    assert r.factors["gemm"] == pytest.approx(0.8, rel=0.03)
    assert r.factors["scaleout"] == pytest.approx(0.5, rel=0.03)
    assert r.factors["attention"] == pytest.approx(1.0, rel=0.03)
    assert r.overhead_after == pytest.approx(truth.memory_overhead, rel=0.03)
    assert r.median_error("after") < 0.01 < 0.1 < r.median_error("before")


def test_calibrated_cluster_predicts_other_layouts(recovered):
    model, _, truth, r = recovered
    others = [(TrainingSpec(global_batch_size=128, seq_length=8192), Layout(tp=4, dp=8, zero_stage=1, sequence_parallel=True)),
              (TrainingSpec(global_batch_size=128, seq_length=16384), Layout(tp=2, pp=4, dp=4, zero_stage=1, sequence_parallel=True)),
              (TrainingSpec(global_batch_size=512, seq_length=2048), Layout(tp=1, dp=32, zero_stage=1, micro_batch_size=4))]
    for t, lay in others:
        want = planner.evaluate(model, truth, t, lay).step_time_s
        before = planner.evaluate(model, planner.load_cluster("dgx-h100", nodes=4), t, lay).step_time_s
        got = planner.evaluate(model, r.cluster.model_copy(update={"num_nodes": 4}), t, lay).step_time_s
        assert abs(got / want - 1) < 0.03 < abs(before / want - 1)


def test_one_log_cannot_move_what_it_does_not_measure():
    # one node, TP inside NVLink, no inter-node traffic: the NIC bandwidth must stay the catalog's
    model, base = planner.load_model(MODEL), planner.load_cluster("dgx-h100", nodes=1)
    t, lay = TrainingSpec(global_batch_size=64, seq_length=8192), Layout(tp=8, dp=1, zero_stage=1, sequence_parallel=True)
    slow = apply_factors(base, {"gemm": 0.85})
    step = planner.evaluate(model, slow, t, lay).step_time_s
    r = calibrate(base, [observation(parse_log(megatron_log(step, 30 * GIB)), model, t, lay)])
    assert r.factors["scaleout"] == pytest.approx(1.0, abs=1e-3)
    assert any(n.startswith("scaleout: not moved") for n in r.notes)
    assert r.median_error("after") < r.median_error("before")


def test_cli_calibrate_writes_a_cluster_that_plan_reads(tmp_path):
    out = io.StringIO()
    path = tmp_path / "mine.yaml"
    rc = main(["calibrate", MODEL, "dgx-h100", str(LOGS / "megatron_llama3_8b.log"), "--out", str(path)],
              stdout=out, stderr=io.StringIO())
    assert rc == 0, out.getvalue()
    assert "left out" in out.getvalue() and "wrote" in out.getvalue()
    cluster = planner.load_cluster(str(path), nodes=2)
    assert cluster.prediction_error is not None and "megatron_llama3_8b.log" in cluster.provenance["memory_overhead"]
    # the measured step (7.909 s) is what the calibrated cluster now predicts for the logged layout
    m = read_log(LOGS / "megatron_llama3_8b.log")
    t, lay = megatron_setup(m.args, planner.load_model(MODEL), m.source)
    assert planner.evaluate(planner.load_model(MODEL), cluster, t, lay).step_time_s == pytest.approx(m.value, rel=0.03)
    # rewriting its own file is fine; a file planner did not write is refused
    assert main(["calibrate", MODEL, "dgx-h100", str(LOGS / "megatron_llama3_8b.log"), "--out", str(path)],
                stdout=io.StringIO(), stderr=io.StringIO()) == 0
    foreign = tmp_path / "foreign.yaml"
    foreign.write_text("name: x\n")
    err = io.StringIO()
    assert main(["calibrate", MODEL, "dgx-h100", str(LOGS / "megatron_llama3_8b.log"), "--out", str(foreign)],
                stdout=io.StringIO(), stderr=err) == 2 and "foreign.yaml" in err.getvalue()


def test_cli_calibrate_without_argument_dump_needs_the_workload(tmp_path):
    err = io.StringIO()
    rc = main(["calibrate", MODEL, "dgx-h100", str(LOGS / "torchtitan_llama3_8b.log"), "--out", str(tmp_path / "c.yaml")],
              stdout=io.StringIO(), stderr=err)
    assert rc == 2 and "--global-batch-size" in err.getvalue()
    rc = main(["calibrate", MODEL, "dgx-h100", str(LOGS / "torchtitan_llama3_8b.log"), "--out", str(tmp_path / "c.yaml"),
               "--nodes", "2", "--global-batch-size", "128", "--seq-length", "8192", "--zero", "3", "--json"],
              stdout=(out := io.StringIO()), stderr=io.StringIO())
    assert rc == 0 and '"calibrated_s"' in out.getvalue()
    data = json.loads(out.getvalue())  # the host stall and the time per expert GEMM are seconds added, not factors
    assert data["added_seconds"] == {"moe_stall": 0.0, "expert_call": 0.0} and "gemm" in data["factors"]
    assert "moe_stall" not in data["factors"] and "expert_call" not in data["factors"]
    assert set(data["added_shares"]) == {"fsdp_overlap"} and "fsdp_overlap" not in data["factors"]  # a share added


def test_cli_calibrate_prices_a_torchtitan_run_with_its_cpu_offload(tmp_path):
    """A torchtitan log carries no argument dump, so --optimizer-offload 1 says the run offloaded
    (training.enable_cpu_offload): the catalog prices the host copies and step, longer."""
    runs = {}
    for off in ("0", "1"):
        rc = main(["calibrate", MODEL, "dgx-h100", str(LOGS / "torchtitan_llama3_8b.log"), "--out",
                   str(tmp_path / f"c{off}.yaml"), "--nodes", "2", "--global-batch-size", "128", "--seq-length", "8192",
                   "--zero", "3", "--optimizer-offload", off, "--json"], stdout=(out := io.StringIO()), stderr=io.StringIO())
        assert rc == 0
        runs[off] = json.loads(out.getvalue())["runs"][0]
    assert runs["1"]["catalog_s"] > runs["0"]["catalog_s"]
    err = io.StringIO()
    assert main(["calibrate", MODEL, "dgx-h100", str(LOGS / "torchtitan_llama3_8b.log"), "--optimizer-offload", "2"],
                stdout=io.StringIO(), stderr=err) == 2 and "--optimizer-offload" in err.getvalue()


# --- intervals, OOM risk, ties


def test_interval_and_risk_against_the_normal_quantiles():
    # ln(measured/predicted) ~ N(0.1, 0.2): the 80 % interval is exp(0.1 ± 1.2816 x 0.2)
    i = interval(10.0, 0.1, 0.2, 0.8)
    assert (i.lo, i.hi) == pytest.approx((10 * math.exp(0.1 - 0.25631), 10 * math.exp(0.1 + 0.25631)), rel=1e-4)
    e = PredictionError(step_time_sigma=0.1, memory_sigma=0.05)
    assert oom_risk(80.0, 80.0, e) == pytest.approx(0.5)  # a peak exactly at capacity: even odds
    assert oom_risk(80 * math.exp(-1.6449 * 0.05), 80.0, e) == pytest.approx(0.05, abs=1e-4)  # 1.645 sigma below
    assert peak_for_risk(80.0, e, 0.05) == pytest.approx(80 * math.exp(-1.6449 * 0.05), rel=1e-4)
    # measurements run 10 % above the ledger: a predicted peak of 80 e^-0.1 is at even odds
    biased = PredictionError(step_time_sigma=0.1, memory_bias=0.1, memory_sigma=0.05)
    assert oom_risk(80 * math.exp(-0.1), 80.0, biased) == pytest.approx(0.5)
    assert peak_for_risk(80.0, biased, 0.5) == pytest.approx(80 * math.exp(-0.1))


def test_plans_carry_intervals_and_a_max_oom_risk_is_honoured():
    model, cluster = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=1)
    t = TrainingSpec(global_batch_size=256, seq_length=8192)
    free = planner.plan(model, cluster, t, top_k=3, structural=False, time_limit_s=60)
    capped = planner.plan(model, cluster, t, top_k=3, structural=False, time_limit_s=60, max_oom_risk=0.05)
    b = free.best
    lo, hi = b.step_time_interval(0.8).lo, b.step_time_interval(0.8).hi
    assert lo < b.step_time_s < hi and b.step_time_interval(0.95).lo < lo
    assert free.best.oom_risk > 0.05  # the unconstrained optimum runs close to the memory limit
    for p in (capped.best, *capped.alternatives):
        assert p.oom_risk <= 0.05 and p.memory.capacity == cluster.gpu.memory
    assert capped.best.step_time_s >= free.best.step_time_s


def test_max_oom_risk_reprices_the_structural_options_on_their_own_gpus():
    """--max-oom-risk with the structural options on: the half-GPU option is re-priced on the half
    cluster at the real GPU memory (it was re-evaluated on the whole cluster and failed its world
    size, so README's default command with --max-oom-risk 5% exited 2)."""
    model, cluster = planner.load_model("llama3-8b"), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=128, seq_length=8192)
    r = planner.plan(model, cluster, t, top_k=1, time_limit_s=60, max_oom_risk=0.05)
    half = next(a for a in r.structural if a.label == "best on half the GPUs")
    assert half.plan.num_gpus == 8 and half.plan.memory.capacity == cluster.gpu.memory
    assert r.best.num_gpus == 16 and r.best.memory.capacity == cluster.gpu.memory


def test_calibrated_intervals_are_narrower():
    model, cluster = planner.load_model("llama3-70b"), planner.load_cluster("dgx-h100", nodes=8)
    t, lay = TrainingSpec(global_batch_size=1024, seq_length=8192), Layout(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True)
    mine = cluster.model_copy(update={"prediction_error": PredictionError(step_time_sigma=0.04, memory_sigma=0.03)})
    wide, narrow = planner.evaluate(model, cluster, t, lay).step_time_interval(), planner.evaluate(model, mine, t, lay).step_time_interval()
    assert narrow.hi - narrow.lo < 0.5 * (wide.hi - wide.lo)


def test_ties_follow_the_ranking_spread():
    model = planner.load_model("llama3-70b")
    t, lay = TrainingSpec(global_batch_size=1024, seq_length=8192), Layout(tp=8, pp=4, dp=2, zero_stage=1, sequence_parallel=True)
    sharp = planner.load_cluster("dgx-h100", nodes=8).model_copy(update={"prediction_error": PredictionError(
        step_time_sigma=0.05, ranking_sigma=0.02, memory_sigma=0.03)})
    a = planner.evaluate(model, sharp, t, lay)
    b = planner.evaluate(model, sharp, t, lay.model_copy(update={"micro_batch_size": 2}))
    c = planner.evaluate(model, sharp, t, lay.model_copy(update={"recompute": "full"}))
    # 1.2816 x 2 % = 2.6 %: layouts closer than that are tied, further apart are not
    assert a.tied_with(b) == (abs(math.log(a.step_time_s / b.step_time_s)) <= 0.025631)
    assert not a.tied_with(c)  # full recompute costs about a third more compute


def test_python_api_takes_paths_and_the_layout_of_logs_without_arguments():
    model, cluster = planner.load_model(MODEL), planner.load_cluster("dgx-h100")
    t = TrainingSpec(global_batch_size=128, seq_length=8192, kernels="unfused")
    lay = Layout(tp=1, dp=16, zero_stage=3)  # 16 GPUs of FSDP: the run of the torchtitan fixture
    r = planner.calibrate(model, cluster, [LOGS / "torchtitan_llama3_8b.log"], training=t, layout=lay)
    measured = 128 * 8192 / (6505 * 16)  # tokens per step / (tokens/s per GPU x GPUs)
    assert r.runs[0].measured_s == pytest.approx(measured)
    assert abs(r.runs[0].after_s / measured - 1) < abs(r.runs[0].before_s / measured - 1)
    assert r.cluster.prediction_error.basis == "calibrated on 1 log"
    with pytest.raises(planner.PlannerError, match="no argument dump"):
        planner.calibrate(model, cluster, [LOGS / "torchtitan_llama3_8b.log"])


def test_a_hostile_basis_is_escaped_in_the_report():
    from planner.review import review_html

    model = planner.load_model(MODEL)
    cluster = planner.load_cluster("dgx-h100").model_copy(update={"prediction_error": PredictionError(
        step_time_sigma=0.1, memory_sigma=0.05, basis="<script>alert(1)</script>")})
    r = planner.plan(model, cluster, TrainingSpec(global_batch_size=64, seq_length=4096), top_k=2, structural=False)
    page = review_html(r, [])
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_fp8_runs_move_the_fp8_gemm_curve_and_bf16_runs_do_not():
    model, base = planner.load_model(MODEL), planner.load_cluster("dgx-h100", nodes=1)
    lay = Layout(tp=1, dp=8, zero_stage=1)  # GEMM-bound: no TP, DP inside the node
    fp8 = TrainingSpec(global_batch_size=64, seq_length=8192, fp8="delayed")
    truth = apply_factors(base, {"gemm_fp8": 0.85})
    step = planner.evaluate(model, truth, fp8, lay).step_time_s
    r = calibrate(base, [observation(parse_log(megatron_log(step, 30 * GIB)), model, fp8, lay)])
    assert r.factors["gemm_fp8"] < 0.95 and r.factors["gemm"] == pytest.approx(1.0, abs=0.03)  # one log: shared with attention
    bf16 = TrainingSpec(global_batch_size=64, seq_length=8192)
    step = planner.evaluate(model, apply_factors(base, {"gemm": 0.85}), bf16, lay).step_time_s
    r = calibrate(base, [observation(parse_log(megatron_log(step, 30 * GIB)), model, bf16, lay)])
    assert r.factors["gemm_fp8"] == pytest.approx(1.0, abs=1e-3) and r.factors["gemm"] < 0.95


def test_megatron_arguments_carry_the_fp8_recipe():
    m = read_log(LOGS / "megatron_llama3_8b.log")
    args = dict(m.args, fp8="hybrid", fp8_recipe="tensorwise")
    training, _ = megatron_setup(args, planner.load_model(MODEL), m.source)
    assert training.fp8 == "tensorwise"
    assert megatron_setup(m.args, planner.load_model(MODEL), m.source)[0].fp8 is None
    states = dict(m.args, use_precision_aware_optimizer="True", exp_avg_dtype="torch.bfloat16",
                  exp_avg_sq_dtype="torch.bfloat16")
    assert megatron_setup(states, planner.load_model(MODEL), m.source)[0].optimizer_states == "bf16"
    with pytest.raises(LogError, match="only BF16 moments"):
        megatron_setup(dict(states, exp_avg_sq_dtype="torch.uint8"), planner.load_model(MODEL), m.source)


def test_megatron_arguments_carry_the_loss_kernel():
    """A run that printed cross_entropy_fusion_impl te with the fusion on ran Transformer Engine's loss
    (2 B a logit held, not megatron-core's 6); with the fusion on and 'native', megatron-core's fused loss;
    without it (or without the flag in the dump, Megatron-LM's default), megatron-core's unfused one."""
    m = read_log(LOGS / "megatron_llama3_8b.log")
    model = planner.load_model(MODEL)
    assert megatron_setup(m.args, model, m.source)[0].cross_entropy == "unfused"  # no flag printed: Megatron-LM's default
    te = dict(m.args, cross_entropy_loss_fusion="True", cross_entropy_fusion_impl="te")
    assert megatron_setup(te, model, m.source)[0].cross_entropy == "te"
    native = dict(m.args, cross_entropy_loss_fusion="True", cross_entropy_fusion_impl="native")
    assert megatron_setup(native, model, m.source)[0].cross_entropy == "fp32"
    assert megatron_setup(dict(te, cross_entropy_loss_fusion="False"), model, m.source)[0].cross_entropy == "unfused"


def test_megatron_arguments_carry_a_pipeline_layout_string():
    """A run launched with --pipeline-model-parallel-layout (as Megatron-Bridge's DeepSeek-V3 and Qwen3-235B
    recipes are) is priced with that split: 'Et*17|t*15L' on pp 2 is 17 and 15 layers; four stages on
    pp 2 interleave (vpp 2); a layout that places the loss elsewhere is refused in one line."""
    m = read_log(LOGS / "megatron_llama3_8b.log")
    model = planner.load_model(MODEL)
    lay = megatron_setup(dict(m.args, pipeline_model_parallel_layout="Et*17|t*15L"), model, m.source)[1]
    assert (lay.pipeline_layers, lay.vpp) == ((17, 15), 1)
    lay = megatron_setup(dict(m.args, pipeline_model_parallel_layout="Et*9|t*8|t*8|t*7L"), model, m.source)[1]
    assert (lay.pipeline_layers, lay.vpp) == ((9, 8, 8, 7), 2)
    with pytest.raises(LogError, match=r"megatron_llama3_8b.log: pipeline layout 'Et\*17L\|t\*15': 'E' must come first"):
        megatron_setup(dict(m.args, pipeline_model_parallel_layout="Et*17L|t*15"), model, m.source)


def test_megatron_arguments_carry_the_expert_layout():
    """An MoE run's printed expert grid and dispatcher become the layout it is priced with (Mixtral-8x7B has
    the fixture's 32 layers of 4096): EP 4, ETP from the run (else TP, Megatron's default), the flex
    dispatcher with DeepEP or HybridEP as 'deepep', the all-gather one where none is printed (Megatron's
    default), the combined 1F1B overlap, token dropping; experts that differ from the model's and a dense
    model given an MoE run are refused in one line."""
    m = read_log(LOGS / "megatron_llama3_8b.log")
    mix = planner.load_model("mixtral-8x7b")
    moe = dict(m.args, num_experts="8", moe_router_topk="2", expert_model_parallel_size="4",
               moe_token_dispatcher_type="alltoall")
    lay = megatron_setup(moe, mix, m.source)[1]
    assert (lay.ep, lay.expert_tp, lay.moe_dispatcher, lay.ep_overlap) == (4, lay.tp, "alltoall", False)
    lay = megatron_setup(dict(moe, expert_tensor_parallel_size="1", moe_token_dispatcher_type="flex",
                              moe_flex_dispatcher_backend="hybridep", overlap_moe_expert_parallel_comm="True"),
                         mix, m.source)[1]
    assert (lay.ep, lay.expert_tp, lay.moe_dispatcher, lay.ep_overlap) == (4, 1, "deepep", True)
    no_flag = {k: v for k, v in moe.items() if k != "moe_token_dispatcher_type"}  # Megatron's default, all-gather
    assert megatron_setup(no_flag, mix, m.source)[1].moe_dispatcher == "allgather"
    # token dropping is the run's workload: dropless where None (or negative, Megatron's none), else the factor
    # and whether inputs were padded to it
    for printed, want in (({}, (None, False)), ({"moe_expert_capacity_factor": "-1.0"}, (None, False)),
                          ({"moe_expert_capacity_factor": "1.25"}, (1.25, False)),
                          ({"moe_expert_capacity_factor": "1.0", "moe_pad_expert_input_to_capacity": "True"}, (1.0, True))):
        t = megatron_setup(dict(moe, **printed), mix, m.source)[0]
        assert (t.moe_capacity_factor, t.moe_pad_to_capacity) == want
    for bad, rule in (({"num_experts": "16"}, "the run has num_experts = 16, the model mixtral-8x7b has 8"),
                      ({"moe_router_topk": "1"}, "moe_router_topk = 1"),
                      ({"moe_token_dispatcher_type": "alltoall_seq"}, "'alltoall_seq' is not priced"),
                      ({"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "ncclep"}, "'ncclep' is not priced")):
        with pytest.raises(LogError, match=rule):
            megatron_setup(dict(moe, **bad), mix, m.source)
    with pytest.raises(LogError, match="the run has ffn_hidden_size = 11008, the model mixtral-8x7b has 14336"):
        megatron_setup(dict(moe, ffn_hidden_size="11008"), mix, m.source)
    with pytest.raises(LogError, match="the run has num_attention_heads = 64"):
        megatron_setup(dict(moe, num_attention_heads="64"), mix, m.source)
    with pytest.raises(LogError, match="the run has num_experts = 8, the model llama3-8b is dense"):
        megatron_setup(moe, planner.load_model(MODEL), m.source)
    assert megatron_setup(m.args, planner.load_model(MODEL), m.source)[1].ep == 1


def test_megatron_arguments_must_train_the_models_mtp_depths():
    """A run that printed mtp_num_layers 1 trained a depth the model must carry to be priced as run (and
    the other way round): refused in one line naming both; None (no MTP) matches a model without."""
    m = read_log(LOGS / "megatron_llama3_8b.log")
    model = planner.load_model(MODEL)
    assert megatron_setup(dict(m.args, mtp_num_layers="None"), model, m.source)[1].pp >= 1
    with pytest.raises(LogError, match="the run trains mtp_num_layers = 1, the model .* has mtp_layers = 0"):
        megatron_setup(dict(m.args, mtp_num_layers="1"), model, m.source)
    with_mtp = model.model_copy(update={"mtp_layers": 1})
    assert megatron_setup(dict(m.args, mtp_num_layers="1"), with_mtp, m.source)[0].seq_length == int(m.args["seq_length"])
    with pytest.raises(LogError, match="the run trains mtp_num_layers = 0, the model .* has mtp_layers = 1"):
        megatron_setup(m.args, with_mtp, m.source)


def test_megatron_arguments_carry_fp8_param_gather_and_bf16_end_layers():
    """--fp8-param-gather and --first-last-layers-bf16 with their counts (TransformerConfig's defaults
    1 and 1 where the dump omits them) reach the TrainingSpec the log is priced with; FP4 weights
    gathered in FP4 are refused, not priced as BF16 ones."""
    m = read_log(LOGS / "megatron_llama3_8b.log")
    model = planner.load_model(MODEL)
    args = dict(m.args, fp8="hybrid", fp8_recipe="tensorwise", fp8_param_gather="True",
                first_last_layers_bf16="True", num_layers_at_start_in_bf16="2")
    training, _ = megatron_setup(args, model, m.source)
    assert training.fp8_param_gather and (training.bf16_first_layers, training.bf16_last_layers) == (2, 1)
    training, _ = megatron_setup(dict(m.args, first_last_layers_bf16="True"), model, m.source)  # no recipe: no effect
    assert (training.fp8, training.bf16_first_layers, training.fp8_param_gather) == (None, 0, False)
    with pytest.raises(LogError, match="fp4_param_gather"):
        megatron_setup(dict(m.args, fp4="e2m1", fp4_recipe="nvfp4", fp4_param_gather="True"), model, m.source)


def test_megatron_arguments_carry_optimizer_offload():
    """--optimizer-cpu-offload with its fraction (1.0, the argument's default, where the dump omits it)
    prices the log offloaded, FP32 states although the precision-aware flag is on; without the D2H/H2D
    overlap, which the planner prices, the log is refused."""
    m = read_log(LOGS / "megatron_llama3_8b.log")
    model = planner.load_model(MODEL)
    on = dict(m.args, optimizer_cpu_offload="True", use_precision_aware_optimizer="True",
              exp_avg_dtype="torch.float32", exp_avg_sq_dtype="torch.float32", overlap_cpu_optimizer_d2h_h2d="True")
    training, _ = megatron_setup(dict(on, optimizer_offload_fraction="0.5"), model, m.source)
    assert (training.optimizer_offload, training.optimizer_states) == (0.5, "fp32")
    assert megatron_setup(on, model, m.source)[0].optimizer_offload == 1.0
    with pytest.raises(LogError, match="overlap_cpu_optimizer_d2h_h2d"):
        megatron_setup(dict(on, overlap_cpu_optimizer_d2h_h2d="False"), model, m.source)


def test_deepspeed_configuration_sets_batch_micro_batch_zero_and_dp(tmp_path):
    m = read_log(LOGS / "deepspeed_gpt.log")
    o = observation(m, planner.load_model("gpt3-13b"), TrainingSpec(global_batch_size=8, seq_length=2048),
                    Layout(tp=1))
    assert o.training.global_batch_size == 512
    assert (o.layout.dp, o.layout.micro_batch_size, o.layout.zero_stage) == (64, 2, 3)
    assert o.training.optimizer_impl == "deepspeed"  # priced on DeepSpeed's engine (its stage-3 reduce bucket)
    assert o.step_time_s == pytest.approx(512 / 60.52404149)
    out = io.StringIO()  # the CLI needs only what DeepSpeed does not print: the sequence length
    rc = main(["calibrate", "gpt3-13b", "dgx-a100-80g", str(LOGS / "deepspeed_gpt.log"), "--seq-length", "2048",
               "--out", str(tmp_path / "c.yaml")], stdout=out, stderr=io.StringIO())
    assert rc == 0 and "tp1 pp1 dp64 cp1 zero3 mbs2" in out.getvalue()


def test_megatron_deepspeed_logs_take_the_megatron_step():
    text = megatron_log(2.5, 10 * GIB) + deepspeed_log(40.0, 10 * GIB)
    m = parse_log(text)
    assert m.framework == "megatron" and m.value == pytest.approx(2.5)


def test_a_huge_line_is_skipped_not_scanned():
    # 2.6 MB of near-matches on one line: scanning it with the step patterns takes quadratic time
    line = "step: 1 loss: " + "memory: 1GiB " * 200_000
    assert parse_log(line + "\n" + megatron_log(2.0, 10 * GIB)).value == pytest.approx(2.0)


def test_megatron_log_recompute_modules_become_the_layouts():
    """Megatron prints recompute_modules as a Python list: the layout recomputes those modules (priced
    as such), its default means the attention core, and a module the planner does not price is refused."""
    m = read_log(LOGS / "megatron_llama3_8b.log")
    model = planner.load_model("llama3-8b")
    _, layout = megatron_setup(m.args, model, m.source)
    assert layout.recompute_modules is None and layout.recomputed_modules == ("core_attn",)
    _, layout = megatron_setup({**m.args, "recompute_modules": "['mlp', 'core_attn']"}, model, m.source)
    assert layout.recompute_modules == ("core_attn", "mlp")
    with pytest.raises(LogError, match="recompute_modules shared_experts are not priced"):
        megatron_setup({**m.args, "recompute_modules": "['shared_experts', 'core_attn']"}, model, m.source)


def test_a_zero_offload_run_is_read_and_priced_offloaded(tmp_path):
    """DeepSpeedConfig.print's zero_config line (its offload_optimizer device) and grad_accum_dtype, as
    deepspeed 0.19.8 prints them, make the observation ZeRO-Offload's: the whole partition on the host,
    FP32 accumulation, DeepSpeed's engine; calibrate runs on it end to end."""
    text = (LOGS / "deepspeed_gpt.log").read_text().replace("zero_optimization_stage ...... 3",
                                                            "zero_optimization_stage ...... 2")
    stamp = "[2026-11-28 12:00:01,222] [INFO] [config.py:1013:print]"
    extra = (f"{stamp}   grad_accum_dtype ............. fp32\n"
             f"{stamp}   zero_config .................. stage=2 contiguous_gradients=True reduce_scatter=True "
             "offload_param=None offload_optimizer=DeepSpeedZeroOffloadOptimizerConfig(device='cpu', nvme_path=None, "
             "buffer_count=4, pin_memory=True, pipeline_read=False, pipeline_write=False, fast_init=False, ratio=1.0)\n")
    first = text.index("\n") + 1
    log = tmp_path / "ds_offload.log"
    log.write_text(text[:first] + extra + text[first:])
    m = read_log(log)
    o = observation(m, planner.load_model("gpt3-13b"), TrainingSpec(global_batch_size=8, seq_length=2048), Layout(tp=1))
    assert (o.training.optimizer_offload, o.training.grad_dtype, o.training.optimizer_impl) == (1.0, "fp32", "deepspeed")
    assert o.layout.zero_stage == 2
    out = io.StringIO()
    rc = main(["calibrate", "gpt3-13b", "dgx-a100-80g", str(log), "--seq-length", "2048", "--out", str(tmp_path / "c.yaml")],
              stdout=out, stderr=io.StringIO())
    assert rc == 0 and "tp1 pp1 dp64 cp1 zero2 mbs2" in out.getvalue()


def test_cli_calibrate_prices_the_loss_the_nemo_run_used(tmp_path):
    """A NeMo log prints no arguments: --cross-entropy te prices Transformer Engine's loss (Megatron-Bridge's),
    whose last-rank ledger is 4 s b V / tp smaller than megatron-core's (2 B a logit held, not 6), less its
    three FP32 numbers a row (12 s b)."""
    flags = ["--nodes", "1", "--global-batch-size", "128", "--seq-length", "8192", "--tp", "1", "--pp", "1", "--dp", "8"]
    peaks = {}
    for loss in ("fp32", "te"):
        out = io.StringIO()
        rc = main(["calibrate", MODEL, "dgx-h100", str(LOGS / "nemo2_llama3_8b.log"), *flags, "--cross-entropy", loss,
                   "--out", str(tmp_path / f"{loss}.yaml"), "--json"], stdout=out, stderr=io.StringIO())
        assert rc == 0
        peaks[loss] = json.loads(out.getvalue())["runs"][0]["calibrated_peak_bytes"]  # no peak in the log: the ledger's
    assert peaks["fp32"] - peaks["te"] == pytest.approx(4 * 8192 * 128_256 - 12 * 8192, rel=1e-9)


def test_megatron_arguments_of_a_hybrid_run_give_its_split_and_must_match_the_model():
    """A hybrid run prints its --hybrid-layer-pattern: its pipes are the layers per virtual stage (Nano's 52 as
    30 | 22 on pp 2), its '/' parts the MTP depths ('*E' twice for Super, with the repeated layer and the
    1,024-wide latent); a pattern, latent or repeated layer the model does not have is refused in one line,
    and so are a hybrid run given a transformer model and the reverse."""
    m = read_log(LOGS / "megatron_llama3_8b.log")
    nano, sup = planner.load_model("nemotron-3-nano-30b-a3b"), planner.load_model("nemotron-3-super-120b-a12b")
    base = dict(m.args, num_layers="52", hidden_size="2688", num_attention_heads="32", ffn_hidden_size="1856",
                num_experts="128", moe_router_topk="6", expert_model_parallel_size="8", expert_tensor_parallel_size="1",
                moe_token_dispatcher_type="alltoall", tensor_model_parallel_size="1", pipeline_model_parallel_size="2")
    pattern = nano.layer_pattern
    _, lay = megatron_setup(dict(base, hybrid_layer_pattern=f"{pattern[:30]}|{pattern[30:]}"), nano, m.source)
    assert (lay.pipeline_layers, lay.pp, lay.vpp) == ((30, 22), 2, 1)
    assert megatron_setup(dict(base, hybrid_layer_pattern=pattern), nano, m.source)[1].pipeline_layers is None
    for bad, rule in (({"hybrid_layer_pattern": pattern.replace("*", "M", 1)}, "is not the model's"),
                      ({}, "prints no hybrid_layer_pattern, but the model nemotron-3-nano-30b-a3b is a hybrid")):
        with pytest.raises(LogError, match=rule):
            megatron_setup(dict(base, **bad), nano, m.source)
    with pytest.raises(LogError, match="the run is a hybrid"):
        megatron_setup(dict(m.args, hybrid_layer_pattern="M*M*"), planner.load_model(MODEL), m.source)
    sup_args = dict(base, num_layers="88", hidden_size="4096", ffn_hidden_size="2688", num_experts="512",
                    moe_router_topk="22", moe_latent_size="1024", mtp_num_layers="2", mtp_use_repeated_layer="True",
                    pipeline_model_parallel_size="1", hybrid_layer_pattern=sup.layer_pattern + "/*E/*E")
    assert megatron_setup(sup_args, sup, m.source)[1].pipeline_layers is None
    for bad, rule in (({"moe_latent_size": "None"}, "moe_latent_size = None, the model nemotron-3-super-120b-a12b has 1024"),
                      ({"mtp_use_repeated_layer": "False"}, "mtp_use_repeated_layer = False"),
                      ({"hybrid_layer_pattern": sup.layer_pattern + "/*-/*-"}, "MTP depths")):
        with pytest.raises(LogError, match=rule):
            megatron_setup(dict(sup_args, **bad), sup, m.source)


def test_hybrid_runs_move_the_scan_efficiency_and_transformer_runs_do_not():
    """Nano's logs from a cluster whose scan kernels reach 30 % of their roofline pull the fitted
    efficiency well below the catalog's 1 (the priors share the slowdown with the GEMM curve, which
    scales with the tokens as the scan does) and fit the logs; a transformer's log leaves it at 1."""
    nano, base = planner.load_model("nemotron-3-nano-30b-a3b"), planner.load_cluster("dgx-h100", nodes=2)
    truth = apply_factors(base, {"mamba_scan": 0.3})
    runs = [(TrainingSpec(global_batch_size=64, seq_length=8192), Layout(tp=1, dp=16, ep=8, zero_stage=1)),
            (TrainingSpec(global_batch_size=64, seq_length=4096),
             Layout(tp=2, dp=8, ep=8, etp=1, sequence_parallel=True, zero_stage=1)),
            (TrainingSpec(global_batch_size=128, seq_length=8192), Layout(tp=1, pp=2, dp=8, ep=8, zero_stage=1))]
    obs = [observation(parse_log(megatron_log(planner.evaluate(nano, truth, t, lay).step_time_s, 60 * GIB)), nano, t, lay)
           for t, lay in runs]
    r = calibrate(base, obs)
    factors = [r.factors[p.name] for p in PARAMETERS if p.unit is None and p.name != "mamba_scan"]
    assert r.factors["mamba_scan"] < 0.6 and r.factors["mamba_scan"] < min(factors)
    assert r.cluster.calibration.mamba_scan_efficiency == pytest.approx(r.factors["mamba_scan"])
    assert r.median_error("after") < 0.01 < 0.1 < r.median_error("before")
    model, one = planner.load_model(MODEL), planner.load_cluster("dgx-h100", nodes=1)
    t, lay = TrainingSpec(global_batch_size=64, seq_length=8192), Layout(tp=8, dp=1, zero_stage=1, sequence_parallel=True)
    step = planner.evaluate(model, apply_factors(one, {"gemm": 0.85}), t, lay).step_time_s
    r = calibrate(one, [observation(parse_log(megatron_log(step, 30 * GIB)), model, t, lay)])
    assert r.factors["mamba_scan"] == 1.0 and any(n.startswith("mamba_scan: not moved") for n in r.notes)


def test_the_scan_runs_at_its_calibrated_share_of_the_roofline():
    """mamba_scan_time is the roofline (147,456 B a token of HBM traffic for Nano at tp 1, its FLOPs below it)
    divided by Calibration.mamba_scan_efficiency."""
    from planner.cost import mamba_scan_time

    nano, c = planner.load_model("nemotron-3-nano-30b-a3b"), planner.load_cluster("dgx-h100")
    roof = 8192 * 147_456 / (c.gpu.hbm_bandwidth * c.calibration.hbm_efficiency)
    assert mamba_scan_time(nano, c, 8192, 1) == pytest.approx(roof)
    assert mamba_scan_time(nano, apply_factors(c, {"mamba_scan": 0.25}), 8192, 1) == pytest.approx(4 * roof)


# --- the MoE parameters: a host stall at each MoE forward's sync, the dispatch and combine's speed

QWEN_MOE = "qwen3-30b-a3b"  # 48 layers, every one MoE


def _no_stall(c):
    """The cluster with its host never stalling at an MoE forward's sync (the catalog prices 1.5 ms, fitted on the
    published MoE runs); the tests below plant their own."""
    return c.model_copy(update={"calibration": c.calibration.model_copy(update={"moe_host_stall": 0.0})})


def test_a_host_stall_idles_every_moe_forward_once_and_again_where_recomputed():
    """Qwen3-30B-A3B on one DGX H100, ep 8, GBS 32 x 4,096 at micro-batch 1: 4 micro-batches x 48 MoE layers,
    so a 1 ms stall at each forward's host sync adds 4 x 48 x 1 ms = 0.192 s to the step; full recompute runs
    each forward twice (0.384 s); the dispatch's own time does not move."""
    m, c = planner.load_model(QWEN_MOE), _no_stall(planner.load_cluster("dgx-h100", nodes=1))
    t = TrainingSpec(global_batch_size=32, seq_length=4096)
    stalled = apply_factors(c, {"moe_stall": 1e-3})
    assert stalled.calibration.moe_host_stall == pytest.approx(1e-3)
    for rc, extra in (("none", 0.192), ("full", 0.384)):
        lay = Layout(tp=1, dp=8, ep=8, zero_stage=1, recompute=rc)
        before, after = planner.evaluate(m, c, t, lay), planner.evaluate(m, stalled, t, lay)
        assert after.step_time_s - before.step_time_s == pytest.approx(extra, abs=2e-4)
    lay = Layout(tp=1, dp=8, ep=8, zero_stage=1, recompute="selective", recompute_modules=("moe",))
    assert (planner.evaluate(m, stalled, t, lay).step_time_s - planner.evaluate(m, c, t, lay).step_time_s
            == pytest.approx(0.384, abs=2e-4))
    # the EP overlap hides the all-to-alls beside the other micro-batch's compute, not the stall: the host waits
    # at the sync for every queued kernel before it issues the next (planner.cost.ep_overlap_exposed)
    lay = Layout(tp=1, dp=8, ep=8, zero_stage=1, ep_overlap=True)
    assert (planner.evaluate(m, stalled, t, lay).step_time_s - planner.evaluate(m, c, t, lay).step_time_s
            == pytest.approx(0.192, abs=2e-4))
    # a dense model has no MoE layer to stall, and the stall is never negative
    dense = planner.load_model(MODEL)
    lay = Layout(tp=1, dp=8, zero_stage=1)
    assert planner.evaluate(dense, stalled, t, lay).step_time_s == planner.evaluate(dense, c, t, lay).step_time_s
    assert apply_factors(c, {"moe_stall": -5e-3}).calibration.moe_host_stall == 0.0


def test_the_dispatch_and_combine_run_at_the_calibrated_speed():
    """ep_comm scales the whole EP term (dispatch and combine, both directions) by 1 / factor and nothing else
    (the host's stall, counted with the forward's dispatch, is set to none here: it is not the network's)."""
    m, c = planner.load_model(QWEN_MOE), _no_stall(planner.load_cluster("dgx-h100", nodes=2))
    t = TrainingSpec(global_batch_size=64, seq_length=4096)
    for lay in (Layout(tp=1, dp=16, ep=16, zero_stage=1), Layout(tp=2, dp=8, ep=4, etp=2, sequence_parallel=True, zero_stage=1),
                Layout(tp=1, dp=16, ep=8, zero_stage=1, moe_dispatcher="allgather")):
        before = planner.evaluate(m, c, t, lay).time.breakdown()
        after = planner.evaluate(m, apply_factors(c, {"ep_comm": 0.5}), t, lay).time.breakdown()
        assert before["ep_comm"] > 0.01
        assert after["ep_comm"] == pytest.approx(2 * before["ep_comm"], rel=1e-3)
        assert after["compute"] == pytest.approx(before["compute"], rel=1e-6)


@pytest.fixture(scope="module")
def moe_recovered():
    """Qwen3-30B-A3B's logs from two DGX H100 whose MoE layers stall 0.6 ms at each forward's host sync and
    whose dispatch and combine run at 0.8 of the priced speed; layouts vary the micro-batch (the stall is per
    micro-batch, the all-to-all per token) and where EP runs (inside a node, across both). The host's floor
    under the grouped GEMMs (calibration.grouped_gemm_call) is off on both sides: where it binds, the GEMMs'
    time no longer moves with the GEMM factor, which the stall then shares (0.71 ms recovered with it on)."""
    m, base = planner.load_model(QWEN_MOE), _no_stall(planner.load_cluster("dgx-h100", nodes=2))
    base = base.model_copy(update={"calibration": base.calibration.model_copy(update={"grouped_gemm_call": 0.0})})
    truth = apply_factors(base, {"moe_stall": 0.6e-3, "ep_comm": 0.8})
    runs = [(TrainingSpec(global_batch_size=64, seq_length=4096), Layout(tp=1, dp=16, ep=8, zero_stage=1)),
            (TrainingSpec(global_batch_size=128, seq_length=4096), Layout(tp=1, dp=16, ep=8, zero_stage=1, micro_batch_size=4)),
            (TrainingSpec(global_batch_size=64, seq_length=4096), Layout(tp=1, dp=16, ep=16, zero_stage=1)),
            (TrainingSpec(global_batch_size=64, seq_length=8192), Layout(tp=1, dp=16, ep=4, zero_stage=1)),
            (TrainingSpec(global_batch_size=64, seq_length=4096), Layout(tp=1, pp=2, dp=8, ep=8, zero_stage=1))]
    obs = [observation(parse_log(megatron_log(planner.evaluate(m, truth, t, lay).step_time_s, 60 * GIB)), m, t, lay)
           for t, lay in runs]
    return m, base, truth, calibrate(base, obs)


def test_moe_runs_recover_the_stall_and_the_dispatch_speed(moe_recovered):
    _, _, _, r = moe_recovered
    assert r.factors["moe_stall"] == pytest.approx(0.6e-3, rel=0.15)
    assert 0.75 < r.factors["ep_comm"] < 0.95  # the priors share the slower all-to-all with the NIC and the GEMMs
    assert r.factors["gemm"] == pytest.approx(1.0, rel=0.07)
    assert r.median_error("after") < 0.01 < 0.1 < r.median_error("before")
    assert r.cluster.calibration.moe_host_stall == pytest.approx(r.factors["moe_stall"])
    assert f"moe_stall +{r.factors['moe_stall'] * 1e3:.3f} ms" in planner.calibration.calibrated_yaml(r)


@pytest.fixture(scope="module")
def floor_recovered():
    """Qwen3-30B-A3B's logs from two DGX H100 whose host takes 120 us per expert GEMM (a slower CPU than the
    catalog's 45 us): 128 experts of 768, a few hundred tokens each, so the grouped GEMMs wait on the host.
    The layouts vary the local experts (ep 4, 8, 16: 32, 16, 8 per GPU), which the floor scales with, and
    the micro-batch, which the stall at each forward's host sync does not."""
    m, base = planner.load_model(QWEN_MOE), planner.load_cluster("dgx-h100", nodes=2)
    truth = base.model_copy(update={"calibration": base.calibration.model_copy(update={"grouped_gemm_call": 120e-6})})
    runs = [(TrainingSpec(global_batch_size=64, seq_length=4096), Layout(tp=1, dp=16, ep=4, zero_stage=1)),
            (TrainingSpec(global_batch_size=64, seq_length=4096), Layout(tp=1, dp=16, ep=8, zero_stage=1)),
            (TrainingSpec(global_batch_size=128, seq_length=4096), Layout(tp=1, dp=16, ep=8, zero_stage=1, micro_batch_size=4)),
            (TrainingSpec(global_batch_size=64, seq_length=4096), Layout(tp=1, dp=16, ep=16, zero_stage=1))]
    obs = [observation(parse_log(megatron_log(planner.evaluate(m, truth, t, lay).step_time_s, 60 * GIB)), m, t, lay)
           for t, lay in runs]
    return m, base, truth, calibrate(base, obs)


def test_moe_runs_recover_the_hosts_time_per_expert_gemm(floor_recovered):
    """The fit moves calibration.grouped_gemm_call (expert_call, added seconds) toward the planted 120 us and
    leaves the stall near the catalog's; the calibrated YAML says what it added."""
    m, base, truth, r = floor_recovered
    assert base.calibration.grouped_gemm_call == pytest.approx(45e-6)
    assert r.cluster.calibration.grouped_gemm_call == pytest.approx(120e-6, rel=0.1)
    assert abs(r.factors["moe_stall"]) < 0.3e-3  # beside the ~2 ms a grouped GEMM of 32 experts waits
    assert r.median_error("after") < 0.01 < 0.1 < r.median_error("before")
    assert f"expert_call {r.factors['expert_call'] * 1e6:+.1f} us" in planner.calibration.calibrated_yaml(r)
    t, lay = TrainingSpec(global_batch_size=64, seq_length=4096), Layout(tp=1, dp=16, ep=2, zero_stage=1)
    want = planner.evaluate(m, truth, t, lay).step_time_s  # 64 local experts: a layout the logs did not run
    assert abs(planner.evaluate(m, r.cluster.model_copy(update={"num_nodes": 2}), t, lay).step_time_s / want - 1) < 0.03


def test_a_cluster_calibrated_on_one_moe_model_warns_for_another(floor_recovered, recovered, tmp_path):
    """Fitted on Qwen3-30B-A3B's logs, the host's floor follows its 128 experts of 768; the calibrated cluster
    (and its YAML) names the model, and evaluate warns where another MoE model is priced with it, not where
    the same model or a dense one is, nor on the catalog's cluster or one calibrated on dense logs."""
    m, base, _, r = floor_recovered
    assert r.cluster.calibration.moe_fitted_on == ("qwen3-30b-a3b",)
    assert any(n.startswith("fitted on the MoE model qwen3-30b-a3b: plan it with this cluster") for n in r.notes)
    path = tmp_path / "mine.yaml"
    path.write_text(planner.calibration.calibrated_yaml(r))
    mine = planner.load_cluster(str(path), nodes=2)
    assert mine.calibration.moe_fitted_on == ("qwen3-30b-a3b",)
    assert r.cluster.memory_overhead == mine.memory_overhead == 0  # the logs' 60 GiB peaks sit under the ledger
    mixtral, dense = planner.load_model("mixtral-8x7b"), planner.load_model("llama3-8b")
    t = TrainingSpec(global_batch_size=64, seq_length=4096)
    cases = ((mixtral, Layout(tp=2, dp=8, ep=8, zero_stage=1, sequence_parallel=True)),
             (m, Layout(tp=1, dp=16, ep=8, zero_stage=1)), (dense, Layout(tp=2, dp=8, zero_stage=1)))

    def warned(cluster, model, lay) -> bool:
        return any(f"was fitted on the MoE logs of qwen3-30b-a3b, not {model.name}" in w
                   for w in planner.evaluate(model, cluster, t, lay).warnings)
    assert [warned(mine, model, lay) for model, lay in cases] == [True, False, False]
    assert not any(warned(c, mixtral, cases[0][1]) for c in (base, recovered[3].cluster.model_copy(update={"num_nodes": 2})))
    assert recovered[3].cluster.calibration.moe_fitted_on == ()


def test_the_moe_calibrated_cluster_predicts_other_moe_layouts(moe_recovered):
    m, base, truth, r = moe_recovered
    for t, lay in ((TrainingSpec(global_batch_size=64, seq_length=4096), Layout(tp=2, dp=8, ep=8, etp=1, sequence_parallel=True, zero_stage=1)),
                   (TrainingSpec(global_batch_size=128, seq_length=4096), Layout(tp=1, dp=16, ep=16, zero_stage=1, micro_batch_size=2))):
        want = planner.evaluate(m, truth, t, lay).step_time_s
        got = planner.evaluate(m, r.cluster.model_copy(update={"num_nodes": 2}), t, lay).step_time_s
        assert abs(got / want - 1) < 0.03 < abs(planner.evaluate(m, base, t, lay).step_time_s / want - 1)


FSDP_RUNS = [  # FSDP runs whose collectives outlast the share of the compute that hides them, beside two
    # without FSDP that pin the GEMMs and the NIC (the overlap's window is compute, its excess network time)
    (TrainingSpec(global_batch_size=32, seq_length=2048), Layout(dp=32, zero_stage=3)),
    (TrainingSpec(global_batch_size=64, seq_length=4096), Layout(dp=32, zero_stage=3, micro_batch_size=2)),
    (TrainingSpec(global_batch_size=64, seq_length=8192), Layout(tp=2, dp=16, zero_stage=3, sequence_parallel=True)),
    (TrainingSpec(global_batch_size=64, seq_length=2048),
     Layout(dp=32, zero_stage=2, overlap_grad_reduce=True, overlap_param_gather=True)),
    (TrainingSpec(global_batch_size=32, seq_length=8192), Layout(dp=32, zero_stage=1)),
    (TrainingSpec(global_batch_size=32, seq_length=2048), Layout(dp=32, zero_stage=1)),
    (TrainingSpec(global_batch_size=256, seq_length=8192), Layout(tp=8, dp=4, zero_stage=1, sequence_parallel=True)),
]


def test_fsdp_runs_recover_the_share_of_compute_that_hides_their_collectives():
    """Logs from four DGX H100 whose FSDP prefetch hides 0.4 of each micro-batch's compute (the catalog prices none,
    fitted on FSDP1's published runs; FSDP2's may hide more): the fit adds the share (fsdp_overlap, to
    calibration.dp_overlap) and leaves the GEMMs and the NIC where the runs without FSDP pin them; the calibrated
    cluster prices an FSDP layout the logs did not run, and the YAML says what was added."""
    m, base = planner.load_model(MODEL), planner.load_cluster("dgx-h100", nodes=4)
    assert base.calibration.dp_overlap == 0.0
    truth = apply_factors(base, {"fsdp_overlap": 0.4})
    obs = [observation(parse_log(megatron_log(planner.evaluate(m, truth, t, lay).step_time_s, 60 * GIB)), m, t, lay)
           for t, lay in FSDP_RUNS]
    r = calibrate(base, obs)
    assert r.factors["fsdp_overlap"] == pytest.approx(0.4, abs=0.03)
    assert r.cluster.calibration.dp_overlap == pytest.approx(r.factors["fsdp_overlap"])
    assert r.factors["gemm"] == pytest.approx(1.0, abs=0.02) and r.factors["scaleout"] == pytest.approx(1.0, abs=0.03)
    assert r.median_error("after") < 0.01 < 0.1 < r.median_error("before")
    assert f"fsdp_overlap {r.factors['fsdp_overlap']:+.3f}" in planner.calibration.calibrated_yaml(r)
    t, lay = TrainingSpec(global_batch_size=128, seq_length=4096), Layout(tp=2, dp=16, zero_stage=3, micro_batch_size=4,
                                                                          sequence_parallel=True)
    want = planner.evaluate(m, truth, t, lay).step_time_s
    got = planner.evaluate(m, r.cluster.model_copy(update={"num_nodes": 4}), t, lay).step_time_s
    assert abs(got / want - 1) < 0.02 < abs(planner.evaluate(m, base, t, lay).step_time_s / want - 1)


def test_explain_says_what_fsdps_collectives_leave_exposed_and_whose_share_hides_them():
    """A ZeRO-3 plan: explain gives the exposed FSDP seconds, the prefetch share that priced them (the catalog's 0,
    fitted on FSDP1's runs, or a calibrated one) and the step at half the compute hiding them, which is faster."""
    import re

    from planner.explain import explain

    m, c = planner.load_model(MODEL), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=128, seq_length=8192)
    line = next(x for x in explain(m, c, t, sensitivities=False, zero_stage=3) if x.startswith("FSDP's"))
    assert "hiding 0% of each micro-batch's compute (the catalog's" in line and "fsdp_overlap" in line
    assert float(re.search(r"hide 50%, the step would take ([-+][0-9.]+)%", line).group(1)) < 0
    mine = c.model_copy(update={"calibration": c.calibration.model_copy(update={"dp_overlap": 0.05}),
                                "provenance": {**c.provenance, "calibration.dp_overlap": "planner calibrate on fsdp.log"}})
    line = next(x for x in explain(m, mine, t, sensitivities=False, zero_stage=3) if x.startswith("FSDP's"))
    assert "hiding 5% of each micro-batch's compute (as calibrated)" in line
    assert not any(x.startswith("FSDP's") for x in explain(m, c, t, sensitivities=False, zero_stage=1))


def test_dense_runs_leave_the_moe_parameters_at_the_catalog(recovered):
    _, _, _, r = recovered
    assert any(n.startswith("fsdp_overlap: not moved") for n in r.notes)  # no FSDP among them either
    for name in ("moe_stall", "ep_comm", "expert_call"):
        assert any(n.startswith(f"{name}: not moved") for n in r.notes)
    catalog = planner.load_cluster("dgx-h100").calibration
    assert r.cluster.calibration.moe_host_stall == catalog.moe_host_stall and r.cluster.calibration.ep_comm_speed == 1.0


def test_explain_names_the_calibrated_moe_parameters():
    from planner.explain import explain

    m, c = planner.load_model(QWEN_MOE), planner.load_cluster("dgx-h100", nodes=2)
    t = TrainingSpec(global_batch_size=256, seq_length=4096)
    mine = apply_factors(c, {"moe_stall": 0.5e-3, "ep_comm": 0.8})  # as calibrate leaves a cluster fitted on MoE logs
    mine = mine.model_copy(update={"calibration": mine.calibration.model_copy(update={"moe_fitted_on": (QWEN_MOE,)})})
    lines = explain(m, mine, t, sensitivities=False, time_limit_s=60, ep=8)
    assert any("0.80x the priced speed and with a 2.00 ms host stall in each MoE forward, as calibrated" in x
               for x in lines), lines  # the catalog's 1.5 ms and the fitted 0.5 ms
    catalog = explain(m, c, t, sensitivities=False, time_limit_s=60, ep=8)
    assert not any("as calibrated" in x for x in catalog)
    assert any("with a 1.50 ms host stall in each MoE forward, the catalog's, fitted on the published MoE runs" in x
               for x in catalog), catalog


def test_an_moe_run_with_cuda_graphs_is_flagged():
    """A run that captured CUDA graphs (printed cuda_graph_impl, or the deprecated flags Megatron turns into
    it) ran without the host stalls the planner's launches pay: calibrate says so in one note per run."""
    m = read_log(LOGS / "megatron_llama3_8b.log")
    mix = planner.load_model("mixtral-8x7b")
    moe = dict(m.args, num_experts="8", moe_router_topk="2", expert_model_parallel_size="4",
               moe_token_dispatcher_type="alltoall")
    t, lay = megatron_setup(moe, mix, m.source)
    step = planner.evaluate(mix, planner.load_cluster("dgx-h100", nodes=2), t, lay).step_time_s
    base = planner.load_cluster("dgx-h100")
    for printed, impl in (({}, None), ({"cuda_graph_impl": "none"}, None), ({"cuda_graph_impl": "transformer_engine"},
                          "transformer_engine"), ({"enable_cuda_graph": "True"}, "local")):
        obs = observation(parse_log(megatron_log(step, 60 * GIB, args=dict(moe, **printed)), "moe.log"), mix)
        assert obs.cuda_graphs == impl
        flagged = [n for n in calibrate(base, [obs]).notes if "captured CUDA graphs" in n]
        assert len(flagged) == (impl is not None)
        if impl:
            assert flagged[0].startswith(f"moe.log: captured CUDA graphs (cuda_graph_impl {impl})")
