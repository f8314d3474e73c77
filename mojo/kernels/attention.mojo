"""Scaled dot-product attention with masks, forward and backward, in fp32 tiles of 64 tokens.

Tokens are rows of q [N, Hq·D], k and v [N, Hkv·D]. Query head h reads key/value head
h·Hkv/Hq (grouped-query attention). Each token t lies in a block [begin_t, end_t) given by
`spans` (int32 [N, 2]): its packed segment, or its whole sequence; a padding token's block is
empty. Spans are symmetric (t lies in the span of every token of its span). Query i sees the keys
[begin_i, hi_i), hi_i = end_i, or min(end_i, i + 1) when causal; key j is seen by the queries of its
span (those ≥ j when causal).

    s_ij = (q_i·k_j)·scale      p_ij = e^(s_ij − L_i)      L_i = log Σ_j e^(s_ij)      o_i = Σ_j p_ij v_j
    backward, with δ_i = dO_i·o_i:   dp_ij = dO_i·v_j      ds_ij = p_ij (dp_ij − δ_i)
    dq_i = scale Σ_j ds_ij k_j      dk_j = scale Σ_(h,i) ds_ij q_i      dv_j = Σ_(h,i) p_ij dO_i

The canonical order ("block-canonical"). Every dot product over d (q·k, dO·v, dO·o) is one fma chain
over d ascending from +0. The forward walks query i's keys in blocks of 64 aligned to the start of its
span, [begin_i + 64b, begin_i + 64b + 64) ∩ [begin_i, hi_i) for b = 0, 1, … (so a segment's result does
not depend on where it lies in the batch), an online softmax per block:
    m' = max(m, max_j s_ij)                 (m = −∞ before the first block; max is exact)
    p_ij = exp(s_ij − m'),  c = exp(m − m') with the portable exp
    l = l·c + Σ_block p_ij, the sum over the block's 64 slots (slot = j − begin_i − 64b, slots outside
        the keys +0) folded by halves: slot t + slot t+32, then +16, +8, +4, +2, +1
    o_d = o_d·c, then o_d = fma(p_ij, v_jd, o_d) for the block's keys j ascending
and ends with o = o/l, L = m + log l (o = 0 and L = 0 for a query that sees no key). The backward's
sums are plain fma chains from +0, over keys ascending for dq_i, over (head of the group ascending,
query ascending) for dk_j and dv_j; dq and dk are then multiplied by scale. A pair outside the mask
takes no part in any sum.

Every kernel but δ is a team kernel (`launch_teams`): a task is a tile of at most 64 consecutive tokens ×
one head (the 64 tokens from 64·i; or, given a tile table, `Attention.tile`, each run of tokens that share a span
cut into tiles from its first token, so that no tile walks the blocks of two spans: the bits are the same, since
every sum belongs to one query or one key), computed by a team of 256 threads (16 row groups tr × 16 column
groups tc): thread (tr, tc) owns the tile's rows 4tr … 4tr+3 and, of each 64-token block of the other side,
the score columns tc, tc+16, tc+32, tc+48, and the output columns W·tc … W·tc + W − 1 of each chunk of min(D, 64) dims
(W = min(D, 64)/16: 4, or 2 for D = 32, 1 for D = 16; for D = 8, 8 column groups of 1),
as in a SIMT GEMM. Operands are staged 64 tokens × 64 dims at a time in two shared panels; the
probabilities (or ds) of a block go back to a panel as the left operand of the output products. The
team's phases end at barriers; on the CPU one call plays all 256 threads phase by phase (`played`),
so both devices run the same operations in the same order (its products several threads of a row group
at a time, each as a vector lane: `team_score_products`, `team_output_products`). A block that no row of a thread can use is
skipped by that thread; a tile's forward walks each run of rows sharing a span separately, in the
blocks of that span.
Every attention kernel reads the one interface ATTENTION, by the names of `Attention`.

The backward's score gradients, kept. With a d_scores workspace (span_limit > 0), the dk/dv kernel, which
computes every ds_ij, writes each one that a query sees into the query's row of span_limit floats (a head each),
for the queries whose span has at most span_limit tokens (keep_score_gradients); the dq kernel then stages those
values into its panel (stage_score_gradients) instead of computing s, p and dp again: two of its three products.
They are the values query_weights computes, bit for bit (s and dp are the same fma chains with the operands of
each product swapped, p and ds the same operations), so dq keeps its bits; a query tile holding a query whose span
is longer computes them as before.
"""

from std.collections import Array
from std.math import fma
from max.gpu.memory import AddressSpace
from engine.device import F32Ptr, I32Ptr
from engine.launch import Args, Interface, sync
from engine.reduction import fma_dot
from engine import numerics

comptime HEAD_DIMS = (8, 16, 32, 64, 128)  # compiled head dimensions (exported to Python)
comptime TILE = 64  # tokens of a tile, and of a block of the other side (exported to Python)
comptime GROUPS = 16  # row groups of a team, and column groups
comptime TEAM = GROUPS * GROUPS  # threads of a team
comptime ROWS = 4  # rows of a thread: ROWS·tr + a
comptime COLS = 4  # score columns of a thread: tc + GROUPS·u
comptime LINE = TILE + 4  # floats of a line of a row panel: 64 rows, padded so that lines start in other banks
comptime PANEL = TILE * TILE  # floats of one staged column (or values) panel
comptime EXCHANGE_LINE = GROUPS + 4  # floats of a row of an exchange: 16 values, padded so that two row groups' rows
# fall in different banks
comptime EXCHANGE = TILE * EXCHANGE_LINE  # floats of a row exchange: a value per (row, column group)
comptime SCRATCH = TILE * LINE + PANEL + 2 * EXCHANGE  # shared floats of a team: a row panel, a column panel, two exchanges
comptime UNROLL = 8  # steps of the inner products unrolled


# Registers a thread of each team kernel keeps within, up to D = 64 (D = 128, twice the output sums, keeps 128):
# more teams a multiprocessor hide more of the barriers' and loads' latency, until the spills cost more. On the H200
# at the encoder's attention (bench/RESULTS.md, 2026-11-30 15:12 and 15:29) the forward and dq ran fastest at 64
# (4 teams), dk/dv at 80 (3 teams; at 64 its spills made it 29 % slower than at 80).
comptime FORWARD_REGISTERS = 64
comptime DKDV_REGISTERS = 80
comptime DQ_REGISTERS = 64


