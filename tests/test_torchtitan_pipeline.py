"""torchtitan places the pipeline's layers itself, from two weights: the planner's reimplementation
(planner.torchtitan_pipeline) against hand arithmetic and torchtitan 0.3's own functions, and the
split carried through evaluate, the search, the emitter and torchtitan's validator."""

import math

import pytest
from hypothesis import HealthCheck, given, settings

import planner
from planner.errors import InvalidLayout, PlannerError, SpecError
from planner.oracle import enumerate_plans
from planner.search import plan
from planner.space import build_space, framework_training
from planner.specs import Layout, TrainingSpec
from planner.torchtitan_pipeline import end_weights, layers_per_stage, rank_splits, stage_split
from tests.test_search import SMALL, configuration, independent_recheck, instances


def test_stage_split_by_hand():
    # 30 layers + 1 + 1 = 32 effective over 4 stages: 8 each, less the embedding's 1 and the head's 1
    assert stage_split(30, 4) == (7, 8, 8, 7)
    # 32 + 2 = 34 over 4: 8 each and the remainder 2 to the first two stages -> 9, 9, 8, 8, less 1 and 1
    assert stage_split(32, 4) == (8, 9, 8, 7)
    assert stage_split(32, 4, 0, 0) == (8, 8, 8, 8)
    # 126 + 1 + 0 = 127 over 32: 3 each, 31 stages take one more; the first gives one back
    assert stage_split(126, 32, 1, 0) == (3,) + (4,) * 30 + (3,)
    assert stage_split(5, 1, 3, 3) == (5,)
    with pytest.raises(SpecError, match=r"stages > .* effective layers"):
        stage_split(2, 5)
    with pytest.raises(SpecError, match=r"exceed the smallest stage share"):
        stage_split(8, 4, 3, 0)  # 11 over 4: shares of 2, the embedding weighs 3


def test_layers_per_stage_by_hand():
    # ceil(34 / 5) = 7 and ceil(34 / 4) = 9: no value gives 8 stages
    assert layers_per_stage(32, 8, 1, 1) is None
    assert layers_per_stage(32, 8, 0, 0) == 4
    assert layers_per_stage(30, 4, 1, 1) == 8
    for eff_layers, stages in [(30, 4), (31, 5), (126, 16), (79, 12)]:
        got = layers_per_stage(eff_layers, stages, 0, 0)
        exists = [v for v in range(1, eff_layers + 1) if math.ceil(eff_layers / v) == stages]
        assert got == (min(exists) if exists else None)


def test_stage_split_equals_torchtitans_own():
    """Every depth 2-40 on 1-16 stages with weights 0-3: the same layers per stage, and refused where
    torchtitan 0.3's _generate_llm_fqn_per_model_part raises."""
    pytest.importorskip("torchtitan")
    from planner.check._cpu_shims import install_shims

    install_shims()
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    checked = 0
    for layers in range(2, 41):
        for stages in range(1, 17):
            for a in range(4):
                for b in range(4):
                    try:
                        parts = _generate_llm_fqn_per_model_part(stages, layers, a, b)
                    except ValueError:
                        with pytest.raises(SpecError):
                            stage_split(layers, stages, a, b)
                        continue
                    theirs = tuple(sum(n.startswith("layers.") for n in part) for part in parts)
                    assert stage_split(layers, stages, a, b) == theirs, (layers, stages, a, b)
                    checked += 1
    assert checked > 6_000  # and the refusals (more stages than layers, heavy ends) agree too


