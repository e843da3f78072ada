"""Megatron's --pipeline-model-parallel-layout strings: read as megatron-core 0.19.2's grammar reads
them, written so that it builds the plan's split (tests/test_validators.py checks the round trip)."""

import pytest

from planner.errors import PlannerError
from planner.pipeline_layout import layout_string, parse_layout_string


def test_nvidias_deepseek_v3_layouts_read_as_their_splits():
    """Megatron-Bridge's GB300 DeepSeek-V3 layout 'Et*4|(t*4|)*14tmL' is 16 virtual stages: the embedding and
    4 layers, 14 of 4, then one layer beside the MTP depth and the loss (61 layers); its B200 PP 16 layout
    written as lists in the recipe, 'Etttt|' then 14 x 'tttt|' then 'tmL', is the same string."""
    assert parse_layout_string("Et*4|(t*4|)*14tmL", 2, 61, 1) == (4,) * 15 + (1,)
    assert parse_layout_string("Etttt|" + "tttt|" * 14 + "tmL", 16, 61, 1) == (4,) * 15 + (1,)
    assert parse_layout_string("E|t*3|t*3|L", 2, 6) == (0, 3, 3, 0)  # empty end stages, commas cosmetic
    assert parse_layout_string("Et,t|tt,L", 2, 4) == (2, 2)


@pytest.mark.parametrize("split, mtp", [((4,) * 15 + (1,), 1), ((2, 3, 3, 0), 0), ((5,), 2)])
def test_the_written_string_reads_back(split, mtp):
    assert parse_layout_string(layout_string(split, mtp), 1, sum(split), mtp) == split


@pytest.mark.parametrize("text, pp, layers, mtp, rule", [
    ("Ett|tt|ttL", 2, 6, 0, "3 virtual stages is not a multiple of pp \\(2\\)"),
    ("tEt|tL", 2, 3, 0, "'E' must come first and 'L' last"),
    ("Ett|ttLL", 2, 4, 0, "'E' must come first and 'L' last"),
    ("Ett|tL", 2, 4, 0, "3 decoder layers 't', the model has 4"),
    ("Ett|ttL", 2, 4, 1, "0 MTP depths 'm', the model has mtp_layers = 1"),
    ("Ett|mtL", 2, 3, 1, "decoder layers must come before the MTP depths"),
    ("Ett|tt|m|L", 2, 4, 1, "a standalone MTP stage is not"),
    ("Ett|txL", 2, 3, 0, "unknown item\\(s\\) 'x'"),
])
def test_layouts_the_planner_cannot_price_are_refused_in_one_line(text, pp, layers, mtp, rule):
    with pytest.raises(PlannerError, match=rule):
        parse_layout_string(text, pp, layers, mtp)


def test_evaluate_runs_megatrons_account_for_ends_split_where_the_layers_do_not_divide():
    """Llama-3.1-405B's 126 layers over 16 pipeline ranks, as Meta and NeMo ran it: the Python API prices the split
    Megatron makes with --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split (128 / 16 = 8 a
    stage, the embedding and the loss each taking one: 7, 8 x 14, 7), says so in a warning, and the launch files
    emit it; as the CLI did before. Where the layers and the two ends do not divide either (DeepSeek-V3's 61 over
    16), the refusal names the way out."""
    import planner
    from planner.errors import InvalidLayout
    from planner.specs import Layout, TrainingSpec

    m, c = planner.load_model("llama3.1-405b"), planner.load_cluster("dgx-h100", nodes=256)
    t = TrainingSpec(global_batch_size=2048, seq_length=8192)
    p = planner.evaluate(m, c, t, Layout(tp=8, pp=16, dp=16, zero_stage=1, sequence_parallel=True))
    assert p.layout.pipeline_layers == (7, *[8] * 14, 7)
    assert any("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split" in w for w in p.warnings)
    assert "--pipeline-model-parallel-layout" in p.to_megatron().args
    with pytest.raises(InvalidLayout, match=r"num_layers\(61\) % pp\(16\) = 13 != 0 \(give the split: pipeline_layers"):
        planner.evaluate(planner.load_model("deepseek-v3"), planner.load_cluster("dgx-h100", nodes=256),
                         TrainingSpec(global_batch_size=8192, seq_length=4096),
                         Layout(tp=1, pp=16, dp=128, ep=64, zero_stage=1))
