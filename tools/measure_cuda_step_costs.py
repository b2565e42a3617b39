"""Step costs of an 8B-class target and a DFlash drafter on one CUDA GPU (torch only).

Random bf16 weights in Qwen3-8B's shape (36 layers, hidden 4096, 32 query / 8 KV heads of 128,
MLP 12288, vocabulary 151,936). Every forward is captured once in a CUDA graph and replayed, as
serving engines run decoding steps, so the figures are the GPU's time, not Python's:

- target: batch B in 1..64, each request verifying L tokens (L = 1 is a plain step) against a
  KV cache of `--context` tokens, with the LM head over all B*L tokens;
- draft pass: the drafter's layers over 16 positions per request, attending to the context,
  its `fc` fusing 5 target layers for the L new tokens, and the LM head over 15 positions.

- tree verify (`--tree-nodes`): batch B in `--tree-batches`, each request verifying N draft-tree
  nodes under a tree (ancestor) mask, and, beside it, N tokens of a linear draft, to price the
  reference path's trees (DDTree, the lookup and retrieved branches) on a GPU.

Writes JSON with the milliseconds of every (B, L), tree and draft pass. Used to build the draft
policy's CUDA preset (dflash_plugin/measured_costs.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 4096, 36, 32, 8, 128, 12288, 151936
BLOCK = 16
GROUP = HEADS // KV_HEADS
FEATURE_LAYERS = 5


def rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02


class Layer:
    def __init__(self):
        self.qkv = rand((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN)
        self.o = rand(HIDDEN, HEADS * HEAD_DIM)
        self.gate_up = rand(2 * MLP, HIDDEN)
        self.down = rand(HIDDEN, MLP)
        self.norm1 = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
        self.norm2 = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)

    def __call__(self, x, k_cache, v_cache, mask, ctx_end):
        # x: [B, L, H]; caches: [B, KV, ctx, D] with the new keys written into their last L slots
        b, length, _ = x.shape
        h = F.rms_norm(x, (HIDDEN,), self.norm1)
        qkv = h @ self.qkv.t()
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        k_cache[:, :, ctx_end - length:ctx_end] = k.view(b, length, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v_cache[:, :, ctx_end - length:ctx_end] = v.view(b, length, KV_HEADS, HEAD_DIM).transpose(1, 2)
        # Grouped-query attention without copying K/V per query head (as paged kernels do): the
        # GROUP query heads sharing a KV head become GROUP * L query rows of that KV head.
        q = q.view(b, length, KV_HEADS, GROUP, HEAD_DIM).permute(0, 2, 3, 1, 4)
        q = q.reshape(b, KV_HEADS, GROUP * length, HEAD_DIM)
        rows = None if mask is None else mask.repeat(GROUP, 1)
        att = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=rows)
        att = att.view(b, KV_HEADS, GROUP, length, HEAD_DIM).permute(0, 3, 1, 2, 4)
        x = x + att.reshape(b, length, HEADS * HEAD_DIM) @ self.o.t()
        h = F.rms_norm(x, (HIDDEN,), self.norm2)
        gate, up = (h @ self.gate_up.t()).chunk(2, -1)
        return x + (F.silu(gate) * up) @ self.down.t()


def timed_graph(fn, repeats: int) -> float:
    """Milliseconds of one replay of `fn` captured in a CUDA graph (median of `repeats`)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--max-verify", type=int, default=16)
    parser.add_argument("--draft-layers", default="1,3,5,8")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tree-nodes", default="",
                        help="comma-separated node counts of draft trees to verify (none: skip)")
    parser.add_argument("--tree-batches", default="1,2,4,8,16")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    draft_layer_counts = [int(n) for n in args.draft_layers.split(",")]
    tree_nodes = [int(n) for n in args.tree_nodes.split(",") if n]
    tree_batches = [int(b) for b in args.tree_batches.split(",")] if tree_nodes else []
    torch.manual_seed(0)
    started = time.time()
    layers = [Layer() for _ in range(LAYERS)]
    drafter = [Layer() for _ in range(max(draft_layer_counts))]
    embed = rand(VOCAB, HIDDEN)
    lm_head = rand(VOCAB, HIDDEN)
    fc = rand(HIDDEN, FEATURE_LAYERS * HIDDEN)
    final_norm = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
    max_b = max(batches + tree_batches)
    ctx = args.context
    # One cache per layer, sized for the largest step; each step uses a [:b, :, :ctx+L] view.
    span = ctx + BLOCK
    cache_len = ctx + max([BLOCK, *tree_nodes])
    k_caches = [rand(max_b, KV_HEADS, cache_len, HEAD_DIM) for _ in range(LAYERS)]
    v_caches = [rand(max_b, KV_HEADS, cache_len, HEAD_DIM) for _ in range(LAYERS)]
    dk = [rand(max_b, KV_HEADS, span, HEAD_DIM) for _ in drafter]
    dv = [rand(max_b, KV_HEADS, span, HEAD_DIM) for _ in drafter]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "shape": {"hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS,
                        "head_dim": HEAD_DIM, "mlp": MLP, "vocab": VOCAB},
              "context": ctx, "dtype": "bfloat16", "cuda_graphs": True,
              "target_ms": {}, "draft_ms": {}, "tree_ms": {}, "linear_ms": {}}

    def target_step(b, length):
        ids = torch.randint(0, VOCAB, (b, length), device="cuda")
        # Keys padded to ctx + 16 (masked) so every step's attention has aligned shapes, as a
        # paged kernel has; unaligned boolean masks send SDPA to a slower kernel for odd L.
        mask = torch.ones(length, span, dtype=torch.bool, device="cuda").tril(ctx)
        return target_forward(ids, mask, span, ctx + length)

    def target_forward(ids, mask, keys, ctx_end):
        """The target over `ids` [b, L] against the first `keys` cache slots, its new keys
        written up to `ctx_end`: a plain step, a verify block or a tree."""
        ks = [c[:ids.shape[0], :, :keys] for c in k_caches]
        vs = [c[:ids.shape[0], :, :keys] for c in v_caches]

        def run():
            x = embed[ids]
            for layer, k, v in zip(layers, ks, vs):
                x = layer(x, k, v, mask, ctx_end)
            return F.rms_norm(x, (HIDDEN,), final_norm) @ lm_head.t()
        return run

    def verify_nodes(b, nodes, tree):
        # N new positions per request after the context: under a tree mask each sees the context
        # and its ancestors (a random tree, each node's parent an earlier node), else causal.
        ids = torch.randint(0, VOCAB, (b, nodes), device="cuda")
        own = torch.eye(nodes, dtype=torch.bool, device="cuda")
        if tree:
            parents = [-1] + [int(torch.randint(0, i, ())) for i in range(1, nodes)]
            for i in range(1, nodes):
                own[i] |= own[parents[i]]
        else:
            own = torch.ones(nodes, nodes, dtype=torch.bool, device="cuda").tril()
        mask = torch.cat([torch.ones(nodes, ctx, dtype=torch.bool, device="cuda"), own], 1)
        return target_forward(ids, mask, ctx + nodes, ctx + nodes)

    def draft_pass(b, num_layers, new_tokens):
        # The L new target tokens' features are fused by `fc` and become context K/V in every
        # drafter layer; then 16 block positions per request attend to all context and to each
        # other (DFlash's in-block attention is bidirectional); the LM head drafts 15 of them.
        feats = rand(b, new_tokens, FEATURE_LAYERS * HIDDEN)
        ids = torch.randint(0, VOCAB, (b, BLOCK), device="cuda")
        ks = [c[:b, :, :ctx + BLOCK] for c in dk[:num_layers]]
        vs = [c[:b, :, :ctx + BLOCK] for c in dv[:num_layers]]
        kv_rows = slice(HEADS * HEAD_DIM, None)

        def run():
            context = F.rms_norm(feats @ fc.t(), (HIDDEN,), final_norm)
            x = embed[ids]
            for layer, k, v in zip(drafter[:num_layers], ks, vs):
                ck, cv = (context @ layer.qkv[kv_rows].t()).chunk(2, -1)
                k[:, :, ctx - new_tokens:ctx] = ck.view(b, new_tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
                v[:, :, ctx - new_tokens:ctx] = cv.view(b, new_tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
                x = layer(x, k, v, None, ctx + BLOCK)
            return F.rms_norm(x[:, 1:], (HIDDEN,), final_norm) @ lm_head.t()
        return run

    for b in batches:
        for length in range(1, args.max_verify + 1):
            ms = timed_graph(target_step(b, length), args.repeats)
            result["target_ms"][f"{b}x{length}"] = ms
            print(f"target b={b} L={length}: {ms:.3f} ms", flush=True)
        for n in draft_layer_counts:
            ms = timed_graph(draft_pass(b, n, 4), args.repeats)
            result["draft_ms"][f"{b}x{n}"] = ms
            print(f"draft b={b} layers={n}: {ms:.3f} ms", flush=True)
        torch.cuda.empty_cache()
    for b in tree_batches:
        for nodes in tree_nodes:
            for tree, table in ((True, "tree_ms"), (False, "linear_ms")):
                ms = timed_graph(verify_nodes(b, nodes, tree), args.repeats)
                result[table][f"{b}x{nodes}"] = ms
                print(f"{table[:-3]} b={b} nodes={nodes}: {ms:.3f} ms", flush=True)
        torch.cuda.empty_cache()
    result["seconds"] = time.time() - started
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
    plain = result["target_ms"]["1x1"]
    print(f"plain step at batch 1: {plain:.3f} ms; total {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
