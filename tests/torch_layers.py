"""Real GPT- and Llama-style decoder layers in bf16 PyTorch, for measuring saved-for-backward bytes.

Kernels mirror Megatron-core / Transformer Engine on GPU (see shared/reference/memory.md §1):
fused QKV GEMM in Megatron's grouped layout, native dropout (1-byte masks), a fused RMSNorm
(saves input + fp32 rstd), a fused SwiGLU (saves its input), fused RoPE (saves no per-layer
cos/sin), Megatron-style eager core attention on bmm views, or SDPA (flash) with enable_gqa.
Recompute is torch.utils.checkpoint(use_reentrant=True), as Megatron's tensor_parallel.checkpoint.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

DT = torch.bfloat16


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return (x.float() * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, gy):
        x, rstd, w = ctx.saved_tensors
        xf, g = x.float(), (gy * w).float()
        xhat = xf * rstd
        gx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        gw = (gy.float() * xhat).sum(dim=tuple(range(gy.dim() - 1)))
        return gx.to(x.dtype), gw.to(w.dtype), None


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, gy):
        (x,) = ctx.saved_tensors
        a, b = x.float().chunk(2, dim=-1)
        sig = torch.sigmoid(a)
        ga = gy.float() * b * sig * (1 + a * (1 - sig))
        gb = gy.float() * a * sig
        return torch.cat([ga, gb], dim=-1).to(x.dtype)


class _FusedRoPE(torch.autograd.Function):
    """Rotate-half RoPE that keeps cos/sin outside autograd (as TE's fused kernel keeps only freqs)."""

    @staticmethod
    def forward(ctx, t, cos, sin):
        ctx.cos, ctx.sin = cos, sin
        t1, t2 = t.float().chunk(2, dim=-1)
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1).to(t.dtype)

    @staticmethod
    def backward(ctx, g):
        g1, g2 = g.float().chunk(2, dim=-1)
        cos, sin = ctx.cos, ctx.sin
        return torch.cat([g1 * cos + g2 * sin, g2 * cos - g1 * sin], dim=-1).to(g.dtype), None, None


