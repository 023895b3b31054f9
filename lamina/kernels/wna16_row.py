"""W4A16 / W8A16 GEMV for 1..MAX_M rows of bf16 x (decode): out = x @ dequantize(words, scale, zero_point).T
(+ bias).

    x            [M, K]            bf16, last stride 1; read as int32 pairs of bf16 (x[2i] in bits 0..15,
                                   x[2i + 1] in bits 16..31)
    words        int32 [N, KW]     the checkpoint's pack-quantized words as stored (lamina/quant/packing.py):
                                   32 / BITS values per word along K, value j in bits [j * BITS, (j + 1) * BITS),
                                   stored unsigned (u = q + OFFSET); or a naive int8 weight [N, K] viewed as int32
                                   (`xor=NAIVE_INT8_XOR`)
    scale        bf16 [N, groups]  zero_point int8 [N, groups] or None (symmetric);  bias bf16 [N] or None
    out          bf16 [M, N]       fp32 inside, one rounding at the end (after the bias)

A program owns BLOCK_N rows and walks K in tiles of BLOCK_KW words. Each row is its own 1-D tensor over the
tile's words (rows unrolled with tuples), so the weight tiles, x's tile and the scale / zero-point loads share
one register layout: thread t owns words 4t..4t+3 of every row (a 16-byte load per row) and x's values for
them (16-byte loads, converted once for all BLOCK_N rows). No layout conversion, no shared memory, no division
in the K loop; one lane reduction per row at the end (1-warp programs: shuffles only). With M rows of x (a
verify step, a few requests) each weight word is unpacked once and its floats multiplied into every row: x's
pairs take 16 registers a row at 4 bits, so M stops at 4 (no spills at n4: 128 registers).

The unpacking (int4 two nibbles a LOP3, int8 a byte a PRMT) and the per-chunk sums are
lamina/kernels/wna16_words.py's. Per 4-word chunk (inside one quantization group) and row:

    acc += s * (sum_k (BASE + u[k]) x[k] - (BASE + OFFSET + z) * sum_k x[k])        BASE 128 / 32768

sm_90 SASS (ahead of time, scripts/wna16_gemv_variants.py --sass): 24-27 instructions per int4 word, 12.0 per
int8 word (15.5 with shifts and LOP3s instead of PRMTs), against ~54 for lamina.kernels.wna16_gemv (which converts
x's layout through shared memory). The engine's form (n4, prefetch, split; naive int8's sign XOR) at 1 / 2 / 4
rows: int4 30.6 / 42.4 / 68.4 a word, int8 16.3 / 22.9 / 35.9.

Split K (grid (cdiv(N, BLOCK_N), split), split a runtime argument: one compile for every count > 1): program
(i, j) walks the j-th of `split` runs of whole tiles (a run past K adds zeros) and writes fp32 partials to a
workspace [split, M, N]; an int32 counter per row block counts arrivals (acq_rel atomic), and the last program
of the block adds the partials in split order (deterministic) with the bias, stores the output and re-zeroes
the counter. One launch, no host sync: capturable in a CUDA graph. The workspace is cached per (device, M * N,
split, blocks) and must be allocated outside graph capture: lamina runs every step eagerly before capturing it
(lamina.graphs.capture), which allocates it; a missing one inside a capture raises. One stream at a time per
workspace (the layers of a model run one after another). Importing this module imports triton
(lamina.quant.wna16 imports it lazily, on the first CUDA call).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from lamina.kernels import pdl
from lamina.kernels.pdl import compiled
from lamina.kernels.wna16_gemv import CHANNEL_GROUP, INTERPRETER_SMS, check_inputs, num_sms
from lamina.kernels.wna16_words import MAGIC4, MAGIC8, columns4, dot_words, i2f, load_x

CHUNK_WORDS = 4  # words per thread and row per load (16 bytes): a chunk lies inside one quantization group
PROGRAMS_PER_SM = 10  # split K until about this many programs per SM ...
MIN_SPLIT_TILES = 2  # ... each split walking at least this many tiles
MAX_M = 4  # rows of x: each weight word is unpacked once for all of them (x's pairs take 16 registers a row at 4 bits)


def takes(x_dtype: torch.dtype, rows: int, k: int, num_bits: int, group_size: int | None) -> bool:
    """Whether wna16_row_gemv takes these operands: bf16 x of 1..MAX_M rows, K a whole number of words, and the
    group size (None: per channel) a multiple of one chunk's values (32 at 4 bits, 16 at 8)."""
    if x_dtype != torch.bfloat16 or not 1 <= rows <= MAX_M or num_bits not in (4, 8):
        return False
    per_word = 32 // num_bits
    return k > 0 and k % per_word == 0 and (group_size is None or group_size % (CHUNK_WORDS * per_word) == 0)


