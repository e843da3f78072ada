"""Hostile and careless input: no false answers, no tracebacks, no injection.

Each class of defect has its own tests: honest statuses under the time limit, strict types and
physical ranges at every boundary, the loaders, escaping for scripts / TOML / the terminal,
output folders, scale, and deterministic JSON.
"""

import io
import json
import math
import os
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

import planner
from planner.catalog import load_cluster, load_model, model_from_hf_config
from planner.cli import main
from planner.errors import PlannerError
from planner.search import STATUSES, plan
from planner.space import framework_training

SMALL = ["--nodes", "1", "--global-batch-size", "16", "--seq-length", "4096"]


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def small():
    return (load_model("llama3-8b"), load_cluster("dgx-h100", nodes=1),
            planner.TrainingSpec(global_batch_size=16, seq_length=4096))


# --- statuses ---------------------------------------------------------------------------------

def test_time_out_is_unknown_never_infeasible():
    """A limit too short to build the tables answers 'unknown' (exit 3), not a false 'infeasible'."""
    r = plan(*small(), time_limit_s=1e-6)
    assert r.status == "unknown" and r.best is None and r.infeasibility is None and r.gap is None
    code, out, _ = run(["plan", "llama3-8b", "dgx-h100", *SMALL, "--time-limit", "0.000001"])
    assert code == 3 and "unknown" in out and "infeasible" not in out


def test_default_limit_is_optimal_on_the_same_problem():
    assert plan(*small(), top_k=1, structural=False).status == "optimal"


@pytest.mark.parametrize("limit", [0, -1, math.nan, math.inf, True, "10", 10**9])
def test_invalid_time_limits_are_refused(limit):
    with pytest.raises(PlannerError, match="time_limit_s"):
        plan(*small(), time_limit_s=limit)


def test_proven_infeasible_is_exit_1_and_explain_too():
    args = ["llama3.1-405b", "dgx-h100", "--nodes", "1", "--global-batch-size", "8", "--seq-length", "8192"]
    code, out, _ = run(["plan", *args])
    assert code == 1 and "infeasible (proven)" in out
    code, out, _ = run(["explain", *args])
    assert code == 1 and "nothing fits" in out


def test_infeasibility_analysis_is_bounded_by_the_limit():
    """The answer to 'nothing fits' shares the call's limit and says what it did not search."""
    m = load_model("megatron-gpt-1t")
    c = load_cluster("dgx-a100-40g", nodes=1)
    r = plan(m, c, planner.TrainingSpec(global_batch_size=8, seq_length=2048), time_limit_s=0.5)
    assert r.status in ("infeasible", "unknown")
    if r.status == "infeasible":
        assert "time limit" in r.infeasibility.message or "fits on" in r.infeasibility.message \
            or "nothing fits even on" in r.infeasibility.message


@pytest.mark.parametrize("model,kw,why,after", [
    ("llama3-8b", dict(tp=3), "tp=3: tp(3) must divide the NVLink domain (8 GPUs)", "no cluster of up to"),
    ("qwen3-30b-a3b", dict(ep=3), "ep=3: num_experts(128) % ep(3) = 2 != 0", "no cluster of up to"),
    ("llama3-8b", dict(pp=64), "pp=64: pp(64) > num_layers(32)", "no cluster of up to"),
    ("llama3-8b", dict(tp=8, pp=2, dp=2), "tp(8) x pp(2) x dp(2) = 32 does not divide world_size(8)", "fits on 32 GPUs"),
    ("llama3-8b", dict(micro_batch_size=5), "micro_batch_size=5: global_batch_size(64) % (dp(", "no cluster of up to"),
])
def test_a_constraint_that_leaves_no_legal_layout_is_named_with_its_rule(model, kw, why, after):
    """Proven infeasible by a rule, not by memory: the message names the constraint and the rule its value
    breaks (hand arithmetic: 32 heads, 128 experts, 32 layers, 8 GPUs a node, 64 sequences), and says
    whether more GPUs help instead of 'nothing fits even on N GPUs'."""
    r = plan(load_model(model), load_cluster("dgx-h100", nodes=1), planner.TrainingSpec(global_batch_size=64,
             seq_length=4096), time_limit_s=30, **kw)
    msg = r.infeasibility.message
    assert r.status == "infeasible" and msg.startswith("no legal layout") and why in msg and after in msg, msg
    assert "nothing fits even" not in msg


