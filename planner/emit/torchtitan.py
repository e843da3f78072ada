"""torchtitan: 0.3 command-line overrides (tyro) and a 0.2-style TOML job file.

Keys from shared/reference/launch-configs.md §4. FSDP2 (dp_shard) is ZeRO-3; plain replication is
ZeRO-0; torchtitan has no ZeRO-1/2. It places the pipeline's layers itself from two weights, which
the emitter writes as the ones that make the plan's split (planner.torchtitan_engine).
"""

from __future__ import annotations

import shlex

from planner.emit import LaunchFiles, refuse_megatron_only, refuse_other_engine, script_word, toml_value
from planner.errors import PlannerError
from planner.plans import Plan
from planner.specs import Recompute
from planner.torchtitan_engine import KERNELS, LOSS_CHUNKS, end_weights, layers_per_stage, registry_flavour

__all__ = ["torchtitan_overrides", "torchtitan_toml", "to_torchtitan", "torchtitan_config_name", "float8_job_module",
           "registry_job_module", "JOB_MODULE", "TORCHTITAN_VERSION"]

TORCHTITAN_VERSION = "torchtitan 0.3.0"


def _check(plan: Plan) -> None:
    lay = plan.layout
    refuse_megatron_only(plan, "torchtitan")
    if lay.rank_order != "tp-cp-dp-pp":
        raise PlannerError(f"torchtitan: rank order {lay.rank_order} is Megatron's --use-tp-pp-dp-mapping; not emitted here")
    if lay.zero_stage in (1, 2):
        raise PlannerError(f"torchtitan: ZeRO-{lay.zero_stage} does not exist there (FSDP2 = ZeRO-3, or replicate = 0); "
                           "plan with framework='torchtitan'")
    if lay.first_stage_layers is not None or lay.last_stage_layers is not None:
        raise PlannerError("torchtitan: Megatron-style first/last stage layer counts are not emitted; give the split "
                           "as pipeline_layers (torchtitan places the layers from its first/last stage weights)")
    if lay.pp > 1 and _weights(plan) is None:
        raise PlannerError(f"torchtitan: no first/last stage weights make the split {list(_virtual(plan))} on "
                           f"pp({lay.pp}) x vpp({lay.vpp}) stages; plan with framework='torchtitan'")
    if lay.recompute == Recompute.SELECTIVE:
        raise PlannerError("torchtitan: its selective checkpointing is per-op (recompute 'op'), not Megatron's "
                           "attention-core recompute the plan prices; plan with framework='torchtitan'")
    if lay.recompute_num_layers is not None:
        raise PlannerError(f"torchtitan: recomputing {lay.recompute_num_layers} layers per stage is not emitted")
    if lay.p2p_overlapped:
        raise PlannerError("torchtitan: its interleaved schedule does not overlap p2p with compute "
                           "(overlap_p2p); plan with framework='torchtitan'")
    replicated = lay.zero_stage == 0 and lay.dp > 1
    if lay.overlap_param_gather or (replicated and lay.overlap_grad_reduce != (lay.pp == 1)):
        raise PlannerError("torchtitan: its data parallelism overlaps gradient reduction with the backward without "
                           "PP and reduces after the last backward with it, and has no ZeRO-1/2 parameter gather; "
                           "plan with framework='torchtitan'")
    refuse_other_engine(plan, "torchtitan")
    if plan.training.kernels != KERNELS:
        raise PlannerError(f"torchtitan: the plan is priced with {plan.training.kernels} kernels (Megatron / "
                           f"Transformer Engine's); torchtitan runs PyTorch's ('{KERNELS}'); "
                           "plan with framework='torchtitan'")
    if plan.training.grad_dtype != "fp32":
        raise PlannerError(f"torchtitan: the plan is priced with {plan.training.grad_dtype} gradients; torchtitan "
                           "reduces and keeps them in FP32 (mixed_precision_reduce float32)")
    if plan.training.loss_chunks != LOSS_CHUNKS:
        raise PlannerError(f"torchtitan: the plan prices the loss in {plan.training.loss_chunks} chunk(s); its registry "
                           f"configs run {LOSS_CHUNKS} (ChunkedLossWrapper); plan with framework='torchtitan'")


