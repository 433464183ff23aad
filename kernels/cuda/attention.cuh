/* SPDX-License-Identifier: Apache-2.0 */
/**
 * @file attention.cuh
 * Paged attention with GQA (the heads sharing a KV head are served by one
 * pass over its K/V). Long contexts are split into fixed pieces processed by
 * separate blocks (split-K, "flash-decoding"), then merged in order; the
 * number of pieces depends only on the column's own position and the split
 * size, so a column's bits never depend on its batch. Two kernels:
 *  - column (KN_CU_ATTN_COLUMN): one column at a time on CUDA cores, f32 q,
 *    KN_CU_ATTN_SPLIT-position pieces (plans of 1-2 columns: 32 or 64 up
 *    to 1,024 positions, about 16 pieces, the last piece to finish merging
 *    them: no second kernel);
 *  - tile (KN_CU_ATTN_TILE): tensor cores (mma.sync m16n8k16). A warp owns
 *    16 rows = 16 / GM consecutive columns x GM heads of one KV head; the
 *    columns of one slot among them (a prompt's consecutive columns in a
 *    prefill) share each K/V page, loaded once per warp (cp.async,
 *    swizzled shared memory, ldmatrix), so a 2,048-column prefill reads K/V
 *    2,048 / (16 / GM) times instead of 2,048 times and does its QK^T and
 *    PV on tensor cores. Columns of other slots are served one slot after
 *    another. A piece is taken in softmax steps of a 16-key page (two
 *    stages of a K and a V page), or with steps64 of up to 64 keys from
 *    its start (a step's V staged while its scores are taken, the next
 *    step's K during P V); each row's scores, softmax update and P V
 *    products never meet another row's and run over the same steps in the
 *    same order whoever shares the warp (keys past a row's own position
 *    score -inf: P 0, an exact no-op), so the bits are batch-invariant
 *    here too. With steps64 the run kernel (prompt chunks,
 *    kn_cu_attn_args.runs) calls the same step functions on its 64-key
 *    tiles, so in one family (run_fold) a column has the same bits in a
 *    run as in the tile kernel.
 *    q and P enter the tensor cores as bf16 (exact = 0) or as bf16 hi + lo,
 *    two products each (exact = 1, f32-grade, ~1e-6 of a double reference).
 *    A column's pieces are folded in order, (M, L, A) <- (max(M, m), L wa +
 *    l wb, A wa + v wb): by the merge kernel from the pieces' partials, or,
 *    on wide plans, by a warp of a prompt chunk's columns that takes every
 *    piece of its rows itself (the same bits: no partials written or read).
 */
#ifndef KN_CU_ATTENTION_CUH
#define KN_CU_ATTENTION_CUH
#include "cu_common.cuh"

/** Positions per split of the column kernel above 1,024 positions: a 4k-context column gives 32 x n_kv_heads blocks. */
#define KN_CU_ATTN_SPLIT 128

enum { KN_CU_ATTN_COLUMN = 0, KN_CU_ATTN_TILE = 1 };