def test_the_rule_search_of_an_empty_space_keeps_to_its_deadline():
    """Each constraint is tried by rebuilding the space without it; past the deadline none is, and it says so."""
    from planner.space import empty_space_reasons

    m, c, t = load_model("llama3-8b"), load_cluster("dgx-h100", nodes=1), planner.TrainingSpec(global_batch_size=64,
                                                                                                  seq_length=4096)
    assert empty_space_reasons(m, c, t, constraints={"tp": 3, "zero_stage": 1}, deadline=0.0) == [
        "the constraints not checked one by one within the time limit"]
    assert empty_space_reasons(m, c, t, constraints={"tp": 3, "zero_stage": 1})[0].startswith("tp=3: tp(3) must divide")


def test_a_layout_with_several_mistakes_names_them_all_on_one_line():
    """DeepSeek-V3 on 1,024 GPUs at tp 2, pp 16, ep 64 breaks four rules (hand arithmetic: tp x dp = 2 x 32 = 64 is
    no multiple of ep x etp = 128; MoE and MLA with TP need sequence parallelism; 61 layers over 16 ranks leave
    13): the user sees all four at once, not the first and a count."""
    m, c = load_model("deepseek-v3"), load_cluster("dgx-h100", nodes=128)
    t = planner.TrainingSpec(global_batch_size=8192, seq_length=4096)
    with pytest.raises(planner.errors.InvalidLayout) as err:
        planner.evaluate(m, c, t, planner.Layout(tp=2, pp=16, dp=32, ep=64, zero_stage=1))
    msg = str(err.value)
    assert "\n" not in msg and "more)" not in msg
    for rule in ("tp(2)*cp(1)*dp(32) = 64 is not a multiple of ep(64)*etp(2)", "MoE with tp(2) > 1 needs sequence_parallel",
                 "multi-latent attention with tp(2) > 1", "num_layers(61) % pp(16) = 13 != 0"):
        assert rule in msg, msg


# --- API arguments and constraints -------------------------------------------------------------

@pytest.mark.parametrize("kw,name", [
    (dict(tp="8"), "tp"), (dict(tp=True), "tp"), (dict(tp=0), "tp"), (dict(pp=(8, 2)), "pp"),
    (dict(zero_stage=4), "zero_stage"), (dict(recompute="sel"), "recompute"), (dict(recompute=[]), "recompute"),
    (dict(sequence_parallel=1), "sequence_parallel"), (dict(rank_order="pp-dp"), "rank_order"),
    (dict(top_k=1.5), "top_k"), (dict(top_k=True), "top_k"), (dict(top_k=0), "top_k"),
    (dict(framework="jax"), "framework"), (dict(allow_idle=1), "allow_idle"), (dict(bogus=1), "bogus"),
])
def test_api_arguments_are_typed(kw, name):
    with pytest.raises(PlannerError, match=name):
        plan(*small(), **kw)


def test_api_refuses_specs_of_the_wrong_kind():
    m, c, t = small()
    with pytest.raises(PlannerError, match="model"):
        plan("llama3-8b", c, t)
    with pytest.raises(PlannerError, match="training"):
        plan(m, c, {"global_batch_size": 16})


def test_allow_idle_when_idling_is_fastest():
    """tp = pp = cp = 1 and 4 sequences on 8 GPUs: only dp 4 on 4 GPUs is legal, so the best plan
    idles half the GPUs; it must come back as a plan (it used to raise InvalidLayout)."""
    m, c, _ = small()
    t = planner.TrainingSpec(global_batch_size=4, seq_length=4096)
    assert plan(m, c, t, tp=1, pp=1, cp=1, top_k=1, structural=False).status == "infeasible"
    r = plan(m, c, t, tp=1, pp=1, cp=1, allow_idle=True, top_k=3)
    assert r.status == "optimal" and r.best.num_gpus == 4 and r.best.layout.dp == 4


# --- specs: strict types and physical ranges ---------------------------------------------------