def teams_per_sm[D: Int](registers: Int) -> Int:
    """Teams of 256 threads meant to share a multiprocessor (the launch's hint to the compiler), so that a thread
    keeps within `registers` (for D ≤ 64; 128 for D = 128)."""
    return 65536 // (TEAM * (registers if D <= 64 else 128))


comptime ATTENTION = Interface(
    "o lse q k v spans d_out delta dq dk dv d_scores", "tokens heads kv_heads head_dim causal span_limit tiles",
    "scale"
)

comptime Vec = SIMD[DType.float32, 4]


struct Attention(ImplicitlyCopyable, Movable):
    """The operands of the attention kernels, by name. Rows: q, o, d_out, dq [N, Hq·D]; k, v, dk, dv
    [N, Hkv·D]; lse and delta [N, Hq]; spans int32 [N, 2]. The forward reads q, k, v, spans and writes o
    and lse; the backward also reads d_out and delta and writes the gradient its kernel computes. d_scores
    (absent when span_limit is 0) keeps ds_ij between the backward's two team kernels: query i's row of
    span_limit floats a head, for the queries whose span holds at most span_limit tokens (kept_row)."""

    var o: F32Ptr
    var lse: F32Ptr
    var q: F32Ptr
    var k: F32Ptr
    var v: F32Ptr
    var spans: I32Ptr
    var d_out: F32Ptr
    var delta: F32Ptr
    var dq: F32Ptr
    var dk: F32Ptr
    var dv: F32Ptr
    var d_scores: F32Ptr
    var tokens: Int
    var heads: Int
    var kv_heads: Int
    var head_dim: Int
    var causal: Bool
    var span_limit: Int
    var tiles: Int
    var scale: Float32

    @always_inline
    def __init__(out self, args: Args):
        self.o = args.f32(0)
        self.lse = args.f32(1)
        self.q = args.f32(2)
        self.k = args.f32(3)
        self.v = args.f32(4)
        self.spans = args.i32(5)
        self.d_out = args.f32(6)
        self.delta = args.f32(7)
        self.dq = args.f32(8)
        self.dk = args.f32(9)
        self.dv = args.f32(10)
        self.d_scores = args.f32(11)
        self.tokens = args.size(0)
        self.heads = args.size(1)
        self.kv_heads = args.size(2)
        self.head_dim = args.size(3)
        self.causal = args.flag(4)
        self.span_limit = args.size(5)
        self.tiles = args.size(6)
        self.scale = args.scalar(0)

    @always_inline
    def span(self, token: Int) -> Tuple[Int, Int]:
        return (Int(self.spans.unsafe_load(2 * token)), Int(self.spans.unsafe_load(2 * token + 1)))

    @always_inline
    def tile(self, index: Int) -> Tuple[Int, Int]:
        """The tokens [start, end) of tile `index` (at most TILE): with a tile table (`tiles` > 0) its entry, which
        the spans' allocation holds after the tokens' spans (kernels.attention_tiles: each run of tokens sharing a
        span cut from its first token); else the TILE tokens from TILE·index."""
        if self.tiles > 0:
            var entry = 2 * (self.tokens + index)
            return (Int(self.spans.unsafe_load(entry)), Int(self.spans.unsafe_load(entry + 1)))
        return (index * TILE, min(index * TILE + TILE, self.tokens))

    @always_inline
    def keys_of(self, token: Int) -> Tuple[Int, Int]:
        """The keys [begin, end) query token sees (empty for padding)."""
        var span = self.span(token)
        return (span[0], min(span[1], token + 1) if self.causal else span[1])

    @always_inline
    def queries_of(self, token: Int) -> Tuple[Int, Int]:
        """The queries [begin, end) that see key token (empty for padding)."""
        var span = self.span(token)
        return (max(span[0], token) if self.causal else span[0], span[1])

    @always_inline
    def keeps_scores_of(self, query: Int) -> Bool:
        """Whether d_scores keeps the ds of query `query` (a token below `tokens`): span_limit is set and the
        query's span has at most span_limit tokens."""
        var span = self.span(query)
        return self.span_limit > 0 and span[1] - span[0] <= self.span_limit

    @always_inline
    def kept_row(self, query: Int, head: Int) -> KeptRow:
        """Where d_scores keeps the ds of query `query` (below `tokens`) at `head`: its row of span_limit floats,
        each key the query sees at its offset from the start of the query's span; none where keeps_scores_of is
        false."""
        var keys = self.keys_of(query)
        if not self.keeps_scores_of(query):
            return KeptRow(0, 0, 0)
        return KeptRow((query * self.heads + head) * self.span_limit - self.span(query)[0], keys[0], keys[1])


@fieldwise_init
struct KeptRow(ImplicitlyCopyable, Movable):
    """One query's row of d_scores at one head: key j's ds at slot origin + j, for the keys [low, high) it sees."""

    var origin: Int
    var low: Int
    var high: Int

    @always_inline
    def slot(self, key: Int) -> Int:
        """Where the row keeps key `key`'s ds, or −1 where it keeps none."""
        return self.origin + key if self.low <= key and key < self.high else -1


# ---- sizes per head dimension ---------------------------------------------------------------------------

@always_inline
def chunk_of[D: Int]() -> Int:
    """Dims staged at once: D, or 64 (D = 128 goes in two chunks)."""
    return min(D, TILE)


@always_inline
def lanes_of[D: Int]() -> Int:
    """Column groups that own output columns (8 for D = 8, else 16)."""
    return min(chunk_of[D](), GROUPS)


@always_inline
def width_of[D: Int]() -> Int:
    """Output columns of a thread per chunk."""
    return chunk_of[D]() // lanes_of[D]()