class DecoderLayer(torch.nn.Module):
    """One decoder layer; family 'gpt' or 'llama'; attention 'eager' or 'flash'."""

    def __init__(self, family, h, a, g, f, attention="flash", recompute="none", dropout=0.1):
        super().__init__()
        self.family, self.h, self.a, self.g, self.f = family, h, a, g, f
        self.d = h // a
        self.attention, self.recompute = attention, recompute
        gpt = family == "gpt"
        self.p_hidden = dropout if gpt else 0.0
        # CPU SDPA uses its flash kernel only without attention dropout (memory.md §4.1)
        self.p_attn = dropout if gpt and attention == "eager" else 0.0
        self.qkv = torch.nn.Linear(h, h + 2 * g * self.d, bias=gpt)
        self.proj = torch.nn.Linear(h, h, bias=gpt)
        self.fc1 = torch.nn.Linear(h, 2 * f if not gpt else f, bias=gpt)
        self.fc2 = torch.nn.Linear(f, h, bias=gpt)
        if gpt:
            self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        else:
            self.w1 = torch.nn.Parameter(torch.ones(h))
            self.w2 = torch.nn.Parameter(torch.ones(h))
        self.to(DT)
        self.cos = self.sin = None

    def shared_buffers(self):
        return [t for t in (self.cos, self.sin) if t is not None]

    def _set_rope(self, s):
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        ang = torch.outer(torch.arange(s).float(), inv)  # [s, d/2]
        self.cos = ang.cos()[:, None, None, :]
        self.sin = ang.sin()[:, None, None, :]

    def _norm(self, x, which):
        if self.family == "gpt":
            return (self.ln1 if which == 1 else self.ln2)(x)
        return _RMSNorm.apply(x, self.w1 if which == 1 else self.w2, 1e-5)

    def _dropout_add(self, y, residual):
        if self.p_hidden > 0:
            y, _mask = torch.native_dropout(y, self.p_hidden, True)
        return residual + y

    def _core(self, q, k, v):
        """q [s,b,a,d], k/v [s,b,g,d] -> context [s,b,h]."""
        s, b, a, d = q.shape
        g = k.shape[2]
        if self.attention == "flash":
            o = F.scaled_dot_product_attention(
                q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3),
                is_causal=True, enable_gqa=g < a,
            )
            return o.permute(2, 0, 1, 3).reshape(s, b, a * d)
        if g < a:  # Megatron's unfused attention expands K/V to all heads
            k = k.repeat_interleave(a // g, dim=2)
            v = v.repeat_interleave(a // g, dim=2)
        q3 = q.reshape(s, b * a, d).transpose(0, 1)
        k3 = k.reshape(s, b * a, d).transpose(0, 1)
        v3 = v.reshape(s, b * a, d).transpose(0, 1)
        scores = torch.bmm(q3, k3.transpose(1, 2))
        probs = torch.softmax(scores * (1.0 / math.sqrt(d)), dim=-1)
        if self.p_attn > 0:
            probs, _mask = torch.native_dropout(probs, self.p_attn, True)
        ctx = torch.bmm(probs, v3)  # [b*a, s, d]
        return ctx.transpose(0, 1).reshape(s, b, a * d)

    def _layer(self, x):
        s, b, h = x.shape
        a, g, d = self.a, self.g, self.d
        qkv = self.qkv(self._norm(x, 1))
        if self.family == "gpt":  # Megatron layout [s, b, a, 3d]
            q, k, v = qkv.view(s, b, a, 3 * d).split(d, dim=-1)
        else:  # grouped layout [s, b, g, (a/g + 2) d]
            grouped = qkv.view(s, b, g, (a // g + 2) * d)
            q, k, v = grouped.split([(a // g) * d, d, d], dim=-1)
            q = _FusedRoPE.apply(q.reshape(s, b, a, d), self.cos, self.sin)
            k = _FusedRoPE.apply(k, self.cos, self.sin)
        if self.recompute == "selective":
            ctx = checkpoint(self._core, q, k, v, use_reentrant=True)
        else:
            ctx = self._core(q, k, v)
        x = self._dropout_add(self.proj(ctx), x)
        y = self.fc1(self._norm(x, 2))
        y = F.gelu(y) if self.family == "gpt" else _SwiGLU.apply(y)
        return self._dropout_add(self.fc2(y), x)

    def forward(self, x):
        if self.family == "llama" and (self.cos is None or self.cos.shape[0] != x.shape[0]):
            self._set_rope(x.shape[0])
        if self.recompute == "full":
            return checkpoint(self._layer, x, use_reentrant=True)
        return self._layer(x)


def saved_bytes(layer: DecoderLayer, b: int, s: int) -> int:
    """Bytes of distinct storages saved for backward by one forward (parameters excluded)."""
    torch.manual_seed(0)
    x = torch.randn(s, b, layer.h, dtype=DT, requires_grad=True)
    layer(x)  # warm-up: builds the RoPE cache and one-time kernel state
    excluded = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    excluded |= {t.untyped_storage().data_ptr() for t in layer.shared_buffers()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in excluded:
            seen[st.data_ptr()] = st.nbytes()
        return t.detach()  # returning t itself would leak a grad_fn cycle (memory.md §4.9)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    del out
    return sum(seen.values())


class TitanBlock(torch.nn.Module):
    """A torchtitan llama block [torchtitan models/llama3: TransformerBlock, Attention, FeedForward]:
    RMSNorm, separate wq / wk / wv / wo linears, RoPE, SDPA with grouped K/V, then
    w2(silu(w1(x)) * w3(x)); tensors [b, s, h] as torchtitan lays them out."""

    def __init__(self, h, a, g, f, fused_qkv=False):
        super().__init__()
        self.h, self.a, self.g, self.d = h, a, g, h // a
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.wq, self.wk, self.wv, self.wo = lin(h, h), lin(h, g * self.d), lin(h, g * self.d), lin(h, h)
        # torchtitan 0.3's fused projection (models/common/attention.py: one wqkv linear, split after it)
        self.wqkv = lin(h, h + 2 * g * self.d) if fused_qkv else None
        self.w1, self.w3, self.w2 = lin(h, f), lin(h, f), lin(f, h)
        self.n1, self.n2 = torch.nn.RMSNorm(h), torch.nn.RMSNorm(h)
        self.to(DT)

    def _rope(self, t):
        s, d = t.shape[1], t.shape[-1]
        ang = torch.outer(torch.arange(s).float(), 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))
        cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
        t1, t2 = t.float().chunk(2, dim=-1)
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], dim=-1).to(t.dtype)

    def forward(self, x):
        b, s, _ = x.shape
        y = self.n1(x)
        if self.wqkv is not None:
            q, k, v = self.wqkv(y).split([self.h, self.g * self.d, self.g * self.d], dim=-1)
            q, k = self._rope(q.view(b, s, self.a, self.d)), self._rope(k.view(b, s, self.g, self.d))
            v = v.view(b, s, self.g, self.d)
        else:
            q = self._rope(self.wq(y).view(b, s, self.a, self.d))
            k = self._rope(self.wk(y).view(b, s, self.g, self.d))
            v = self.wv(y).view(b, s, self.g, self.d)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True, enable_gqa=self.g < self.a)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, self.h))
        y = self.n2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def op_checkpoint_saved_bytes(block: TitanBlock, b: int, s: int, save_ops) -> int:
    """Bytes torch's selective checkpointing keeps for one forward of `block` under torchtitan's
    per-op policy (MUST_SAVE the ops in `save_ops`, except every second mm, counted per forward)
    [torchtitan distributed/activation_checkpoint.py: SelectiveAC._wrap_block]: the distinct storages
    of the cached op outputs plus the checkpoint's input."""
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    caches = []

    def context_fn():
        meta = {"forward": 0, "recompute": 0}

        def policy(ctx, func, *args, **kwargs):
            key = "recompute" if ctx.is_recompute else "forward"
            if func == torch.ops.aten.mm.default:
                meta[key] += 1
                if meta[key] % 2 == 0:
                    return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE if func in save_ops else CheckpointPolicy.PREFER_RECOMPUTE

        fwd, rc = create_selective_checkpoint_contexts(policy)
        caches.append(fwd)
        return fwd, rc

    torch.manual_seed(0)
    x = torch.randn(b, s, block.h, dtype=DT, requires_grad=True)
    out = checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
    seen = {x.untyped_storage().data_ptr(): x.untyped_storage().nbytes()}
    for entries in caches[0].storage.values():
        for entry in entries.values() if isinstance(entries, dict) else entries:
            for w in torch.utils._pytree.tree_leaves(entry):
                val = getattr(w, "val", None)
                if isinstance(val, torch.Tensor):
                    seen[val.untyped_storage().data_ptr()] = val.untyped_storage().nbytes()
    del out
    return sum(seen.values())


def _tp_boundary_worker(rank: int, world: int, port: int, b: int, s: int, h: int, out_features: int, out) -> None:
    """One rank of a sequence-parallel TP boundary as DTensor runs it (torchtitan's attention / FFN
    input): the block input sharded on the sequence (Shard(1)), redistributed to Replicate by
    PrepareModuleInput, into a ColwiseParallel linear; puts the bytes autograd saved for backward
    (parameters excluded) on `out`."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, parallelize_module

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        block = torch.nn.Sequential(torch.nn.Linear(h, out_features, bias=False)).to(DT)
        parallelize_module(block, mesh, {"": PrepareModuleInput(input_layouts=(Shard(1),),
                                                                  desired_input_layouts=(Replicate(),)),
                                         "0": ColwiseParallel()})
        params = {(p.to_local() if isinstance(p, DTensor) else p).untyped_storage().data_ptr() for p in block.parameters()}
        seen: dict[int, int] = {}

        def pack(t):
            local = t.to_local() if isinstance(t, DTensor) else t
            if local.untyped_storage().data_ptr() not in params:
                seen[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
            return t

        x = torch.randn(b, s // world, h, dtype=DT, requires_grad=True)  # this rank's sequence shard
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = block(DTensor.from_local(x, mesh, [Shard(1)]))
        (y.to_local() if isinstance(y, DTensor) else y).sum().backward()
        if rank == 0:
            out.put(sum(seen.values()))
    finally:
        dist.destroy_process_group()


def tp_boundary_saved_bytes(b: int, s: int, h: int, out_features: int, world: int = 2) -> int:
    """_tp_boundary_worker on `world` CPU ranks (gloo): rank 0's saved bytes."""
    return _spawn_ranks(_tp_boundary_worker, world, (b, s, h, out_features))


def _rss() -> tuple[int, int]:
    """(peak, current) resident bytes of this process (Linux /proc/self/status: VmHWM, VmRSS)."""
    got = {}
    with open("/proc/self/status") as f:
        for ln in f:
            if ln.startswith(("VmHWM", "VmRSS")):
                got[ln.split(":")[0]] = int(ln.split()[1]) * 1024
    return got["VmHWM"], got["VmRSS"]


def _loss_peak_worker(rank: int, world: int, port: int, tokens: int, vocab: int, h: int, kind: str,
                      megatron: str | None, out) -> None:
    """One rank of a training step's loss: BF16 logits from an output layer of vocab / world rows, then
    torchtitan's pre-0.3 loss (its train.py: cross_entropy(pred.float(), labels) -- inside torch's
    loss_parallel() over the vocab-sharded logits when world > 1 --, `del pred`, backward: kind 'torch')
    or megatron-core's own vocab_parallel_cross_entropy over the tensor-parallel group, as its language
    model calls it (kind 'megatron'; imported from `megatron`, a MEGATRON_PATH, where given), or torchtitan
    0.3's chunk loss without TP, compiled, its logits held through backward (kind 'compiled'). Run once to
    warm up, then again with the peak resident set reset (/proc/self/clear_refs 5): puts rank 0's peak
    above the resident bytes before the step on `out`. The parent starts it with glibc's mmap threshold
    fixed, so every large tensor is its own mapping, resident while it lives and returned when freed."""
    import os
    import sys

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        x = torch.randn(tokens, h, dtype=DT, requires_grad=True)
        w = torch.randn(vocab // world, h, dtype=DT, requires_grad=True)
        labels = torch.randint(0, vocab, (tokens,))
        if kind == "megatron":
            if megatron:
                sys.path.insert(0, megatron)
            from planner.check._cpu_shims import install_shims

            install_shims()
            from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

            group = dist.new_group(list(range(world)))
        elif world > 1:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import DTensor, Shard
            from torch.distributed.tensor.parallel import loss_parallel

            mesh = init_device_mesh("cpu", (world,))

        if kind == "compiled":  # torchtitan 0.3's cross_entropy_loss without TP, as BaseLoss._maybe_compile runs it
            compiled = torch.compile(lambda pred, lab: torch.nn.functional.cross_entropy(
                pred.flatten(0, 1).float(), lab.flatten(0, 1), reduction="sum", ignore_index=-100))

        def step():
            pred = x @ w.t()
            if kind == "compiled":  # ChunkedLossWrapper holds the chunk's logits through its backward
                compiled(pred.unsqueeze(0), labels.unsqueeze(0)).backward()
            elif kind == "megatron":  # [s, b, V / tp] logits and [s, b] labels, as GPTModel hands them over
                loss = vocab_parallel_cross_entropy(pred.view(tokens, 1, -1), labels.view(tokens, 1), tp_group=group)
                del pred
                loss.sum().backward()
            elif world > 1:
                pred = DTensor.from_local(pred, mesh, [Shard(1)])
                with loss_parallel():
                    loss = torch.nn.functional.cross_entropy(pred.float(), labels)
                    del pred
                    loss.backward()
            else:
                loss = torch.nn.functional.cross_entropy(pred.float(), labels)
                del pred
                loss.backward()
            x.grad = w.grad = None

        step()
        _, before = _rss()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        step()
        if rank == 0:
            out.put(_rss()[0] - before)
    finally:
        dist.destroy_process_group()


def _spawn_ranks(target, world: int, args: tuple, env: dict[str, str] | None = None, timeout: float = 120):
    """Run target(rank, world, port, *args, queue) on `world` spawned CPU processes; rank 0's answer."""
    import os
    import queue
    import socket
    import time

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})  # spawned children inherit the environment as it is at start
    try:
        procs = [ctx.Process(target=target, args=(r, world, port, *args, out)) for r in range(world)]
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        deadline = time.monotonic() + timeout
        while True:  # a rank that fails exits without an answer: stop waiting then
            try:
                return out.get(timeout=0.5)
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                    raise RuntimeError(f"a rank failed (exit codes {[p.exitcode for p in procs]})") from None
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()


def loss_peak_bytes(tokens: int, vocab: int, h: int, world: int = 1, kind: str = "torch",
                    megatron: str | None = None) -> int:
    """_loss_peak_worker on `world` CPU ranks: rank 0's peak bytes over its resident set before the step."""
    return _spawn_ranks(_loss_peak_worker, world, (tokens, vocab, h, kind, megatron),
                        env={"MALLOC_MMAP_THRESHOLD_": "65536"})


def torchtitan_moe_saved_bytes(b: int, s: int) -> tuple[int, int]:
    """(bytes saved for backward, bytes of its input) by one forward of torchtitan 0.3's own MoE module --
    its qwen3 registry's debugmodel_moe layer, BF16 -- compiled as torchtitan compiles each block
    (fullgraph, capture_scalar_outputs: distributed/compile.py apply_compile) with the partition Inductor
    uses (AOTAutograd's min-cut rematerialisation) and no code generation, at ep 1 (its local dispatcher)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from planner.check._cpu_shims import install_shims

    install_shims()  # torchtitan imports triton
    from torchtitan.models.qwen3 import model_registry

    torch._dynamo.config.capture_scalar_outputs = True
    cfg = model_registry("debugmodel_moe").model
    moe = cfg.layers[0].moe.build().to(DT)
    torch.manual_seed(0)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.02)
    x = torch.randn(b, s, cfg.dim, dtype=DT, requires_grad=True)
    nop = lambda gm, inputs: gm.forward  # noqa: E731
    compiled = torch.compile(moe, fullgraph=True, backend=aot_autograd(
        fw_compiler=nop, bw_compiler=nop, partition_fn=min_cut_rematerialization_partition))
    compiled(x)
    excluded = {p.untyped_storage().data_ptr() for p in moe.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in excluded:
            seen[st.data_ptr()] = st.nbytes()
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = compiled(x)
    del out
    torch._dynamo.reset()
    return sum(seen.values()), x.untyped_storage().nbytes()