struct kn_cu_attn_args {
	const float *q;          /**< [n][q_stride] f32, head h at h*head_dim, rotated */
	int q_stride;
	const kn_bf16 *k_cache;  /**< [n_blocks][n_kv_heads][KN_PAGE_BLK][head_dim] */
	const kn_bf16 *v_cache;
	const int32_t *table;    /**< [n_slots][max_bps] */
	const struct kn_column *cols; /**< [n]; a column attends to 0..pos of its slot */
	float *out;              /**< [n][n_heads*head_dim] f32 */
	float *part;             /**< workspace, kn_cuda_attn_workspace() bytes */
	unsigned *counters;      /**< column kernel: [n][n_kv_heads], zero before the first
	                              launch; every launch leaves them zero. Its own buffer,
	                              not in part: plans of other widths overwrite part */
	int n, n_heads, n_kv_heads, head_dim, max_bps;
	int max_ctx;             /**< largest pos + 1 any column may have (it picks the splits) */
	int grid_ctx;            /**< largest pos + 1 any column of this launch has, <= max_ctx (it
	                              sizes the grids: blocks past every column's context are not
	                              launched); 0: max_ctx */
	float scale;             /**< 1/sqrt(head_dim) */
	int kernel;              /**< KN_CU_ATTN_COLUMN or KN_CU_ATTN_TILE */
	int exact;               /**< tile kernel: q and P as bf16 hi + lo */
	int split;               /**< tile kernel: positions per split, a multiple of 16
	                              (kn_cuda_attn_tile_split()); or -P (one column a warp
	                              only): each column in P pieces of its own length,
	                              kn_cuda_attn_own_split() */
	int tile_from;           /**< column kernel: columns of at least this many positions
	                              go to the tile kernel instead (its split in split; 0:
	                              none). A function of a column's own length, so its bits
	                              still depend on nothing else (kn_cuda_attn_tile_from()) */
	int runs;                /**< 0, 64 or 128. Tile kernel, bf16 q/P (exact 0): each `runs`
	                              consecutive columns (from a multiple of `runs`) that are one
	                              slot's consecutive positions (a prompt chunk's) are served by
	                              the run kernel, a block of `runs` query rows of one head in
	                              one causal pass over 64-key tiles shared through shared
	                              memory, no pieces, no merge; the tile and merge kernels skip
	                              them. Its bits then depend on the column's neighbours,
	                              unless run_fold */
	int steps64;             /**< tile kernel, bf16 q/P (exact 0): softmax steps of up to 64
	                              keys from a piece's start (attn_scores(), attn_pv()), the
	                              run kernel's tiles; 0: steps of 16 keys (a page) */
	int run_fold;            /**< with steps64: the run kernel in pieces of `split`
	                              positions (a multiple of 64, else no runs), folded as the
	                              tile kernel folds them, so a column's bits are the same in
	                              a run as in the tile kernel (one family) */
	int serial;              /**< set by kn_cuda_attention(): on wide plans (more than 256 columns)
	                              the tile kernel's columns a warp (16 / GM); a warp whose
	                              columns are one slot's consecutive positions (a prompt
	                              chunk's) then takes every piece itself and folds them in
	                              order as the merge kernel does (the same bits, no partials
	                              written); 0: every warp one piece, merged after */
	int len_lo, len_hi;      /**< set by kn_cuda_attention(): a launch serves the columns of
	                              len_lo <= pos + 1 < len_hi (len_hi 0: no bound); padding
	                              columns are zeroed by the launch whose len_lo is 0 */
};

/** @return where the column kernel's plans of @p n columns hand their long
 *  columns to the tile kernel (kn_cu_attn_args.tile_from), for a head of
 *  @p head_dim with @p G heads a KV head: 0 (never) where the tile kernel
 *  measured no faster at any context (kernels/cuda/NOTES.md, "One kernel a
 *  column"). KVFERRY_CUDA_ATTN_TILE_FROM=N sets N at every narrow width. */
int kn_cuda_attn_tile_from(int n, int head_dim, int G);

/** @return workspace bytes for @p n columns: enough for the column kernel's
 *  partials and for the tile kernel's at @p split positions per piece (0:
 *  column kernel only). */
size_t kn_cuda_attn_workspace(int n, int n_heads, int n_kv_heads, int head_dim, int max_ctx,
			      int split);

/** @return the tile kernel's split for a plan of @p n columns and contexts up
 *  to @p max_ctx: narrow plans (<= 16 columns) ~64 pieces at the longest
 *  context; 17..256 columns about 4,096 warps, 64..256 positions; wider
 *  plans (prefill) 256, fewer partials. Always >= 64 positions. */
int kn_cuda_attn_tile_split(int n, int max_ctx, int n_heads, int n_kv_heads);

/** @return kn_cu_attn_args.split for a narrow plan of @p n columns whose
 *  columns each take pieces of their own length (about 64 pieces at one
 *  column, 32 at more: pieces of at least 64 positions); 0 where the tile
 *  kernel cannot serve the head (head_dim, or more than 8 heads a KV head). */
int kn_cuda_attn_own_split(int n, int head_dim, int n_heads, int n_kv_heads);

/** @return the split counters (unsigned) the column kernel needs for plans
 *  of up to @p n columns: one per column and KV head, times ceil(G / 8) for
 *  more than 8 heads per KV head. */
int kn_cuda_attn_counters(int n, int n_heads, int n_kv_heads);

/** @return whether the tile kernel serves @p head_dim (16, 32, 64, 128; 256
 *  has too many accumulators per lane, and the other multiples of 16 run the
 *  column kernel of the next power of two, their idle lanes masked). */
int kn_cuda_attn_tile_ok(int head_dim);

/**
 * Attend every column of @p a. Padding columns (slot -1) produce zeros.
 * @return the launch's cudaError_t; cudaErrorInvalidValue for a head_dim
 *         that is no multiple of 16 in 16..256 (tile: 16, 32, 64, 128), (tile) more than 8 heads
 *         per KV head, a tile split that is not a positive multiple of 16, or
 *         no counters for the column kernel in a plan of 1-2 columns.
 */
cudaError_t kn_cuda_attention(const struct kn_cu_attn_args *a, cudaStream_t st);
#endif