def test_layers_per_stage_is_what_torchtitan_reads():
    """torchtitan's _get_pipeline_metadata, given the value, derives exactly the stage count asked."""
    pytest.importorskip("torchtitan")
    from types import SimpleNamespace

    from planner.check._cpu_shims import install_shims

    install_shims()
    from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata

    for layers, pp, vpp, a, b in [(30, 4, 1, 1, 1), (126, 8, 4, 1, 0), (32, 2, 4, 0, 0), (80, 4, 3, 2, 2)]:
        per = layers_per_stage(layers, pp * vpp, a, b)
        assert per is not None
        par = SimpleNamespace(pipeline_parallel_schedule="Interleaved1F1B" if vpp > 1 else "1F1B",
                              pipeline_parallel_layers_per_stage=per, pipeline_parallel_first_stage_less_layers=a,
                              pipeline_parallel_last_stage_less_layers=b)
        got = _get_pipeline_metadata(SimpleNamespace(pp=pp), par, SimpleNamespace(layers=[None] * layers))
        assert got == (pp * vpp, layers, a, b)


def test_rank_splits_and_end_weights():
    family = rank_splits(30, 4, 1)
    assert (7, 8, 8, 7) in family and (8, 8, 7, 7) in family  # weights (1, 1) and (0, 2)
    assert (8, 8, 8, 6) in family  # weights (0, 2) on 32 effective layers: 8, 8, 8, 8 less 0 and 2
    assert all(sum(c) == 30 and min(c) >= 1 for c in family)
    for ranks, virtual in family.items():
        a, b = end_weights(30, 4, 1, virtual)
        assert stage_split(30, 4, a, b) == virtual
    # interleaved: stage s on rank s % pp; 32 layers over 2 x 2 stages with weights (1, 1) = 8, 9, 8, 7
    assert rank_splits(32, 2, 2)[(16, 16)] == (8, 8, 8, 8)
    assert end_weights(32, 2, 2, (8, 9, 8, 7)) == (1, 1)
    assert end_weights(30, 4, 1, (1, 1, 1, 27)) is None
    # 80 layers on 4 x 5 stages: no layers_per_stage gives 20 stages unless the weights add to 0
    assert list(rank_splits(80, 4, 5)) == [(20, 20, 20, 20)]


def _titan():
    return framework_training(TrainingSpec(global_batch_size=64, seq_length=4096), "torchtitan")


def test_evaluate_fills_torchtitans_split_and_refuses_others():
    m = planner.load_model("llama3-8b").model_copy(update={"num_layers": 30})
    c = planner.load_cluster("dgx-h100", nodes=1)
    lay = Layout(tp=1, pp=4, dp=2, zero_stage=3, micro_batch_size=1)
    p = planner.evaluate(m, c, _titan(), lay)
    assert p.layout.pipeline_layers == (7, 8, 8, 7)
    assert any("default first/last stage weights (1, 1): 7, 8, 8, 7" in w for w in p.warnings)
    # a split torchtitan makes (weights 0 and 2) is priced as given
    assert planner.evaluate(m, c, _titan(), lay.model_copy(update={"pipeline_layers": (8, 8, 8, 6)})).layout.pipeline_layers == (8, 8, 8, 6)
    with pytest.raises(InvalidLayout, match=r"not a split torchtitan makes"):
        planner.evaluate(m, c, _titan(), lay.model_copy(update={"pipeline_layers": (9, 6, 6, 9)}))
    with pytest.raises(InvalidLayout, match=r"give pipeline_layers"):
        planner.evaluate(m, c, _titan(), lay.model_copy(update={"first_stage_layers": 6, "last_stage_layers": 6}))
    # on Megatron's engine the same layout without a split is refused, as before
    with pytest.raises(InvalidLayout, match=r"num_layers\(30\) % pp\(4\)"):
        planner.evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), lay.model_copy(update={"zero_stage": 1}))