@pytest.mark.parametrize("path,value,field", [
    (("calibration", "attention_efficiency"), 50, "attention_efficiency"),
    (("calibration", "hbm_efficiency"), 0, "hbm_efficiency"),
    (("calibration", "dp_overlap"), -0.5, "dp_overlap"),
    (("calibration", "gemm_efficiency"), [], "gemm_efficiency"),
    (("calibration", "gemm_efficiency"), [[1, 0.5], [1, 0.6]], "gemm_efficiency"),
    (("calibration", "gemm_efficiency"), [[1, 0.6], [2, 0.5]], "gemm_efficiency"),
    (("calibration", "gemm_efficiency"), [[1, 1.5]], "gemm_efficiency"),
    (("calibration", "attention_length_curve"), [[4096, 0.9, 0.8], [2048, 0.7, 0.6], [8192, 1, 0.9]],
     "attention_length_curve"),
    (("calibration", "attention_length_curve"), [[4096, 0.9, 0.8], [16384, 1.1, 0.9]], "attention_length_curve"),
    (("calibration", "attention_length_curve"), [[8192, 1, 0]], "attention_length_curve"),
    (("nvlink", "busbw_curve"), [], "busbw_curve"),
    (("nvlink", "latency"), math.inf, "latency"),
    (("nvlink", "ring_busbw"), math.nan, "ring_busbw"),
    (("gpu", "peak_bf16_flops"), math.inf, "peak_bf16_flops"),
    (("gpu", "peak_bf16_flops"), -1, "peak_bf16_flops"),
    (("gpu", "memory"), "1e999 GB", "memory"),
    (("scaleout", "nic_busbw"), 0, "nic_busbw"),
    (("num_nodes",), True, "num_nodes"),
    (("num_nodes",), "2", "num_nodes"),
    (("num_nodes",), 10**7, "num_nodes"),
    (("memory_overhead",), "100 GiB", "memory_overhead"),
])
def test_non_physical_cluster_values_are_refused(path, value, field):
    data = load_cluster("dgx-h100").model_dump()
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(PlannerError) as err:
        load_cluster("dgx-h100", **{path[0]: data[path[0]]})
    assert field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kw,field", [
    (dict(num_layers=True), "num_layers"), (dict(hidden_size="4096"), "hidden_size"),
    (dict(vocab_size=10**30), "vocab_size"), (dict(num_layers=4.0), "num_layers"),
    (dict(tied_embeddings=1), "tied_embeddings"), (dict(name=7), "name"),
])
def test_model_fields_are_strict(kw, field):
    base = load_model("llama3-8b").model_dump(exclude={"sources", "provenance"})
    with pytest.raises(PlannerError) as err:
        planner.ModelSpec(**(base | kw))
    assert field in str(err.value)


@pytest.mark.parametrize("kw,field", [
    (dict(global_batch_size=10**11, seq_length=8), "global_batch_size"),
    (dict(global_batch_size=8, seq_length=10**12), "seq_length"),
    (dict(global_batch_size=2**24, seq_length=2**24), "global_batch_size"),
    (dict(global_batch_size=True, seq_length=8), "global_batch_size"),
    (dict(global_batch_size=8, seq_length=8, token_budget=math.inf), "token_budget"),
])
def test_training_sizes_are_bounded(kw, field):
    with pytest.raises(PlannerError) as err:
        planner.TrainingSpec(**kw)
    assert field in str(err.value)


def test_layout_refuses_bool_and_str_degrees():
    for kw in (dict(tp=True), dict(pp="2"), dict(sequence_parallel=1), dict(zero_stage=4)):
        with pytest.raises(PlannerError):
            planner.Layout(**kw)


# --- loaders -----------------------------------------------------------------------------------

@pytest.mark.parametrize("content,fragment", [
    (b"\x00\x01\xff\xfe", "not UTF-8"),
    ("name: caf\xe9\n".encode("latin-1"), "not UTF-8"),
    (("a: " + "[" * 5000 + "]" * 5000).encode(), "nested too deeply"),
    (b"name: a\nname: b\n", "duplicate key 'name'"),
    (b"a: &x [1]\nb: *x\n", "aliases"),
    (b"- 1\n- 2\n", "mapping"),
])
def test_bad_yaml_files_give_one_line(tmp_path, content, fragment):
    p = tmp_path / "m.yaml"
    p.write_bytes(content)
    code, _, err = run(["plan", str(p), "dgx-h100", *SMALL])
    assert code == 2 and fragment in err and err.count("\n") == 1