def _virtual(plan: Plan) -> tuple[int, ...]:
    """Decoder layers per virtual stage (stage s on rank s % pp)."""
    lay, stages = plan.layout, plan.layout.pp * plan.layout.vpp
    return lay.pipeline_layers or (plan.model.num_layers // stages,) * stages


def _weights(plan: Plan) -> tuple[int, int] | None:
    """torchtitan's (first_stage_less_layers, last_stage_less_layers) that make the plan's split."""
    lay = plan.layout
    return end_weights(plan.model.num_layers, lay.pp, lay.vpp, _virtual(plan))


def _degrees(plan: Plan) -> dict[str, int | str]:
    lay = plan.layout
    d: dict[str, int | str] = {
        "data_parallel_replicate_degree": lay.dp if lay.zero_stage == 0 else 1,
        "data_parallel_shard_degree": lay.dp if lay.zero_stage == 3 else 1,
        "tensor_parallel_degree": lay.tp,
        "pipeline_parallel_degree": lay.pp,
        "context_parallel_degree": lay.cp,
    }
    if plan.model.moe is not None:  # EP borrows its ranks from dp_shard x cp x tp (planner.space)
        d["expert_parallel_degree"] = lay.ep
    if lay.pp > 1:
        # torchtitan counts the embedding and the output layer as extra "layers" (weights 1 and 1
        # by default) and deals layers + weights over the stages; the weights written make the plan's
        # split (0 and 0 for an even one), layers_per_stage its pp * vpp stages (none: the schedule's
        # default count, pp for 1F1B, 2 pp for Interleaved1F1B)
        first, last = _weights(plan)
        d["pipeline_parallel_schedule"] = "Interleaved1F1B" if lay.vpp > 1 else "1F1B"
        per = layers_per_stage(plan.model.num_layers, lay.pp * lay.vpp, first, last)
        if per is not None:
            d["pipeline_parallel_layers_per_stage"] = per
        d["pipeline_parallel_first_stage_less_layers"] = first
        d["pipeline_parallel_last_stage_less_layers"] = last
        d["pipeline_parallel_microbatch_size"] = lay.micro_batch_size
    return d


def _local_batch(plan: Plan) -> int:
    """torchtitan's training.local_batch_size for the plan: the sequences a data-parallel rank runs in one
    gradient-accumulation step, which it accumulates global_batch_size / (local x dp) times. Without a pipeline
    that step is the plan's micro-batch; with one, the rank's whole batch, which the schedule splits into
    pipeline_parallel_microbatch_size micro-batches [torchtitan 0.3 trainer.py: gradient_accumulation_steps,
    num_pipeline_parallel_microbatches; config/configs.py: TrainingConfig.local_batch_size; the same in 0.2.2
    train.py]."""
    lay = plan.layout
    return plan.training.global_batch_size // lay.dp if lay.pp > 1 else lay.micro_batch_size


def _ac_mode(plan: Plan) -> str:
    # torchtitan's 'selective' is its per-op policy (SelectiveAC), priced as Recompute.OP
    return {Recompute.NONE: "none", Recompute.OP: "selective", Recompute.FULL: "full"}[plan.layout.recompute]


def torchtitan_overrides(plan: Plan) -> list[str]:
    """torchtitan 0.3 CLI overrides (after --module/--config)."""
    _check(plan)
    t, lay = plan.training, plan.layout
    args = []
    for k, v in _degrees(plan).items():
        args += [f"--parallelism.{k}", str(v)]
    local = _local_batch(plan)
    if _tp_without_sp(plan):  # torchtitan 0.3 turns SP on with TP unless told (configs.py:
        args += ["--parallelism.no-enable_sequence_parallel"]  # ParallelismConfig.enable_sequence_parallel)
    args += ["--training.local_batch_size", str(local), "--training.global_batch_size", str(t.global_batch_size),
             "--training.seq_len", str(t.seq_length)]
    if lay.pp > 1 or lay.ep > 1:  # torchtitan 0.3: "CUDA graphs do not support pipeline parallelism yet", nor
        args += ["--training.disable_cuda_graphs"]  # the all-to-all dispatcher's host sync (its config check)
    if t.optimizer_offload:  # FSDP2's CPUOffloadPolicy (planner.torchtitan_engine [Offload])
        args += ["--training.enable_cpu_offload"]
    args += ["--compile.enable"]  # the kernels priced (torchtitan_engine.KERNELS) are the compiled blocks'
    if lay.tp_comm_overlap:
        args += ["--compile.enable_async_tensor_parallel"]
    args += [f"activation-checkpoint:{_ac_mode(plan)}"]
    return args


def torchtitan_toml(plan: Plan) -> str:
    """A torchtitan 0.2-style TOML job file (BF16 plans: float8 is turned on in float8_job_module)."""
    _check(plan)
    if plan.training.fp8 is not None:
        raise PlannerError("torchtitan: the 0.2-style TOML is not written for float8 (its keys are not checked "
                           f"against {TORCHTITAN_VERSION}); use train.sh with {JOB_MODULE}.py")
    if plan.model.moe is not None:
        raise PlannerError("torchtitan: the 0.2-style TOML is not written for MoE models (its expert keys are not "
                           f"checked against {TORCHTITAN_VERSION}); use train.sh")
    if _tp_without_sp(plan):
        raise PlannerError("torchtitan: the 0.2-style TOML is not written for TP without sequence parallelism "
                           "(torchtitan 0.2 shards every TP plan's norms on the sequence, no key turns it off); "
                           "use train.sh, which turns it off")
    t, lay = plan.training, plan.layout
    tables: dict[str, dict] = {
        "parallelism": _degrees(plan),
        "training": {"local_batch_size": _local_batch(plan), "global_batch_size": t.global_batch_size,
                     "seq_len": t.seq_length, "mixed_precision_param": "bfloat16"}
        | ({"disable_cuda_graphs": True} if lay.pp > 1 else {})
        | ({"enable_cpu_offload": True} if t.optimizer_offload else {}),
        "activation_checkpoint": {"mode": _ac_mode(plan)},
        "compile": {"enable": True},
    }
    if lay.tp_comm_overlap:
        tables["parallelism"]["enable_async_tensor_parallel"] = True
    lines = [f"# {script_word(plan.model.name)}: {lay.short()} (generated by planner; torchtitan 0.2.x TOML keys)"]
    for table, keys in tables.items():  # every value through toml_value: no string reaches the file raw
        lines += ["", f"[{table}]"] + [f"{k} = {toml_value(v)}" for k, v in keys.items()]
    return "\n".join(lines) + "\n"


JOB_MODULE = "planner_job"
"""The Python module (and its config function) an FP8 plan's launch files add: torchtitan 0.3 turns
float8 on only in a config function (model_registry(..., converters=[...]); no command-line key
reaches the converters), and ConfigManager takes a fully qualified --module [torchtitan 0.3
config/manager.py: ConfigManager._load_config_from_registry]."""

FLOAT8_SKIPPED = ("lm_head",)
"""Linears kept in BF16 under float8: the LM head, as the cost model prices it (its logits GEMM in
the model dtype) and as torchtitan's own Llama-3.1-405B float8 preset filters it
(filter_fqns=["lm_head"], models/llama3/config_registry.py: llama3_405b)."""

FLOAT8_SKIPPED_MOE = ("lm_head", "router.gate")
"""The same for an MoE model: the router's gate too, which the cost model prices in BF16 (planner.cost.
moe_time) and torchtitan's DeepSeek-V3 float8 preset filters [torchtitan 0.3 models/deepseek_v3/
config_registry.py: deepseek_v3_671b_float8]."""

MXFP8_CONVERTED = ("attention", "feed_forward")
"""The linears MXFP8LinearConverter converts under MXFP8, by FQN substring (its `fqns`, an include list:
empty converts every linear): the decoder blocks' attention and dense MLP projections, so the LM head and
an MoE model's router gate stay in BF16 as priced [torchtitan 0.3 components/quantization/mx.py:
MXFP8LinearConverter.Config.fqns]."""

_REGISTRY = {"llama3-8b": ("llama3_8b", "8B"), "llama3-70b": ("llama3_70b", "70B")}
"""Catalog models with a torchtitan registry config of their own (module llama3): (config, flavour)."""


def _converters(plan: Plan, moe: bool) -> tuple[str, list[str]]:
    """(import line, converter configs) of the plan's low-precision recipe in torchtitan 0.3: torchao's
    float8 (Float8LinearConverter, the LM head and an MoE model's router gate filtered out;
    Float8GroupedExpertsConverter for routed experts) or its MXFP8 (MXFP8LinearConverter on the decoder
    blocks' linears; MXFP8GroupedExpertsConverter), all told the model is compiled."""
    if plan.training.fp8 == "torchao-mxfp8":
        names = ["MXFP8LinearConverter"] + (["MXFP8GroupedExpertsConverter"] if moe else [])
        configs = [f"MXFP8LinearConverter.Config(fqns={list(MXFP8_CONVERTED)!r}, model_compile_enabled=True)"]
        module = "mx"
    else:
        names = ["Float8LinearConverter"] + (["Float8GroupedExpertsConverter"] if moe else [])
        skipped = FLOAT8_SKIPPED_MOE if moe else FLOAT8_SKIPPED
        configs = [f'Float8LinearConverter.Config(recipe_name="{plan.training.fp8}", filter_fqns={list(skipped)!r}, '
                   "model_compile_enabled=True)"]
        module = "float8"
    if moe:
        configs.append(f"{names[1]}.Config(model_compile_enabled=True)")
    return f"from torchtitan.components.quantization.{module} import {', '.join(sorted(names))}", configs


def float8_job_module(plan: Plan) -> str:
    """planner_job.py: torchtitan's registry config for the model with torchao's low-precision linears,
    as the plan prices them -- every decoder linear in the plan's recipe (float8 or MXFP8), the LM head
    (and an MoE model's router gate) in BF16, an MoE model's routed experts in the recipe's grouped GEMMs,
    compiled (train.sh turns on --compile.enable) [torchtitan 0.3 components/quantization/float8.py,
    mx.py (_converters); models/llama3/__init__.py: model_registry]."""
    moe = plan.model.moe is not None
    registered = registry_flavour(plan.model)
    if registered is not None:
        module, config, flavor = registered
        base = config or _BASE_CONFIG[(module, moe)][0]
        what = f"torchtitan's {module} flavour {flavor} in its {base} trainer config"
        stand_in = False
    else:
        module, base = torchtitan_config_name(plan)
        flavor = dict(_REGISTRY.values())[base]
        what = f"torchtitan's {module}.{base}"
        stand_in = plan.model.name not in _REGISTRY  # as train.sh's defaults: the user names the real config
    imports, converters = _converters(plan, moe)
    fmt = "MXFP8" if plan.training.fp8 == "torchao-mxfp8" else f"float8 ({plan.training.fp8})"
    experts = f" and {fmt.split()[0]} routed experts (scaled grouped GEMMs)" if moe else ""
    lines = [
        f'"""{script_word(plan.model.name)}: {plan.layout.short()} -- {what} with torchao {fmt} '
        f'linears{experts} (generated by planner for {TORCHTITAN_VERSION}).'
        + (f" {script_word(plan.model.name)} has no torchtitan registry config: replace {base} and its flavour "
           "with the model's own." if stand_in else "")
        + (" Point hf_assets_path at its tokenizer." if registered is not None and config is None else "") + '"""',
        "",
        imports,
        f"from torchtitan.models.{module} import model_registry",
        f"from torchtitan.models.{module}.config_registry import {base}",
        "",
        "",
        f"def {JOB_MODULE}():",
        f"    config = {base}()",
        f'    config.model_spec = model_registry("{flavor}", converters=[',
        *(f"        {c}," for c in converters),
        "    ])",
    ]
    if registered is not None and config is None:
        lines.append(f'    config.hf_assets_path = "./assets/hf/{_BASE_CONFIG[(module, moe)][1]}{flavor}"')
    return "\n".join(lines + ["    return config"]) + "\n"


def torchtitan_config_name(plan: Plan) -> tuple[str, str]:
    """(module, config) of torchtitan's registry for the model: a registered flavour's, MoE or dense with
    Q/K norms (torchtitan_engine.registry_flavour; planner_job where the flavour has no config function),
    else the llama3 one, falling back to llama3_8b.

    Not llama3_405b: that preset trains in float8 (a BF16 plan would not describe it), so the
    405B model must be given its own config by the user, as any model outside the registry."""
    if (flavour := registry_flavour(plan.model)) is not None:
        return (flavour[0], flavour[1]) if flavour[1] is not None else (JOB_MODULE, JOB_MODULE)
    return "llama3", _REGISTRY.get(plan.model.name, _REGISTRY["llama3-8b"])[0]


_BASE_CONFIG = {("qwen3", True): ("qwen3_30b_a3b", "Qwen3-"), ("qwen3", False): ("qwen3_14b", "Qwen3-")}
"""Per module and kind (MoE or dense): the trainer config a flavour without a config function of its own is
trained in, and the prefix of its Hugging Face assets folder (./assets/hf/Qwen3-30B-A3B in qwen3_30b_a3b). The
plan's own overrides (degrees, batch, sequence, activation checkpointing) replace the config's."""


def registry_job_module(plan: Plan) -> str:
    """planner_job.py for a flavour torchtitan registers without a config function (Qwen3-235B-A22B, Qwen3-4B and
    8B): the module's trainer config of that kind with the flavour's model spec [torchtitan 0.3 models/qwen3/
    config_registry.py: qwen3_30b_a3b, qwen3_14b; models/qwen3/__init__.py: model_registry]."""
    module, _, flavour = registry_flavour(plan.model)
    base, assets = _BASE_CONFIG[(module, plan.model.moe is not None)]
    return "\n".join([
        f'"""{script_word(plan.model.name)}: {plan.layout.short()} -- torchtitan\'s {module} flavour {flavour} in its '
        f'{base} trainer config, which it has no config function of its own for (generated by planner for '
        f'{TORCHTITAN_VERSION}). Point hf_assets_path at its tokenizer."""',
        "",
        f"from torchtitan.models.{module} import model_registry",
        f"from torchtitan.models.{module}.config_registry import {base}",
        "",
        "",
        f"def {JOB_MODULE}():",
        f"    config = {base}()",
        f'    config.model_spec = model_registry("{flavour}")',
        f'    config.hf_assets_path = "./assets/hf/{assets}{flavour}"',
        "    return config",
    ]) + "\n"


def to_torchtitan(plan: Plan) -> LaunchFiles:
    """torchtitan launch files: train.sh (0.3 overrides) and job.toml (0.2 style)."""
    args = torchtitan_overrides(plan)
    c = plan.cluster
    fp8 = plan.training.fp8 is not None  # float8 lives in a config function: planner_job.py beside train.sh
    names = (JOB_MODULE, JOB_MODULE) if fp8 else torchtitan_config_name(plan)
    job = not fp8 and names[0] == JOB_MODULE  # so does an MoE flavour without a config function
    which = '  --module "${MODULE:-%s}" --config "${CONFIG:-%s}" \\' % names
    script = "\n".join([
        "#!/usr/bin/env bash",
        f"# {script_word(plan.model.name)} on {c.num_nodes} x {c.gpus_per_node} {script_word(c.gpu.name)}: "
        f"{plan.layout.short()}",
        f"# generated by planner for {TORCHTITAN_VERSION}; "
        + (f"{JOB_MODULE}.py builds the float8 model: edit its registry config for another model" if fp8
           else f"{JOB_MODULE}.py builds the model's registry flavour" if job
           else "the model's own torchtitan registry config" if registry_flavour(plan.model) is not None
           else "set MODULE/CONFIG to your torchtitan model and config"),
        "set -euo pipefail",
        *(['export PYTHONPATH="$(cd "$(dirname "$0")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"  # planner_job.py']
          if names[0] == JOB_MODULE else []),
        f'torchrun --nnodes {c.num_nodes} --nproc-per-node {c.gpus_per_node} --node-rank "${{NODE_RANK:-0}}" \\',
        '  --master-addr "${MASTER_ADDR:-localhost}" --master-port 29500 -m torchtitan.train \\',
        which,
        "  " + " ".join(shlex.quote(x) for x in args),
    ]) + "\n"
    if fp8:  # no 0.2-style TOML: its float8 keys are not checked against a torchtitan the planner targets
        return LaunchFiles("torchtitan", {"train.sh": script, f"{JOB_MODULE}.py": float8_job_module(plan)}, tuple(args))
    if registry_flavour(plan.model) is not None:  # no 0.2-style TOML: its qwen3 / expert keys are not checked against 0.3
        return LaunchFiles("torchtitan", {"train.sh": script} | ({f"{JOB_MODULE}.py": registry_job_module(plan)} if job
                                                                  else {}), tuple(args))
    if _tp_without_sp(plan):  # no 0.2-style TOML: 0.2 cannot turn sequence parallelism off
        return LaunchFiles("torchtitan", {"train.sh": script}, tuple(args))
    return LaunchFiles("torchtitan", {"train.sh": script, "job.toml": torchtitan_toml(plan)}, tuple(args))


def _tp_without_sp(plan: Plan) -> bool:
    """TP without sequence parallelism: torchtitan 0.3 turns it off with --parallelism.no-enable_sequence_parallel;
    0.2 has no such key and always shards the norms on the sequence [torchtitan v0.2.2
    torchtitan/models/llama3/infra/parallelize.py: apply_tp, SequenceParallel() for the norms]."""
    return plan.layout.tp > 1 and not plan.layout.sequence_parallel