def test_search_emits_and_torchtitan_builds_the_plans_split():
    """Llama-3.1-405B (126 layers) on 512 H100: a torchtitan search places the layers unevenly where
    that is faster, and torchtitan's own pipeline code builds exactly that split from the overrides."""
    m = planner.load_model("llama3.1-405b")
    c = planner.load_cluster("dgx-h100", nodes=64)
    tr = TrainingSpec(global_batch_size=1024, seq_length=8192)
    found = plan(m, c, tr, framework="torchtitan", top_k=3, structural=False, time_limit_s=60)
    even = plan(m, c, tr, framework="torchtitan", top_k=1, structural=False, time_limit_s=60, uneven_stages=False)
    assert found.status == "optimal" and found.best.layout.pipeline_layers is not None
    assert found.best.step_time_s < even.best.step_time_s
    pytest.importorskip("torchtitan")
    from planner.check import check_torchtitan

    for p in [found.best, *found.alternatives]:
        lay = p.layout
        stages = lay.pp * lay.vpp
        virtual = lay.pipeline_layers or (m.num_layers // stages,) * stages if lay.pp > 1 else None
        r = check_torchtitan(list(p.to_torchtitan().args), p.num_gpus, num_layers=m.num_layers)
        assert r.ok, r.line()
        if lay.pp > 1:
            assert r.details["stage_layers"] == list(virtual), lay.short()


def test_emitter_refuses_a_split_torchtitan_cannot_make():
    m = planner.load_model("llama3-8b").model_copy(update={"num_layers": 30})
    c = planner.load_cluster("dgx-h100", nodes=1)
    lay = Layout(tp=1, pp=4, dp=2, zero_stage=3, micro_batch_size=1, pipeline_layers=(9, 6, 6, 9))
    megatron = lay.model_copy(update={"zero_stage": 0, "overlap_grad_reduce": True})  # Megatron runs any split
    p = planner.evaluate(m, c, TrainingSpec(global_batch_size=64, seq_length=4096), megatron)
    with pytest.raises(PlannerError, match=r"torchtitan: no first/last stage weights make the split \[9, 6, 6, 9\]"):
        p.to_torchtitan()
    ok = planner.evaluate(m, c, _titan(), lay.model_copy(update={"pipeline_layers": None}))
    args = list(ok.to_torchtitan().args)
    at = args.index("--parallelism.pipeline_parallel_first_stage_less_layers")
    # (7, 8, 8, 7) with the fewest weight: 30 + 1 + 0 = 31 over 4 stages is 8, 8, 8, 7, the first less 1
    assert (args[at + 1], args[at + 3]) == ("1", "0")


def test_torchtitan_space_offers_its_splits_only():
    m = planner.load_model("llama3-8b").model_copy(update={"num_layers": 30})
    c = planner.load_cluster("dgx-h100", nodes=1)
    space = build_space(m, c, _titan(), framework="torchtitan", constraints={"pp": 4})
    assert space.shapes and not space.free_split
    assert set(space.fixed_splits(4, 1)) == set(rank_splits(30, 4, 1))
    even_only = build_space(m, c, _titan(), framework="torchtitan", constraints={"pp": 4, "uneven_stages": False})
    assert not even_only.shapes  # 30 layers do not divide over 4 stages
    first_last = build_space(m, c, _titan(), framework="torchtitan", constraints={"pp": 4, "uneven_stages": "first_last"})
    assert all(len(set(s[1:-1])) == 1 for s in first_last.fixed_splits(4, 1))


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instances(layers=(5, 7, 9, 11)))
def test_torchtitan_splits_equal_the_enumerator(inst):
    """A torchtitan search over depths no pipeline degree above 1 divides: the CP-SAT model's choice
    among torchtitan's splits equals the brute force over them."""
    model, cluster, training, _ = inst
    result = plan(model, cluster, training, top_k=1, structural=False, framework="torchtitan", **SMALL)
    ranked = enumerate_plans(model, cluster, training, framework="torchtitan", constraints=SMALL)
    if not ranked:
        assert result.status == "infeasible"
        return
    assert result.status == "optimal"
    assert result.best.time.objective_us == ranked[0].time.objective_us
    assert configuration(result.best) == configuration(ranked[0])
    independent_recheck(result.best)