def test_long_paths_and_nul_give_one_line():
    for ref in ("x" * 5000 + ".yaml", "a\x00b.yaml"):
        code, _, err = run(["plan", ref, "dgx-h100", *SMALL])
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_hf_json_duplicates_and_depth(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 1, "hidden_size": 2}')
    code, _, err = run(["plan", str(tmp_path / "a" / "config.json"), "dgx-h100", *SMALL])
    assert code == 2 and "duplicate key 'hidden_size'" in err
    (tmp_path / "a" / "config.json").write_text("[" * 100000 + "]" * 100000)
    code, _, err = run(["plan", str(tmp_path / "a" / "config.json"), "dgx-h100", *SMALL])
    assert code == 2 and "nested too deeply" in err


MISTRAL_NEMO = {"architectures": ["MistralForCausalLM"], "hidden_size": 5120, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336, "num_hidden_layers": 40,
                "vocab_size": 131072, "tie_word_embeddings": False}


def test_hf_head_dim_is_honoured_mistral_nemo():
    """Mistral-NeMo-12B: Q is 32 x 128 = 4096 wide against hidden 5120. By hand, per layer:
    attention 5120*4096 + 2*5120*1024 + 4096*5120 = 52,428,800; SwiGLU 3*5120*14336 = 220,200,960;
    norms 2*5120. x40 = 10,905,600,000; embedding + untied head 2*131072*5120 = 1,342,177,280;
    final norm 5120. Total 12,247,782,400 (NVIDIA/Mistral card: 12.2B)."""
    m = model_from_hf_config(MISTRAL_NEMO, "nemo")
    assert m.num_params == 12_247_782_400
    assert m.kv_channels == 128 and m.q_hidden == 4096
    args = planner.evaluate(m, load_cluster("dgx-h100", nodes=1), planner.TrainingSpec(global_batch_size=8, seq_length=4096),
                            planner.Layout(tp=8, zero_stage=1)).to_megatron().args
    assert args[args.index("--kv-channels") + 1] == "128"


def test_hf_head_dim_equal_to_the_default_is_not_emitted():
    cfg = MISTRAL_NEMO | {"hidden_size": 4096}
    assert model_from_hf_config(cfg, "m").kv_channels is None


@pytest.mark.parametrize("key,value", [("num_local_experts", 8), ("num_experts", 64), ("n_routed_experts", 256),
                                       ("moe_intermediate_size", 1408), ("mlp_bias", True)])
def test_hf_shape_keys_under_a_dense_architecture_are_refused(key, value):
    with pytest.raises(PlannerError, match=key):
        model_from_hf_config(MISTRAL_NEMO | {key: value}, "m")


# --- escaping: scripts, TOML, terminal ---------------------------------------------------------

EVIL = 'llama-8b\ntouch PWNED\n#$(touch PWNED2)`touch PWNED3`;"\'[/]'


def _evil_plan(zero: int = 1, framework: str = "megatron", sequence_parallel: bool = False):
    m = load_model("llama3-8b").model_copy(update={"name": EVIL})
    c = load_cluster("dgx-h100", nodes=2)
    c = c.model_copy(update={"gpu": c.gpu.model_copy(update={"name": "H100\n$(touch PWNED4)"})})
    t = framework_training(planner.TrainingSpec(global_batch_size=16, seq_length=4096), framework)
    return planner.evaluate(m, c, t, planner.Layout(tp=8, dp=2, zero_stage=zero, sequence_parallel=sequence_parallel))


def _fake_bin(folder: Path) -> Path:
    """Stand-ins for the launchers: they record their argument count and succeed."""
    bin_ = folder / "bin"
    bin_.mkdir()
    for tool in ("torchrun", "srun", "deepspeed", "scontrol"):
        p = bin_ / tool
        p.write_text('#!/usr/bin/env bash\necho "$0 $#" >> "$RECORD"\n')
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return bin_


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "torchtitan"])
def test_adversarial_names_execute_no_command_but_their_own(tmp_path, framework):
    p = _evil_plan(3 if framework == "torchtitan" else 1, framework)
    files = getattr(p, f"to_{framework}")()
    out = tmp_path / "launch"
    files.write(out)
    bin_ = _fake_bin(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": f"{bin_}:/usr/bin:/bin", "MEGATRON_LM": str(tmp_path), "MEGATRON_DEEPSPEED": str(tmp_path),
           "RECORD": str(tmp_path / "record"), "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "1", "HOME": str(tmp_path)}
    for script in sorted(out.glob("*.sh")):
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
        done = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(work)) == []  # no PWNED* files
    launched = (tmp_path / "record").read_text().split("\n")
    assert all(line.split("/")[-1].split()[0] in ("torchrun", "srun", "deepspeed", "scontrol")
               for line in launched if line)