@dataclass(frozen=True)
class WNA16RowConfig:
    block_n: int  # rows per program (power of two)
    num_warps: int = 1
    block_kw: int = 128  # words per tile (power of two >= 4); 128 * num_warps: one 16-byte load per thread and row
    split: int = 1  # programs along K (clamped to the tiles; runtime argument: no recompile)
    prefetch: bool = True  # load the next weight tile into registers before using this one

    def __post_init__(self) -> None:
        for name in ("block_n", "num_warps", "block_kw"):
            value = getattr(self, name)
            assert value >= 1 and value & (value - 1) == 0, f"{name} must be a power of two, got {value}"
        assert self.block_kw >= CHUNK_WORDS and self.split >= 1, f"bad config {self}"

    @property
    def name(self) -> str:
        return f"n{self.block_n}-w{self.num_warps}-kw{self.block_kw}-s{self.split}{'-pf' if self.prefetch else ''}"


@functools.lru_cache(maxsize=None)
def default_config(n: int, k: int, num_bits: int, sms: int = INTERPRETER_SMS) -> WNA16RowConfig:
    """4 rows, 1 warp, 128-word tiles, prefetch; K split by `auto_split`. The measured best family on the H200
    (Llama-3-8B shapes, int4 g128 and int8 per channel: benchmarks/results/2026-12-02-h200-gemv-variants.json,
    n4-w1-kw128): 132 SMs give split 1 for qkv, gate_up and the LM head, 2 for o_proj and down (int4 o_proj's 4
    tiles too: MIN_SPLIT_TILES 2). int4 at one row in 256-word tiles: faster alone, not in an engine step
    (docs/BENCHMARKS.md)."""
    return auto_split(WNA16RowConfig(4), n, k // (32 // num_bits), sms)


def auto_split(cfg: WNA16RowConfig, n: int, kw: int, sms: int) -> WNA16RowConfig:
    """cfg with K split by `split_count`."""
    return replace(cfg, split=split_count(triton.cdiv(n, cfg.block_n), triton.cdiv(kw, cfg.block_kw), sms))


def split_count(blocks: int, steps: int, sms: int) -> int:
    """Programs along K for `blocks` row blocks of `steps` K steps: until PROGRAMS_PER_SM programs per SM, each
    split at least MIN_SPLIT_TILES steps."""
    return max(1, min(triton.cdiv(PROGRAMS_PER_SM * sms, blocks), steps // MIN_SPLIT_TILES))


_WORKSPACES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def workspace(device: torch.device, n: int, split: int, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partials [split, n] and int32 counters [blocks], zeroed once (the kernel leaves them zeroed); cached
    per (device, n, split, blocks). Allocated outside CUDA graph capture (the module docstring)."""
    key = (device.type, device.index, n, split, blocks)
    if key not in _WORKSPACES:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"wna16_row_gemv: no split-K workspace for {key} during CUDA graph capture; "
                               "run the step once eagerly before capturing it")
        _WORKSPACES[key] = (torch.empty((split, n), dtype=torch.float32, device=device),
                            torch.zeros((blocks,), dtype=torch.int32, device=device))
    return _WORKSPACES[key]


@triton.jit
def _load_tiles(w_ptr, rptr, stride_wn, kw0, cols, limit, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                SCALAR_MASK: tl.constexpr):
    """The tile's words of each of the BLOCK_N rows (a tuple); words at or past `limit` read 0 when MASKED."""
    tiles = ()
    for r in tl.static_range(BLOCK_N):
        ptrs = w_ptr + rptr[r] * stride_wn + kw0 + cols
        if not MASKED:
            w = tl.load(ptrs, eviction_policy="evict_first")
        elif SCALAR_MASK:  # whole tiles: one predicate, the 16-byte loads stay vectorised
            w = tl.load(ptrs, mask=(kw0 < limit) & (cols >= 0), other=0, eviction_policy="evict_first")
        else:
            w = tl.load(ptrs, mask=kw0 + cols < limit, other=0, eviction_policy="evict_first")
        tiles = tiles + (w,)
    return tiles


@triton.jit
def _finish(tots, rows, row_mask, b_ptr, out_ptr, stride_om, ws_ptr, cnt_ptr, N, split, block, M: tl.constexpr,
            HAS_BIAS: tl.constexpr, IS_SPLIT: tl.constexpr):
    """Store the fp32 sums tots[m] of x's row m (+ bias) as out's dtype. Split K: partials to ws[split index, m, N];
    the last program of the row block to arrive adds them in split order, adds the bias, stores, resets the
    counter."""
    bias = tl.zeros_like(tots[0])
    if not IS_SPLIT:
        if HAS_BIAS:
            bias = tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
        for m in tl.static_range(M):
            tl.store(out_ptr + m * stride_om + rows, (tots[m] + bias).to(out_ptr.dtype.element_ty), mask=row_mask)
    else:
        for m in tl.static_range(M):
            tl.store(ws_ptr + (tl.program_id(1) * M + m) * N + rows, tots[m], mask=row_mask)
        tl.debug_barrier()  # every thread's partials written before the release below
        done = tl.atomic_add(cnt_ptr + block, 1, sem="acq_rel")
        if done == split - 1:
            if HAS_BIAS:
                bias = tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
            for m in tl.static_range(M):
                total = tl.zeros_like(tots[m])
                for sp in range(split):
                    total += tl.load(ws_ptr + (sp * M + m) * N + rows, mask=row_mask, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + m * stride_om + rows, (total + bias).to(out_ptr.dtype.element_ty), mask=row_mask)
            tl.store(cnt_ptr + block, 0)


@triton.jit(do_not_specialize=["split"])  # one compile for every split count > 1
def _wna16_row_kernel(x_ptr, w_ptr, s_ptr, z_ptr, b_ptr, out_ptr, ws_ptr, cnt_ptr, N, KW, split,
                      stride_xm, stride_om, stride_wn, stride_sn, stride_zn, magic, m16,
                      BITS: tl.constexpr, XOR: tl.constexpr, GROUP_KW: tl.constexpr, HAS_ZERO: tl.constexpr,
                      HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_KW: tl.constexpr, IS_SPLIT: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr,
                      PRMT: tl.constexpr):
    """x_ptr: x as int32 bf16 pairs, M rows of K / 2 (row stride stride_xm pairs); GROUP_KW: words per quantization
    group (a multiple of 4). Rows past N are clamped for the loads, masked at the store; K tiles are masked only
    when BLOCK_KW does not divide KW. accs: item r * M + m is weight row r's sum with x's row m."""
    C: tl.constexpr = BLOCK_KW // 4  # 4-word chunks per tile
    PAIRS: tl.constexpr = 16 // BITS  # int32 pairs of x per word: 4 (int4) or 2 (int8)
    ZB: tl.constexpr = 136 if BITS == 4 else 32896  # BASE + OFFSET: 128 + 8 or 32768 + 128
    block = tl.program_id(0)
    row0 = block * BLOCK_N
    cols = tl.arange(0, BLOCK_KW)
    offs_c = tl.arange(0, C)
    x_offs = offs_c[:, None] * (4 * PAIRS) + tl.arange(0, 4)[None, :]  # 16 bytes of x per load and thread
    accs = ()
    rptr = ()
    for r in tl.static_range(BLOCK_N):
        for m in tl.static_range(M):
            accs = accs + (tl.zeros([C], dtype=tl.float32),)
        rptr = rptr + (tl.minimum(row0 + r, N - 1).to(tl.int64),)
    kw_len = tl.cdiv(tl.cdiv(KW, BLOCK_KW), split) * BLOCK_KW
    kw_lo = tl.program_id(1) * kw_len
    kw_hi = tl.minimum(KW, kw_lo + kw_len)
    if PREFETCH:
        cur = _load_tiles(w_ptr, rptr, stride_wn, kw_lo, cols, kw_hi, BLOCK_N, True, EVEN_K)
    pdl.wait(PDL)  # the first weight tile is on its way; x may be the kernel before's output
    for kw0 in range(kw_lo, kw_hi, BLOCK_KW):
        if PREFETCH:
            tiles = cur
            cur = _load_tiles(w_ptr, rptr, stride_wn, kw0 + BLOCK_KW, cols, kw_hi, BLOCK_N, True, EVEN_K)
        else:
            tiles = _load_tiles(w_ptr, rptr, stride_wn, kw0, cols, KW, BLOCK_N, not EVEN_K, False)
        xq, xs = load_x(x_ptr, stride_xm, kw0, KW, x_offs, offs_c, C, M, PAIRS, EVEN_K)
        g = (kw0 + offs_c * 4) // GROUP_KW
        gmask = kw0 + offs_c * 4 < KW
        new = ()
        for r in tl.static_range(BLOCK_N):
            w = tiles[r]
            if XOR != 0:
                w = w ^ XOR
            parts = dot_words(columns4(tl.reshape(w, (C, 4)), C), xq, magic, m16, C, M, BITS, PRMT)
            if EVEN_K:
                s = tl.load(s_ptr + rptr[r] * stride_sn + g).to(tl.float32)
            else:
                s = tl.load(s_ptr + rptr[r] * stride_sn + g, mask=gmask, other=0.0).to(tl.float32)
            if HAS_ZERO:
                if EVEN_K:
                    z = tl.load(z_ptr + rptr[r] * stride_zn + g)
                else:
                    z = tl.load(z_ptr + rptr[r] * stride_zn + g, mask=gmask, other=0)
                zb = i2f(z.to(tl.int32) + ZB)
                for m in tl.static_range(M):
                    new = new + (accs[r * M + m] + s * (parts[m] - zb * xs[m]),)
            else:
                for m in tl.static_range(M):
                    new = new + (accs[r * M + m] + s * (parts[m] - ZB * xs[m]),)
        accs = new
    pdl.launch_dependents(PDL)  # the weights are read: the next kernel may be placed
    ro = tl.arange(0, BLOCK_N)
    tots = ()
    for m in tl.static_range(M):
        tot = tl.zeros([BLOCK_N], dtype=tl.float32)
        for r in tl.static_range(BLOCK_N):
            tot = tl.where(ro == r, tl.sum(accs[r * M + m], axis=0), tot)
        tots = tots + (tot,)
    rows = row0 + ro
    _finish(tots, rows, rows < N, b_ptr, out_ptr, stride_om, ws_ptr, cnt_ptr, N, split, block, M, HAS_BIAS,
            IS_SPLIT)


def group_words(num_bits: int, group_size: int | None) -> int:
    """Words per quantization group (CHANNEL_GROUP: per channel); a multiple of CHUNK_WORDS (asserted)."""
    if group_size is None:
        return CHANNEL_GROUP
    per_word = 32 // num_bits
    assert group_size % (CHUNK_WORDS * per_word) == 0, \
        f"group size {group_size} must be a multiple of {CHUNK_WORDS * per_word} at {num_bits} bits"
    return group_size // per_word


def wna16_row_gemv(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None,
                   bias: torch.Tensor | None, num_bits: int, group_size: int | None, xor: int = 0,
                   config: WNA16RowConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M, K] bf16 (M <= MAX_M) @ dequantize(words, scale, zero_point).T (+ bias) -> [M, N] bf16 (`takes` says
    which operands). group_size None: strategy "channel" (scale [N, 1]). pdl: launch with programmatic
    dependent launch (lamina.kernels.pdl: the first weight tile loads before the wait)."""
    check_inputs(x, words, scale, zero_point, bias, num_bits)
    (m, k), (n, kw) = x.shape, words.shape
    assert x.dtype == torch.bfloat16 and 1 <= m <= MAX_M, \
        f"wna16_row_gemv takes 1..{MAX_M} bf16 rows, got {x.dtype} {tuple(x.shape)}"
    assert takes(x.dtype, m, k, num_bits, group_size), \
        f"wna16_row_gemv takes whole words of K and groups of whole 4-word chunks, got K {k}, group {group_size}"
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    cfg = config or default_config(n, k, num_bits, num_sms(x.device))
    if x.stride(-1) != 1 or x.stride(0) % 2 or x.data_ptr() % 4:  # read as int32 pairs: 4-byte aligned rows
        x = x.clone(memory_format=torch.contiguous_format)
    blocks = triton.cdiv(n, cfg.block_n)
    split = min(cfg.split, triton.cdiv(kw, cfg.block_kw))
    ws, cnt = workspace(x.device, m * n, split, blocks) if split > 1 else (out, out)  # never read unsplit
    z = scale if zero_point is None else zero_point  # never read without HAS_ZERO
    _wna16_row_kernel[(blocks, split)](
        x.view(torch.int32), words, scale, z, out if bias is None else bias, out, ws, cnt, n, kw, split,
        x.stride(0) // 2, out.stride(0), words.stride(0), scale.stride(0), z.stride(0),
        MAGIC4 if num_bits == 4 else MAGIC8, 65536,
        BITS=num_bits, XOR=xor, GROUP_KW=group_words(num_bits, group_size), HAS_ZERO=zero_point is not None,
        HAS_BIAS=bias is not None, EVEN_K=kw % cfg.block_kw == 0, M=m, BLOCK_N=cfg.block_n, BLOCK_KW=cfg.block_kw,
        IS_SPLIT=split > 1, PREFETCH=cfg.prefetch, PDL=pdl, PRMT=compiled(x), num_warps=cfg.num_warps, num_stages=1,
        launch_pdl=pdl)
    return out
