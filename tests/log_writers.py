"""Training logs in each framework's exact print format, for synthesising calibration inputs.

The formats follow the framework source quoted in planner/logs.py (Megatron-LM training_log,
report_memory and _print_args; torchtitan MetricsProcessor.log; DeepSpeed ThroughputTimer.stop
and see_memory_usage; NeMo 2's Lightning progress line). They share no code with the parser.
"""

from __future__ import annotations

MB, GIB = 2**20, 2**30


def megatron_args_dump(args: dict[str, object]) -> list[str]:
    lines = ["------------------------ arguments ------------------------"]
    body = [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in args.items()]
    lines += sorted(body, key=str.lower)
    lines.append("-------------------- end of arguments ---------------------")
    return lines


def megatron_log(step_s: float, peak_reserved: float, *, args: dict[str, object] | None = None, iters: int = 50,
                 interval: int = 10, warmup_factor: float = 3.0, ranks: int = 2, gbs: int = 1024) -> str:
    """A Megatron-LM log: argument dump, iteration lines every `interval`, memory lines per rank."""
    out = ["using world size: 64, data-parallel size: 4, context-parallel size: 1"]
    if args:
        out += megatron_args_dump(args)
    out.append("[after dataloaders are built] datetime: 2026-11-30 10:00:00 ")
    for it in range(interval, iters + 1, interval):
        t = step_s * (warmup_factor if it == interval else 1.0)
        out.append(f" [2026-11-30 10:{it // 60:02d}:{it % 60:02d}.123456] iteration {it:8d}/{iters:8d} |"
                   f" consumed samples: {it * gbs:12d} | elapsed time per iteration (ms): {t * 1000:.1f} |"
                   f" throughput per GPU (TFLOP/s/GPU): {123.4:.1f} | learning rate: {3e-4:.6E} |"
                   f" global batch size: {gbs:5d} | lm loss: {7.5 - it / 100:.6E} | loss scale: 1.0 |"
                   f" grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |")
        if it == interval:
            for r in range(ranks):
                peak = peak_reserved * (1 - 0.1 * r)
                out.append(f"[Rank {r * 8}] (after {it} iterations) memory (MB) | allocated: {peak * 0.5 / MB:.2f}"
                           f" | max allocated: {peak * 0.9 / MB:.2f} | reserved: {peak * 0.95 / MB:.2f}"
                           f" | max reserved: {peak / MB:.2f}")
    return "\n".join(out) + "\n"


def torchtitan_log(tps: float, peak_reserved: float, *, steps: int = 30, freq: int = 10, capacity: float = 80 * GIB,
                   colour: bool = True) -> str:
    """torchtitan's step lines (ANSI colours as torchtitan.tools.utils.Color prints them)."""
    c = dict(red="\033[31m", green="\033[32m", orange="\033[33m", turquoise="\033[38;2;54;234;195m",
             blue="\033[34m", cyan="\033[36m", magenta="\033[35m", reset="\033[39m") if colour else \
        {k: "" for k in ("red", "green", "orange", "turquoise", "blue", "cyan", "magenta", "reset")}
    out = ["[titan] 2026-11-30 10:00:00,000 - root - INFO - Training starts at step 1"]
    for step in [1] + list(range(freq, steps + 1, freq)):
        t = tps / 4 if step == 1 else tps
        gib = peak_reserved / GIB
        out.append(f"[titan] 2026-11-30 10:00:{step:02d},000 - root - INFO - "
                   f"{c['red']}step: {step:2}  {c['green']}loss: {8.5 - step / 100:8.5f}  "
                   f"{c['orange']}grad_norm: {1.2345:7.4f}  {c['turquoise']}memory: {gib:5.2f}GiB"
                   f"({100 * peak_reserved / capacity:.2f}%)  {c['blue']}tps: {round(t):,}  "
                   f"{c['cyan']}tflops: {t * 6e9 / 1e12:,.2f}  {c['magenta']}mfu: {40.0:.2f}%{c['reset']}")
    return "\n".join(out) + "\n"


def deepspeed_log(samples_per_s: float, peak_reserved: float, *, steps: int = 40, every: int = 10) -> str:
    """DeepSpeed's ThroughputTimer lines and one see_memory_usage block."""
    out = ["[2026-11-30 10:00:00,000] [INFO] [config.py:1000:print] DeepSpeedEngine configuration:"]
    for g in range(every, steps + 1, every):
        cur = samples_per_s / 2 if g == every else samples_per_s
        out.append(f"[2026-11-30 10:00:{g:02d},000] [INFO] [timer.py:264:stop] epoch=0/micro_step={g * 4}/"
                   f"global_step={g}, RunningAvgSamplesPerSec={cur * 0.99}, CurrSamplesPerSec={cur}, "
                   f"MemAllocated={round(peak_reserved * 0.5 / GIB, 2)}GB, MaxMemAllocated={round(peak_reserved * 0.9 / GIB, 2)}GB")
    out.append("After step")
    out.append(f"MA {round(peak_reserved * 0.5 / GIB, 2)} GB         Max_MA {round(peak_reserved * 0.9 / GIB, 2)} GB         "
               f"CA {round(peak_reserved * 0.95 / GIB, 2)} GB         Max_CA {round(peak_reserved / GIB)} GB ")
    out.append("CPU Virtual Memory:  used = 123.45 GB, percent = 12.3%")
    return "\n".join(out) + "\n"


def nemo_log(step_s: float, *, steps: int = 30) -> str:
    """NeMo 2 (Lightning) progress lines."""
    out = []
    for i in range(steps):
        t = step_s * (4 if i == 0 else 1)
        out.append(f"Training epoch 0, iteration {i}/{steps - 1} | lr: 0.0003 | global_batch_size: 1024 | "
                   f"global_step: {i} | reduced_train_loss: {8.0 - i / 100:.4f} | train_step_timing in s: {t:.4g} | "
                   f"consumed_samples: {(i + 1) * 1024}")
    return "\n".join(out) + "\n"
