"""Search scaling: what the CP-SAT search covers and how fast it proves the optimum, 1B on 8 GPUs
to 70B on 144,000, and what arbitrary layer splits gain on large-vocabulary models.

    python benchmarks/solve.py [--skip-splits] [--only MODEL-TEXT]

Per case: status; the layouts the model covers (configurations x every layer split); the
configurations in the space and those CP-SAT had to look at (the rest: no split fits, or their
lower bound over all splits is above the best); seconds to the first layout and to the proof
(top-1); seconds for a top-10 ranking. Then, for models whose embedding and LM head weigh several
layers, the best plan with any split against the best with even splits and the best where only
the first and last rank may differ (Megatron's --decoder-first/last-pipeline-num-layers).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import planner
from planner.search import plan
from planner.specs import ModelSpec, TrainingSpec

CASES = [
    # model, cluster, nodes, global batch, seq
    ("gpt3-1.3b", "dgx-h100", 1, 256, 2048),
    ("llama3-8b", "dgx-h100", 1, 128, 8192),
    ("llama2-7b", "dgx-a100-80g", 4, 512, 4096),
    ("mistral-7b", "mi300x", 2, 256, 8192),
    ("llama3-70b", "dgx-h100", 8, 128, 8192),
    ("llama3-70b", "gb200-nvl72", 18, 288, 8192),
    ("qwen2.5-72b", "hgx-h200", 16, 512, 8192),
    ("gpt3-175b", "dgx-a100-80g", 128, 1536, 2048),
    ("llama3.1-405b", "dgx-b200", 64, 1024, 8192),
    ("llama3.1-405b", "dgx-h100", 2048, 2048, 8192),
    ("llama3.1-405b", "dgx-h100", 2048, 128, 131072),
    ("megatron-gpt-1t", "dgx-h100", 4096, 4096, 2048),
    # Mixture-of-Experts: expert parallelism in the space (DeepSeek-V3: MLA, 3 dense layers first)
    ("mixtral-8x7b", "dgx-h100", 4, 512, 4096),
    ("qwen3-30b-a3b", "dgx-h100", 2, 1024, 4096),
    ("deepseek-v3", "dgx-h100", 128, 8192, 4096),
    # scale: 131,072 and 144,000 GPUs (linear-time topology; the time limit bounds the whole call)
    ("llama3-8b", "dgx-h100", 16384, 16384, 8192),
    ("llama3-70b", "gb200-nvl72", 36000, 9000, 8192),
]


SPLIT_CASES = [
    # model, cluster, nodes, global batch, seq: vocabularies of 128K, 152K and 256K, on few enough
    # GPUs that memory calls for a pipeline
    ("llama3-70b", "dgx-h100", 4, 256, 8192),
    ("llama3.1-405b", "dgx-h100", 2048, 2048, 8192),
    ("qwen2.5-72b", "dgx-h100", 4, 256, 8192),
    ("vocab256k-9b", "dgx-a100-40g", 1, 256, 8192),
]
VOCAB_256K = ModelSpec(name="vocab256k-9b", family="llama", num_layers=42, hidden_size=3584, num_attention_heads=16,
                       num_kv_heads=8, kv_channels=256, ffn_hidden_size=14336, vocab_size=256000)
"""A 9B dense model with a 256K vocabulary (Gemma-2-9B's shapes, without its local attention)."""


def _model(name: str) -> ModelSpec:
    return VOCAB_256K if name == VOCAB_256K.name else planner.load_model(name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-splits", action="store_true", help="only the scaling table")
    ap.add_argument("--splits-only", action="store_true", help="only the split tables")
    ap.add_argument("--only", default=None, help="only the cases whose model id contains this text")
    args = ap.parse_args(argv)
    print(f"{'case':44s} {'GPUs':>6s} {'status':>8s} {'layouts':>8s} {'configs':>8s} {'to CP-SAT':>9s} "
          f"{'first s':>7s} {'proof s':>7s} {'top-10 s':>8s}  best layout")
    proofs, top10 = [], []
    for mref, cref, nodes, gbs, seq in CASES:
        if (args.only and args.only not in mref) or args.splits_only:
            continue
        model, cluster = planner.load_model(mref), planner.load_cluster(cref, nodes=nodes)
        tr = TrainingSpec(global_batch_size=gbs, seq_length=seq)
        r = plan(model, cluster, tr, top_k=1, structural=False)
        t0 = time.perf_counter()
        r10 = plan(model, cluster, tr, top_k=10, structural=False)
        t10 = time.perf_counter() - t0
        st = r.stats
        proofs.append(st.proof_s if st.proof_s is not None else float("inf"))
        top10.append(t10)
        best = r.best.layout.short() if r.best else "-"
        name = f"{mref} s{seq} gbs{gbs} on {cref}"
        first = f"{st.first_solution_s:7.2f}" if st.first_solution_s is not None else "      -"
        proof = f"{st.proof_s:7.2f}" if st.proof_s is not None else "      -"
        print(f"{name:44s} {cluster.world_size:6d} {r.status:>8s} {'1e%d' % (len(str(r.space_size)) - 1):>8s} "
              f"{st.configurations:8d} {st.solved:9d} {first} {proof} {t10:8.2f}  {best[:90]}")
        assert len(r10.alternatives) + 1 <= 10
    if proofs:
        print(f"\nproof (top-1): median {statistics.median(proofs):.2f} s, max {max(proofs):.2f} s; "
              f"top-10: median {statistics.median(top10):.2f} s, max {max(top10):.2f} s")
    if args.skip_splits:
        return 0
    print(f"\n{'arbitrary splits':40s} {'vocab':>7s} {'even s':>9s} {'first/last s':>12s} {'any s':>9s} "
          f"{'gain vs f/l':>11s}  best layout (any split)")
    for mref, cref, nodes, gbs, seq in SPLIT_CASES:
        model, cluster = _model(mref), planner.load_cluster(cref, nodes=nodes)
        tr = TrainingSpec(global_batch_size=gbs, seq_length=seq)
        best = {}
        for mode in (False, "first_last", True):
            r = plan(model, cluster, tr, top_k=1, structural=False, uneven_stages=mode, time_limit_s=60)
            best[mode] = (r.best, r.status)
        e, fl, f = (best[k][0].step_time_s if best[k][0] else float("inf") for k in (False, "first_last", True))
        lay = best[True][0].layout
        print(f"{mref + ' on ' + str(cluster.world_size) + ' ' + cref:40s} {model.vocab_size:7d} {e:9.3f} {fl:12.3f} "
              f"{f:9.3f} {fl / f - 1:11.1%}  {lay.short()[:110]}")
    print(f"\n{'torchtitan: its own splits':40s} {'even s':>9s} {'its splits s':>12s} {'gain':>7s} {'time s':>7s}  best layout")
    for mref, cref, nodes, gbs, seq in SPLIT_CASES:
        model, cluster = _model(mref), planner.load_cluster(cref, nodes=nodes)
        tr = TrainingSpec(global_batch_size=gbs, seq_length=seq)
        even = plan(model, cluster, tr, top_k=1, structural=False, framework="torchtitan", uneven_stages=False,
                    time_limit_s=60)
        t0 = time.perf_counter()
        its = plan(model, cluster, tr, top_k=1, structural=False, framework="torchtitan", time_limit_s=60)
        took = time.perf_counter() - t0
        e, f = (r.best.step_time_s if r.best else float("inf") for r in (even, its))
        print(f"{mref + ' on ' + str(cluster.world_size) + ' ' + cref:40s} {e:9.3f} {f:12.3f} {e / f - 1:7.1%} "
              f"{took:7.2f}  {its.status} {its.best.layout.short()[:100] if its.best else '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