def test_a_torchtitan_job_module_keeps_a_hostile_name_inert(tmp_path):
    """planner_job.py (Qwen3-235B-A22B's flavour on torchtitan) names the model in its docstring: a name with
    quotes, newlines and shell must leave a module that parses to one function and imports only torchtitan."""
    import ast

    m = load_model("qwen3-235b-a22b").model_copy(update={"name": 'q"""\nimport os; os.system("touch PWNED")\n"""'})
    t = framework_training(planner.TrainingSpec(global_batch_size=512, seq_length=4096), "torchtitan")
    p = planner.evaluate(m, load_cluster("dgx-h100", nodes=16), t,
                         planner.Layout(dp=128, zero_stage=3, ep=8, etp=1, recompute="full"))
    tree = ast.parse(p.to_torchtitan().files["planner_job.py"])
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(n, ast.ImportFrom) and n.module.startswith("torchtitan.") for n in imports)
    assert [type(n).__name__ for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))] == ["Expr",
                                                                                                         "FunctionDef"]


def test_toml_has_only_its_own_tables():
    p = _evil_plan(3, "torchtitan", sequence_parallel=True)  # the 0.2-style TOML cannot run TP without SP
    doc = tomllib.loads(p.to_torchtitan().files["job.toml"])
    assert set(doc) == {"parallelism", "training", "activation_checkpoint", "compile"}


def test_terminal_markup_and_escapes_are_inert(tmp_path):
    data = load_model("llama3-8b").model_dump(exclude={"sources", "provenance"}, mode="json")
    for name in ("[/]", "[link=https://example.com]x[/link]", "\x1b[31mred\x1b[0m :smile:"):
        p = tmp_path / "m.yaml"
        p.write_text(json.dumps(data | {"name": name}))
        code, out, err = run(["plan", str(p), "dgx-h100", *SMALL, "--top-k", "1"])
        assert code == 0, err
        assert "\x1b" not in out and "Traceback" not in out + err
        assert name.replace("\x1b", "?").split("[0m")[0] in out.replace("\\[", "[") or "?[31mred" in out


# --- output targets ----------------------------------------------------------------------------

def test_emit_refuses_a_users_file_and_links(tmp_path):
    target = tmp_path / "launch"
    target.mkdir()
    (target / "train.sh").write_text("my own script\n")
    code, _, err = run(["plan", "llama3-8b", "dgx-h100", *SMALL, "--emit", "megatron", "--out", str(target)])
    assert code == 2 and "not written by planner" in err and "--force" in err
    assert (target / "train.sh").read_text() == "my own script\n"
    code, _, _ = run(["plan", "llama3-8b", "dgx-h100", *SMALL, "--emit", "megatron", "--out", str(target), "--force"])
    assert code == 0 and (target / "train.sh").read_text().startswith("#!/usr/bin/env bash")
    # the planner's own files may be rewritten without --force
    code, _, _ = run(["plan", "llama3-8b", "dgx-h100", *SMALL, "--emit", "megatron", "--out", str(target)])
    assert code == 0
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    (target / "sbatch.sh").unlink()
    (target / "sbatch.sh").symlink_to(outside)
    code, _, err = run(["plan", "llama3-8b", "dgx-h100", *SMALL, "--emit", "megatron", "--out", str(target)])
    assert code == 2 and "symbolic link" in err and outside.read_text() == "keep"


@pytest.mark.parametrize("out", ["/dev/null", "x" * 5000])
def test_unusable_emit_targets_fail_before_the_work(out):
    code, so, err = run(["plan", "llama3-8b", "dgx-h100", *SMALL, "--emit", "megatron", "--out", out])
    assert code == 2 and err.count("\n") == 1 and "ranked layouts" not in so