comptime Outputs[D: Int] = Array[Array[SIMD[DType.float32, width_of[D]()], ROWS], D // chunk_of[D]()]


struct Thread[D: Int](Copyable, Movable):
    """What one thread of a team keeps between phases: its output sums, two 4 × 4 score tiles, and for
    each of its rows the tokens [low, high) of the other side it pairs with and three row values
    (forward: running max, running sum, rescale; dq: lse, δ)."""

    var acc: Outputs[Self.D]
    var acc2: Outputs[Self.D]
    var s: Array[Vec, ROWS]
    var t: Array[Vec, ROWS]
    var low: SIMD[DType.int32, ROWS]
    var high: SIMD[DType.int32, ROWS]
    var m: Vec
    var l: Vec
    var c: Vec

    def __init__(out self):
        comptime W = width_of[Self.D]()
        var zero_rows = Array[SIMD[DType.float32, W], ROWS](fill=SIMD[DType.float32, W](0))
        self.acc = Outputs[Self.D](fill=zero_rows)
        self.acc2 = Outputs[Self.D](fill=zero_rows)
        self.s = Array[Vec, ROWS](fill=Vec(0))
        self.t = Array[Vec, ROWS](fill=Vec(0))
        self.low = SIMD[DType.int32, ROWS](0)
        self.high = SIMD[DType.int32, ROWS](0)
        self.m = Vec(-numerics.INF)
        self.l = Vec(0)
        self.c = Vec(1)

    @always_inline
    def overlaps(self, base: Int) -> Bool:
        """Whether any of the thread's rows pairs with a token of block [base, base + TILE)."""
        var found = False
        comptime for a in range(ROWS):
            found = found or max(Int(self.low[a]), base) < min(Int(self.high[a]), base + TILE)
        return found

    @always_inline
    def covers(self, base: Int) -> Bool:
        """Whether every row of the thread pairs with every token of block [base, base + TILE)."""
        var every = True
        comptime for a in range(ROWS):
            every = every and Int(self.low[a]) <= base and Int(self.high[a]) >= base + TILE
        return every

    @always_inline
    def pairs(self, a: Int, base: Int, k: Int) -> Bool:
        """Whether row a pairs with token base + k."""
        return Int(self.low[a]) <= base + k and base + k < Int(self.high[a])

    @always_inline
    def pairs_columns(self, a: Int, base: Int, tc: Int) -> SIMD[DType.bool, COLS]:
        """Whether row a pairs with each of the thread's columns: tokens base + tc + GROUPS·u."""
        var k = SIMD[DType.int32, COLS](0, GROUPS, 2 * GROUPS, 3 * GROUPS) + Int32(base + tc)
        return k.ge(self.low[a]) & k.lt(self.high[a])


# ---- team steps ----------------------------------------------------------------------------------------

@always_inline
def slot_position(slot: Int) -> Int:
    """Where slot `slot` lies in a line of a column panel: column group tc reads slots tc, tc+16, tc+32 and
    tc+48 as one 4-vector."""
    return 4 * (slot & 15) + (slot >> 4)


@always_inline
def stage_lines[C: Int, columns: Bool, space: AddressSpace](
    panel: Pointer[Float32, MutUntrackedOrigin, address_space=space], source: F32Ptr, stride: Int, offset: Int,
    first: Int, tokens: Int, tid: Int,
):
    """Thread tid's share of panel[d][token] for dims [offset, offset + C) of tokens first … first + 63 (token t's
    vector at source[t·stride + offset …]): a row panel (lines of LINE) or a column panel (slot positions);
    tokens at or past `tokens` read as 0. A warp's 32 lanes take 32 tokens whose places in a line fall in distinct
    banks: consecutive tokens in a row panel; in a column panel, tokens whose slot positions differ mod 32
    (bit 3 of the token from the warp, its other bits from the lane)."""
    comptime QUADS = C // 4
    var lane = tid % TILE
    var token = lane
    comptime if columns:
        token = (lane & 7) | ((lane & 32) >> 2) | ((lane & 24) << 1)
    var t = first + token
    comptime for g in range((QUADS + 3) // 4):
        var quad = tid // TILE + 4 * g
        if quad < QUADS:
            var value = Vec(0)
            if t < tokens:
                value = source.unsafe_load[width=4, alignment=16](t * stride + offset + 4 * quad)
            comptime for i in range(4):
                var k = 4 * quad + i
                comptime if columns:
                    panel.unsafe_store(k * TILE + slot_position(token), value[i])
                else:
                    panel.unsafe_store(k * LINE + token, value[i])


@always_inline
def stage_values[C: Int, space: AddressSpace](
    panel: Pointer[Float32, MutUntrackedOrigin, address_space=space], source: F32Ptr, stride: Int, offset: Int,
    first: Int, tokens: Int, tid: Int,
):
    """Thread tid's share of panel[token][d] (tokens as lines) for dims [offset, offset + C) of tokens first … first + 63."""
    comptime QUADS = C // 4
    comptime PER_PASS = TEAM // QUADS
    var quad = tid % QUADS
    comptime for g in range((TILE + PER_PASS - 1) // PER_PASS):
        var token = tid // QUADS + PER_PASS * g
        if token < TILE:
            var t = first + token
            var value = Vec(0)
            if t < tokens:
                value = source.unsafe_load[width=4, alignment=16](t * stride + offset + 4 * quad)
            panel.unsafe_store[width=4, alignment=16](token * C + 4 * quad, value)


@always_inline
def score_products[C: Int, space: AddressSpace](
    mut acc: Array[Vec, ROWS], rows: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    columns: Pointer[Float32, MutUntrackedOrigin, address_space=space], tr: Int, tc: Int,
):
    """acc[a][u] = fma(rows[d][4tr + a], columns[d][tc + 16u], acc[a][u]) for d ascending over the chunk."""
    comptime STEP = min(C, UNROLL)
    for d0 in range(0, C, STEP):
        comptime for dd in range(STEP):
            var d = d0 + dd
            var r = rows.unsafe_load[width=4, alignment=16](d * LINE + 4 * tr)
            var c = columns.unsafe_load[width=4, alignment=16](d * TILE + 4 * tc)
            comptime for a in range(ROWS):
                acc[a] = Vec(r[a]).fma(c, acc[a])


@always_inline
def output_products[D: Int, masked: Bool, space: AddressSpace](
    mut acc: Array[SIMD[DType.float32, width_of[D]()], ROWS],
    weights: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    values: Pointer[Float32, MutUntrackedOrigin, address_space=space], low: SIMD[DType.int32, ROWS],
    high: SIMD[DType.int32, ROWS], tr: Int, tc: Int,
):
    """acc[a] = fma(weights[k][4tr + a], values[k][tc·W …], acc[a]) for k ascending over the block's 64 tokens;
    masked: only for the k that row a pairs with (low[a] ≤ k < high[a], relative to the block)."""
    comptime C = chunk_of[D]()
    comptime W = width_of[D]()
    for k0 in range(0, TILE, UNROLL):
        comptime for kk in range(UNROLL):
            var k = k0 + kk
            var w = weights.unsafe_load[width=4, alignment=16](k * LINE + 4 * tr)
            var v = values.unsafe_load[width=W, alignment=4 * W](k * C + tc * W)
            comptime for a in range(ROWS):
                var next = SIMD[DType.float32, W](w[a]).fma(v, acc[a])
                comptime if masked:
                    if UInt32(Int32(k) - low[a]) < UInt32(max(high[a] - low[a], 0)):  # low[a] ≤ k < high[a]
                        acc[a] = next
                else:
                    acc[a] = next


@always_inline
def write_weights[space: AddressSpace](
    panel: Pointer[Float32, MutUntrackedOrigin, address_space=space], weights: Array[Vec, ROWS], tr: Int, tc: Int
):
    """A thread's 4 × 4 tile of weights into a row panel, line k = its column tc + 16u, as the left operand of
    output_products."""
    comptime for u in range(COLS):
        var line = Vec(weights[0][u], weights[1][u], weights[2][u], weights[3][u])
        panel.unsafe_store[width=4, alignment=16]((tc + GROUPS * u) * LINE + 4 * tr, line)


# ---- the CPU's products: several threads of a row group at once --------------------------------------------
# On the CPU one call plays the whole team (`played` = TEAM, first thread 0), and a thread's 4-lane sums leave
# half of a vector register idle. The threads of one row group share their rows, so their mask (low, high, and
# so `overlaps` and `covers`), and their operands lie side by side in the panels: column groups tc … tc+3 read
# 16 consecutive floats of a column panel line, and the column groups that own output columns read consecutive
# values. So the CPU runs several threads of a row group as the lanes of wider vectors, each lane the same fma
# chain, in the same order, as the thread's own lane in score_products and output_products.

comptime CPU_SCORE_THREADS = 4  # threads whose 4 score columns make 16 consecutive floats of a column panel line


@always_inline
def gathered[W: Int, N: Int, played: Int, D: Int, second: Bool, c: Int](
    team: Array[Thread[D], played], first: Int, a: Int
) -> SIMD[DType.float32, N * W]:
    """Row a of the output sums (acc, or acc2 when `second`) of chunk c of threads first … first + N − 1, side by
    side."""
    var joined = SIMD[DType.float32, N * W](0)
    comptime for j in range(N):
        comptime if second:
            joined = joined.insert[offset = j * W](rebind[SIMD[DType.float32, W]](team[first + j].acc2[c][a]))
        else:
            joined = joined.insert[offset = j * W](rebind[SIMD[DType.float32, W]](team[first + j].acc[c][a]))
    return joined


@always_inline
def team_score_products[C: Int, second: Bool, D: Int, played: Int, space: AddressSpace](
    mut team: Array[Thread[D], played], base: Int, rows: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    columns: Pointer[Float32, MutUntrackedOrigin, address_space=space],
):
    """score_products for every thread of the team that pairs with the block, CPU_SCORE_THREADS threads at once
    (their 16 columns as 16 lanes); each lane is its thread's chain over d ascending."""
    comptime assert played == TEAM, "the CPU plays the whole team"
    comptime N = CPU_SCORE_THREADS
    for tr in range(GROUPS):
        if not team[tr * GROUPS].overlaps(base):
            continue
        for tc in range(0, GROUPS, N):
            var first = tr * GROUPS + tc
            var acc = Array[SIMD[DType.float32, N * COLS], ROWS](fill=SIMD[DType.float32, N * COLS](0))
            comptime for a in range(ROWS):
                comptime for j in range(N):
                    comptime if second:
                        acc[a] = acc[a].insert[offset = j * COLS](team[first + j].t[a])
                    else:
                        acc[a] = acc[a].insert[offset = j * COLS](team[first + j].s[a])
            for d in range(C):
                var r = rows.unsafe_load[width=4, alignment=16](d * LINE + 4 * tr)
                var cols = columns.unsafe_load[width = N * COLS, alignment=16](d * TILE + 4 * tc)
                comptime for a in range(ROWS):
                    acc[a] = SIMD[DType.float32, N * COLS](r[a]).fma(cols, acc[a])
            comptime for a in range(ROWS):
                comptime for j in range(N):
                    comptime if second:
                        team[first + j].t[a] = acc[a].slice[COLS, offset = j * COLS]()
                    else:
                        team[first + j].s[a] = acc[a].slice[COLS, offset = j * COLS]()


@always_inline
def keys_products[V: Int, C: Int, W: Int, masked: Bool, space: AddressSpace](
    mut acc: Array[SIMD[DType.float32, V], ROWS], weights: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    values: Pointer[Float32, MutUntrackedOrigin, address_space=space], k_begin: Int, k_end: Int,
    low: SIMD[DType.int32, ROWS], high: SIMD[DType.int32, ROWS], tr: Int, tc: Int,
):
    """acc[a] = fma(weights[k][4tr + a], values[k][tc·W … tc·W + V − 1], acc[a]) for k in [k_begin, k_end)
    ascending; masked: row a only for the k it pairs with (a select: the other k leave its lanes as they are)."""
    for k in range(k_begin, k_end):
        var w = weights.unsafe_load[width=4, alignment=16](k * LINE + 4 * tr)
        var v = values.unsafe_load[width=V, alignment = 4 * W](k * C + tc * W)
        comptime for a in range(ROWS):
            var next = SIMD[DType.float32, V](w[a]).fma(v, acc[a])
            comptime if masked:
                acc[a] = next if Int32(k) >= low[a] and Int32(k) < high[a] else acc[a]
            else:
                acc[a] = next


@always_inline
def team_output_products[D: Int, second: Bool, c: Int, played: Int, space: AddressSpace](
    mut team: Array[Thread[D], played], base: Int, weights: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    values: Pointer[Float32, MutUntrackedOrigin, address_space=space],
):
    """output_products for chunk c of every thread of the team that owns output columns and pairs with the block,
    the owners of 16 consecutive output columns at once (8 for D = 8). Each lane is its thread's chain over k
    ascending. The k that every row pairs with run unmasked; on either side of them, a row's k outside its
    mask leave its lanes as they are (a select, where a thread skips the fma), and the k that no row pairs with
    are not visited."""
    comptime assert played == TEAM, "the CPU plays the whole team"
    comptime C = chunk_of[D]()
    comptime W = width_of[D]()
    comptime N = min(lanes_of[D](), 16 // W)  # threads at once
    comptime V = N * W
    for tr in range(GROUPS):
        var leader = tr * GROUPS
        if not team[leader].overlaps(base):
            continue
        var low = team[leader].low - Int32(base)
        var high = team[leader].high - Int32(base)
        # [k_begin, k_end): the keys some row pairs with; [every_begin, every_end) ⊆ it: those every row pairs with
        var k_begin = TILE
        var k_end = 0
        var every_begin = 0
        var every_end = TILE
        comptime for a in range(ROWS):
            var row_begin = max(Int(low[a]), 0)
            var row_end = min(Int(high[a]), TILE)
            if row_begin < row_end:
                k_begin = min(k_begin, row_begin)
                k_end = max(k_end, row_end)
            every_begin = max(every_begin, row_begin)
            every_end = min(every_end, row_end)
        if every_begin >= every_end:
            every_begin = k_end
            every_end = k_end
        for tc in range(0, lanes_of[D](), N):
            var first = leader + tc
            var acc = Array[SIMD[DType.float32, V], ROWS](fill=SIMD[DType.float32, V](0))
            comptime for a in range(ROWS):
                acc[a] = gathered[W, N, played, D, second, c](team, first, a)
            keys_products[V, C, W, True](acc, weights, values, k_begin, every_begin, low, high, tr, tc)
            keys_products[V, C, W, False](acc, weights, values, every_begin, every_end, low, high, tr, tc)
            keys_products[V, C, W, True](acc, weights, values, every_end, k_end, low, high, tr, tc)
            comptime for a in range(ROWS):
                comptime for j in range(N):
                    var part = rebind[SIMD[DType.float32, width_of[D]()]](acc[a].slice[W, offset = j * W]())
                    comptime if second:
                        team[first + j].acc2[c][a] = part
                    else:
                        team[first + j].acc[c][a] = part


@always_inline
def block_products[D: Int, second: Bool, played: Int, space: AddressSpace](
    mut team: Array[Thread[D], played], first: Int, base: Int,
    weights: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    values: Pointer[Float32, MutUntrackedOrigin, address_space=space], source: F32Ptr, stride: Int, offset: Int,
    tokens: Int,
):
    """Every thread's output sums (acc, or acc2 when `second`) += the weights panel times the block's values of
    `source` (tokens base …, dims offset …), one chunk of dims at a time; the values of the first chunk must
    already be staged."""
    comptime C = chunk_of[D]()
    comptime for c in range(D // C):
        comptime if c > 0:
            for p in range(played):
                stage_values[C](values, source, stride, offset + c * C, base, tokens, first + p)
            sync[played]()
        comptime if played > 1:
            team_output_products[D, second, c](team, base, weights, values)
            continue
        for p in range(played):
            var tid = first + p
            var tr = tid // GROUPS
            var tc = tid % GROUPS
            if tc < lanes_of[D]() and team[p].overlaps(base):
                var full = team[p].covers(base)
                comptime if second:
                    if full:
                        output_products[D, False](team[p].acc2[c], weights, values, team[p].low - Int32(base), team[p].high - Int32(base), tr, tc)
                    else:
                        output_products[D, True](team[p].acc2[c], weights, values, team[p].low - Int32(base), team[p].high - Int32(base), tr, tc)
                else:
                    if full:
                        output_products[D, False](team[p].acc[c], weights, values, team[p].low - Int32(base), team[p].high - Int32(base), tr, tc)
                    else:
                        output_products[D, True](team[p].acc[c], weights, values, team[p].low - Int32(base), team[p].high - Int32(base), tr, tc)
        sync[played]()


@always_inline
def block_scores[D: Int, second: Bool, played: Int, space: AddressSpace](
    mut team: Array[Thread[D], played], first: Int, base: Int,
    rows: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    columns: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    row_source: F32Ptr, row_stride: Int, row_offset: Int, row_first: Int,
    column_source: F32Ptr, column_stride: Int, column_offset: Int, tokens: Int,
):
    """Every thread's score tile (s, or t when `second`) = the dot products of the tile's rows (tokens
    row_first …) with the block's columns (tokens base …), one fma chain over d from +0."""
    comptime C = chunk_of[D]()
    comptime for c in range(D // C):
        for p in range(played):
            var tid = first + p
            comptime if c == 0:
                comptime if second:
                    team[p].t = Array[Vec, ROWS](fill=Vec(0))
                else:
                    team[p].s = Array[Vec, ROWS](fill=Vec(0))
            stage_lines[C, False](rows, row_source, row_stride, row_offset + c * C, row_first, tokens, tid)
            stage_lines[C, True](columns, column_source, column_stride, column_offset + c * C, base, tokens, tid)
        sync[played]()
        comptime if played > 1:
            team_score_products[C, second](team, base, rows, columns)
            sync[played]()
            continue
        for p in range(played):
            var tid = first + p
            if team[p].overlaps(base):
                comptime if second:
                    score_products[C](team[p].t, rows, columns, tid // GROUPS, tid % GROUPS)
                else:
                    score_products[C](team[p].s, rows, columns, tid // GROUPS, tid % GROUPS)
        sync[played]()


@always_inline
def store_outputs[D: Int](acc: Outputs[D], destination: F32Ptr, factor: Float32, scaled: Bool, tc: Int, a: Int):
    """Row a of a thread's output sums (times factor when `scaled`) into its columns of the row at destination."""
    comptime C = chunk_of[D]()
    comptime W = width_of[D]()
    comptime for c in range(D // C):
        var value = acc[c][a]
        if scaled:
            value = value * factor
        destination.unsafe_store[width=W, alignment=4 * W](c * C + tc * W, value)


# ---- forward: o and lse per (query tile, head) -----------------------------------------------------------

@always_inline
def forward_maxima[D: Int, space: AddressSpace](
    mut thread: Thread[D], tid: Int, base: Int, scale: Float32,
    maxima: Pointer[Float32, MutUntrackedOrigin, address_space=space],
):
    """Scale the block's scores, −∞ outside the mask; each row's maximum over the thread's columns to `maxima`."""
    if not thread.overlaps(base):
        return
    var tr = tid // GROUPS
    var tc = tid % GROUPS
    comptime for a in range(ROWS):
        var m = -numerics.INF
        comptime for u in range(COLS):
            var s = thread.s[a][u] * scale
            if not thread.pairs(a, base, tc + GROUPS * u):
                s = -numerics.INF
            thread.s[a][u] = s
            m = s if s > m else m
        maxima.unsafe_store((ROWS * tr + a) * EXCHANGE_LINE + tc, m)


@always_inline
def forward_weights[D: Int, space: AddressSpace](
    mut thread: Thread[D], tid: Int, base: Int, maxima: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    sums: Pointer[Float32, MutUntrackedOrigin, address_space=space],
    panel: Pointer[Float32, MutUntrackedOrigin, address_space=space],
):
    """The rows' new maxima, the block's p = exp(s − m') into the panel, each row's partial Σp to `sums`."""
    if not thread.overlaps(base):
        return
    var tr = tid // GROUPS
    var tc = tid % GROUPS
    comptime for a in range(ROWS):
        var line = maxima.unsafe_offset((ROWS * tr + a) * EXCHANGE_LINE)
        var m_block = -numerics.INF
        comptime for g in range(GROUPS):
            var x = line.unsafe_load(g)
            m_block = x if x > m_block else m_block
        var m = thread.m[a]
        var m_new = m_block if m_block > m else m
        thread.c[a] = numerics.exp(m - m_new) if m_new != -numerics.INF else Float32(1)
        thread.m[a] = m_new
        var s = thread.s[a]
        thread.s[a] = s.eq(-numerics.INF).select(Vec(0), numerics.exp(s - m_new))  # the 4 columns as 4 lanes
        var p = thread.s[a]
        # slots tc + 16u: slot t + t+32 (u0 + u2, u1 + u3), then + t+16; the column groups fold in forward_values
        sums.unsafe_store((ROWS * tr + a) * EXCHANGE_LINE + tc, (p[0] + p[2]) + (p[1] + p[3]))
    write_weights(panel, thread.s, tr, tc)


@always_inline
def forward_rescale[D: Int, space: AddressSpace](
    mut thread: Thread[D], tid: Int, base: Int, sums: Pointer[Float32, MutUntrackedOrigin, address_space=space]
):
    """l = l·c + the block's Σp (column groups folded by halves: +8, +4, +2, +1), and o = o·c."""
    if not thread.overlaps(base):
        return
    var tr = tid // GROUPS
    comptime for a in range(ROWS):
        var g16 = sums.unsafe_offset((ROWS * tr + a) * EXCHANGE_LINE).unsafe_load[width=16, alignment=16](0)
        var g8 = g16.slice[8, offset=0]() + g16.slice[8, offset=8]()
        var g4 = g8.slice[4, offset=0]() + g8.slice[4, offset=4]()
        var g2 = g4.slice[2, offset=0]() + g4.slice[2, offset=2]()
        var c = thread.c[a]
        thread.l[a] = thread.l[a] * c + (g2[0] + g2[1])
        comptime for chunk in range(D // chunk_of[D]()):
            thread.acc[chunk][a] = thread.acc[chunk][a] * c


def attention_forward[D: Int, played: Int, space: AddressSpace](
    task: Int, first: Int, args: Args, scratch: Pointer[Float32, MutUntrackedOrigin, address_space=space]
):
    """Task (query tile, head): o and lse of its queries (at most 64)."""
    var at = Attention(args)
    var start, tile_end = at.tile(task // at.heads)
    var head = task % at.heads
    var kv = head * at.kv_heads // at.heads
    var rows = scratch
    var columns = scratch.unsafe_offset(TILE * LINE)
    var maxima = columns.unsafe_offset(PANEL)
    var sums = maxima.unsafe_offset(EXCHANGE)
    var q_stride = at.heads * D
    var kv_stride = at.kv_heads * D
    var team = Array[Thread[D], played](fill=Thread[D]())
    var row = 0
    while start + row < tile_end:
        # a run: the rows [row, end) that share one span
        var span = at.span(start + row)
        var end = row + 1
        while start + end < tile_end:
            var next = at.span(start + end)
            if next[0] != span[0] or next[1] != span[1]:
                break
            end += 1
        if span[0] < span[1]:
            var last = min(span[1], start + end) if at.causal else span[1]  # past the last key a row of the run sees
            for p in range(played):
                var tr = (first + p) // GROUPS
                comptime for a in range(ROWS):
                    var r = ROWS * tr + a
                    var inside = row <= r and r < end
                    var high = min(span[1], start + r + 1) if at.causal else span[1]
                    team[p].low[a] = Int32(span[0]) if inside else Int32(0)
                    team[p].high[a] = Int32(high) if inside else Int32(0)
            var base = span[0]
            while base < last:
                block_scores[D, False](team, first, base, rows, columns, at.q, q_stride, head * D, start,
                                       at.k, kv_stride, kv * D, at.tokens)
                for p in range(played):
                    forward_maxima(team[p], first + p, base, at.scale, maxima)
                sync[played]()
                for p in range(played):
                    forward_weights(team[p], first + p, base, maxima, sums, rows)
                    stage_values[chunk_of[D]()](columns, at.v, kv_stride, kv * D, base, at.tokens, first + p)
                sync[played]()
                for p in range(played):
                    forward_rescale(team[p], first + p, base, sums)
                block_products[D, False](team, first, base, rows, columns, at.v, kv_stride, kv * D, at.tokens)
                base += TILE
        row = end
    for p in range(played):
        var tid = first + p
        var tr = tid // GROUPS
        var tc = tid % GROUPS
        if tc < lanes_of[D]():
            comptime for a in range(ROWS):
                var t = start + ROWS * tr + a
                if t < tile_end:
                    var task_row = t * at.heads + head
                    var l = team[p].l[a]
                    comptime C = chunk_of[D]()
                    comptime W = width_of[D]()
                    comptime for c in range(D // C):
                        var value = team[p].acc[c][a] / l if l != 0 else SIMD[DType.float32, W](0)
                        at.o.unsafe_offset(task_row * D).unsafe_store[width=W, alignment=4 * W](c * C + tc * W, value)
                    if tc == 0:
                        # l = 0: the query sees no key; a NaN l (a non-finite score) propagates
                        at.lse.unsafe_store(task_row, team[p].m[a] + numerics.log(l) if l != 0 else Float32(0))


# ---- backward ---------------------------------------------------------------------------------------------

def attention_backward_delta(task: Int, args: Args):
    """δ = dO·o per (token, head): an index kernel."""
    var at = Attention(args)
    var D = at.head_dim
    at.delta.unsafe_store(task, fma_dot(at.d_out.unsafe_offset(task * D), at.o.unsafe_offset(task * D), D))


@always_inline
def key_weights[D: Int, space: AddressSpace](
    mut thread: Thread[D], tid: Int, base: Int, head: Int, at: Attention,
    panel: Pointer[Float32, MutUntrackedOrigin, address_space=space],
):
    """From the block's scores s and dp (rows: keys, columns: queries): p = exp(s·scale − L) into s and the
    panel, ds = p·(dp − δ) into t; 0 outside the mask."""
    if not thread.overlaps(base):
        return
    var tr = tid // GROUPS
    var tc = tid % GROUPS
    var lse = Vec(0)  # of the thread's 4 query columns, as 4 lanes
    var delta = Vec(0)
    comptime for u in range(COLS):
        var i = base + tc + GROUPS * u
        if i < at.tokens:
            lse[u] = at.lse.unsafe_load(i * at.heads + head)
            delta[u] = at.delta.unsafe_load(i * at.heads + head)
    comptime for a in range(ROWS):
        var seen = thread.pairs_columns(a, base, tc)
        var p = numerics.exp(thread.s[a] * at.scale - lse)
        thread.s[a] = seen.select(p, Vec(0))
        thread.t[a] = seen.select(p * (thread.t[a] - delta), Vec(0))
    write_weights(panel, thread.s, tr, tc)


@always_inline
def keep_score_gradients[space: AddressSpace](
    panel: Pointer[Float32, MutUntrackedOrigin, address_space=space], at: Attention, head: Int, start: Int,
    end: Int, base: Int, tid: Int,
):
    """Thread tid's share of the block's ds, from the row panel as write_weights left it in dk/dv (lines: queries
    base …, positions: the tile's keys start … end − 1), into d_scores (kept_row: each pair a query sees, of the
    queries whose ds it keeps; the keys past the tile are another tile's, whose rows no thread wrote here). Warp w
    takes the lines 8w … 8w + 7, lane l the keys l and l + 32 of each: a warp reads 32 consecutive floats of a line
    and writes 32 consecutive floats of a query's row, and finds each query's span once."""
    var lane = tid % 32
    comptime for m in range(TILE * TILE // TEAM // 2):
        var line = 8 * (tid // 32) + m
        var query = base + line
        if query < at.tokens:
            var row = at.kept_row(query, head)
            comptime for half in range(2):
                var position = lane + 32 * half
                var slot = row.slot(start + position)
                if slot >= 0 and start + position < end:
                    at.d_scores.unsafe_store(slot, panel.unsafe_load(line * LINE + position))


def attention_backward_dkdv[D: Int, played: Int, space: AddressSpace](
    task: Int, first: Int, args: Args, scratch: Pointer[Float32, MutUntrackedOrigin, address_space=space]
):
    """Task (key tile, kv head): dk and dv of its keys (at most 64), over the heads of the group, then the
    queries."""
    var at = Attention(args)
    var start, tile_end = at.tile(task // at.kv_heads)
    var kv = task % at.kv_heads
    var group = at.heads // at.kv_heads
    var rows = scratch
    var columns = scratch.unsafe_offset(TILE * LINE)
    var q_stride = at.heads * D
    var kv_stride = at.kv_heads * D
    var team = Array[Thread[D], played](fill=Thread[D]())
    for p in range(played):
        var tr = (first + p) // GROUPS
        comptime for a in range(ROWS):
            var t = start + ROWS * tr + a
            if t < tile_end:
                var queries = at.queries_of(t)
                team[p].low[a] = Int32(queries[0])
                team[p].high[a] = Int32(queries[1])
    var low = at.tokens
    var high = 0
    for r in range(tile_end - start):
        var queries = at.queries_of(start + r)
        if queries[0] < queries[1]:
            low = min(low, queries[0])
            high = max(high, queries[1])
    for member in range(group):
        var head = kv * group + member
        var base = low
        while base < high:
            block_scores[D, False](team, first, base, rows, columns, at.k, kv_stride, kv * D, start,
                                   at.q, q_stride, head * D, at.tokens)
            block_scores[D, True](team, first, base, rows, columns, at.v, kv_stride, kv * D, start,
                                  at.d_out, q_stride, head * D, at.tokens)
            for p in range(played):
                key_weights(team[p], first + p, base, head, at, rows)
                stage_values[chunk_of[D]()](columns, at.d_out, q_stride, head * D, base, at.tokens, first + p)
            sync[played]()
            block_products[D, False](team, first, base, rows, columns, at.d_out, q_stride, head * D, at.tokens)
            for p in range(played):
                var tid = first + p
                if team[p].overlaps(base):
                    write_weights(rows, team[p].t, tid // GROUPS, tid % GROUPS)
                stage_values[chunk_of[D]()](columns, at.q, q_stride, head * D, base, at.tokens, tid)
            sync[played]()
            if at.span_limit > 0:  # kept for the dq kernel, which reads them instead of recomputing them
                for p in range(played):
                    keep_score_gradients(rows, at, head, start, tile_end, base, first + p)
            block_products[D, True](team, first, base, rows, columns, at.q, q_stride, head * D, at.tokens)
            base += TILE
    for p in range(played):
        var tid = first + p
        var tr = tid // GROUPS
        var tc = tid % GROUPS
        if tc < lanes_of[D]():
            comptime for a in range(ROWS):
                var t = start + ROWS * tr + a
                if t < tile_end:
                    var task_row = t * at.kv_heads + kv
                    store_outputs[D](team[p].acc, at.dv.unsafe_offset(task_row * D), at.scale, False, tc, a)
                    store_outputs[D](team[p].acc2, at.dk.unsafe_offset(task_row * D), at.scale, True, tc, a)


@always_inline
def query_weights[D: Int, space: AddressSpace](
    mut thread: Thread[D], tid: Int, base: Int, scale: Float32,
    panel: Pointer[Float32, MutUntrackedOrigin, address_space=space],
):
    """From the block's scores s and dp (rows: queries, columns: keys): ds = exp(s·scale − L)·(dp − δ) into the
    panel, 0 outside the mask."""
    if not thread.overlaps(base):
        return
    var tr = tid // GROUPS
    var tc = tid % GROUPS
    comptime for a in range(ROWS):
        var p = numerics.exp(thread.s[a] * scale - thread.m[a])  # the 4 key columns as 4 lanes
        thread.t[a] = thread.pairs_columns(a, base, tc).select(p * (thread.t[a] - thread.l[a]), Vec(0))
    write_weights(panel, thread.t, tr, tc)


@always_inline
def stage_score_gradients[space: AddressSpace](
    panel: Pointer[Float32, MutUntrackedOrigin, address_space=space], at: Attention, head: Int, start: Int,
    end: Int, base: Int, tid: Int,
):
    """Thread tid's share of the block's ds for dq, from d_scores into the row panel as query_weights would write
    it (lines: keys base …, positions: the tile's queries start … end − 1; 0 where a query does not see the key, and
    past the tile). Warp w takes the queries start + 8w … start + 8w + 7, lane l of them 8w + l ÷ 8 and
    8w + 4 + l ÷ 8, each at the keys base + l mod 8 + 8m: a warp reads 8 consecutive floats of each of 4 query rows
    (whole 32-byte sectors) and writes 32 distinct banks of the panel, and a thread finds its two queries' spans
    once."""
    var lane = tid % 32
    comptime for half in range(2):
        var row = 8 * (tid // 32) + 4 * half + lane // 8
        var query = start + row
        var kept = at.kept_row(query, head) if query < end else KeptRow(0, 0, 0)
        comptime for m in range(TILE * TILE // TEAM // 2):
            var line = lane % 8 + 8 * m
            var slot = kept.slot(base + line)
            panel.unsafe_store(line * LINE + row, at.d_scores.unsafe_load(slot) if slot >= 0 else Float32(0))


def attention_backward_dq[D: Int, played: Int, space: AddressSpace](
    task: Int, first: Int, args: Args, scratch: Pointer[Float32, MutUntrackedOrigin, address_space=space]
):
    """Task (query tile, head): dq of its queries (at most 64), over their keys."""
    var at = Attention(args)
    var start, tile_end = at.tile(task // at.heads)
    var head = task % at.heads
    var kv = head * at.kv_heads // at.heads
    var rows = scratch
    var columns = scratch.unsafe_offset(TILE * LINE)
    var q_stride = at.heads * D
    var kv_stride = at.kv_heads * D
    var team = Array[Thread[D], played](fill=Thread[D]())
    for p in range(played):
        var tr = (first + p) // GROUPS
        comptime for a in range(ROWS):
            var t = start + ROWS * tr + a
            if t < tile_end:
                var keys = at.keys_of(t)
                team[p].low[a] = Int32(keys[0])
                team[p].high[a] = Int32(keys[1])
                team[p].m[a] = at.lse.unsafe_load(t * at.heads + head)
                team[p].l[a] = at.delta.unsafe_load(t * at.heads + head)
    var low = at.tokens
    var high = 0
    var kept = at.span_limit > 0  # whether d_scores keeps the ds of every query of the tile
    for r in range(tile_end - start):
        var keys = at.keys_of(start + r)
        if keys[0] < keys[1]:
            low = min(low, keys[0])
            high = max(high, keys[1])
            kept = kept and at.keeps_scores_of(start + r)
    var base = low
    while base < high:
        if kept:  # the dk/dv kernel's ds: the values query_weights would compute, bit for bit
            for p in range(played):
                stage_score_gradients(rows, at, head, start, tile_end, base, first + p)
        else:
            block_scores[D, False](team, first, base, rows, columns, at.q, q_stride, head * D, start,
                                   at.k, kv_stride, kv * D, at.tokens)
            block_scores[D, True](team, first, base, rows, columns, at.d_out, q_stride, head * D, start,
                                  at.v, kv_stride, kv * D, at.tokens)
            for p in range(played):
                query_weights(team[p], first + p, base, at.scale, rows)
        for p in range(played):
            stage_values[chunk_of[D]()](columns, at.k, kv_stride, kv * D, base, at.tokens, first + p)
        sync[played]()
        block_products[D, False](team, first, base, rows, columns, at.k, kv_stride, kv * D, at.tokens)
        base += TILE
    for p in range(played):
        var tid = first + p
        var tr = tid // GROUPS
        var tc = tid % GROUPS
        if tc < lanes_of[D]():
            comptime for a in range(ROWS):
                var t = start + ROWS * tr + a
                if t < tile_end:
                    store_outputs[D](team[p].acc, at.dq.unsafe_offset((t * at.heads + head) * D), at.scale, True, tc, a)