def test_report_and_sweep_targets_are_checked_first(tmp_path):
    mine = tmp_path / "mine.html"
    mine.write_text("<p>mine</p>")
    code, _, err = run(["report", "llama3-8b", "dgx-h100", *SMALL, "--out", str(mine)])
    assert code == 2 and "not written by planner" in err and mine.read_text() == "<p>mine</p>"
    code, so, err = run(["sweep", "--models", "llama3-8b", "--clusters", "dgx-h100", "--nodes", "1",
                         "--out", str(tmp_path / "nodir" / "s.csv")])
    assert code == 2 and "no such folder" in err and so == ""


# --- planner check ------------------------------------------------------------------------------

@pytest.mark.parametrize("payload,field", [([1, 2], "JSON object"), ({"args": "x"}, "args"),
                                           ({"args": [], "world_size": "8"}, "world_size"),
                                           ({"args": [], "env": [1]}, "env"),
                                           ({"args": [], "gpu_arch": 99}, "gpu_arch")])
def test_check_refuses_malformed_payloads(tmp_path, monkeypatch, payload, field):
    from planner import check
    monkeypatch.setattr(check, "megatron_available", lambda: True)
    p = tmp_path / "megatron_args.json"
    p.write_text(json.dumps(payload))
    code, _, err = run(["check", "megatron", str(p)])
    assert code == 2 and field in err


# --- scale and determinism ---------------------------------------------------------------------

def test_144k_gb200_answers():
    """70B on 2,000 GB200 NVL72 racks (144,000 GPUs): linear topology, an answer (and no hang)."""
    c = load_cluster("gb200-nvl72", nodes=36000)
    r = plan(load_model("llama3-70b"), c, planner.TrainingSpec(global_batch_size=9000, seq_length=8192),
             top_k=1, structural=False)
    assert r.status in STATUSES and (r.best is not None or r.status != "infeasible" or r.infeasibility)


def test_json_is_deterministic_without_timing():
    argv = ["plan", "llama3-8b", "dgx-h100", *SMALL, "--top-k", "2", "--json", "--no-timing"]
    a, b = run(argv), run(argv)
    assert a[0] == 0 and a[1] == b[1] and "solve_time_s" not in a[1]
    assert "timing" in json.loads(run(argv[:-1])[1])


# --- properties over random problems ------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from planner.oracle import enumerate_plans  # noqa: E402
from test_search import independent_recheck, instances  # noqa: E402


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from([1e-5, 1e-3, 0.02, 0.2]))
def test_statuses_are_true_under_any_limit(inst, limit):
    """Whatever the limit: 'infeasible' only if the enumerator finds nothing, 'optimal' only with the
    enumerator's objective, and every returned plan fits and re-checks independently."""
    model, cluster, training, framework = inst
    r = plan(model, cluster, training, top_k=1, structural=False, framework=framework, time_limit_s=limit)
    assert r.status in STATUSES
    ranked = enumerate_plans(model, cluster, training, framework=framework)
    if r.status == "infeasible":
        assert not ranked
    if r.status == "optimal":
        assert r.best.time.objective_us == ranked[0].time.objective_us
    if r.best is not None:
        independent_recheck(r.best)
    if r.status == "unknown":
        assert r.gap is None and r.infeasibility is None


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_allow_idle_never_raises_and_matches_the_enumerator(inst):
    model, cluster, training, framework = inst
    r = plan(model, cluster, training, top_k=2, structural=False, framework=framework, allow_idle=True)
    ranked = enumerate_plans(model, cluster, training, framework=framework, allow_idle=True)
    if not ranked:
        assert r.status == "infeasible"
        return
    assert r.status == "optimal" and r.best.time.objective_us == ranked[0].time.objective_us
    assert r.best.num_gpus <= cluster.world_size and cluster.world_size % r.best.num_gpus == 0


@pytest.mark.parametrize("content,fragment", [(None, "cannot read"), ("[1,2", "not valid JSON"), ("[1, 2]", "JSON object")])
def test_check_deepspeed_reads_its_file_first(tmp_path, content, fragment):
    p = tmp_path / "ds_config.json"
    if content is not None:
        p.write_text(content)
    code, _, err = run(["check", "deepspeed", str(p), "--world-size", "8"])
    assert code == 2 and fragment in err and err.count("\n") == 1
