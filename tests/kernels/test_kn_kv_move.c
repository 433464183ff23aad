/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Moving a sequence's KV pages between stages (kn_stage_kv_export/import),
 * the data path of prefill/decode disaggregation: after its pages move to
 * other blocks of another stage, a sequence decodes with the same logit
 * bits as where it was prefilled; a split model moves stage by stage; bf16
 * pages import exactly; pages in pieces (a message received in place) import
 * as from one buffer; bad block lists, short buffers and pages of other
 * layers are refused with a message that names them.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kn_model.h"
#include "kn_stage.h"
#include "kn_testutil.h"

#define PROMPT 21 /* two pages */
#define NDEC 8
#define BPS 3

struct fixture {
	struct kt_model t;
};

static int setup(void **state)
{
	return kt_fixture_setup(state, sizeof(struct fixture), "--preset tiny --arch qwen3 --layers 4 --seed 5");
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	kt_model_close(&f->t);
	free(f);
	return 0;
}

/* n_stages CPU stages over the model, 12 blocks, 2 slots. */
static void make_chain(struct fixture *f, int n_stages, struct kn_stage **st)
{
	assert_int_equal(kt_cpu_chain(&f->t, n_stages, 12, 2, BPS, st), 0);
}

static void point_slot(struct kn_stage **st, int n_stages, int32_t slot, const int32_t *blocks)
{
	assert_int_equal(kt_point_slot(st, n_stages, slot, blocks, BPS), 0);
}

static int32_t run(struct fixture *f, struct kn_stage **st, int n_stages, const int32_t *toks, int32_t n,
		   int32_t pos0, int32_t slot, float *logits)
{
	int32_t tok = kt_run(&f->t, st, n_stages, toks, n, pos0, slot, logits);

	assert_true(tok >= 0);
	return tok;
}

/*
 * Prefill on chain A (slot 0, blocks 3 7 9), move the pages to chain B
 * (slot 1, blocks 10 2 5), decode NDEC greedy steps on both: same bits.
 */
static void move_and_decode(struct fixture *f, int n_stages)
{
	struct kn_stage *a[2], *b[2];
	make_chain(f, n_stages, a);
	make_chain(f, n_stages, b);
	const int32_t ba[BPS] = { 3, 7, 9 }, bb[BPS] = { 10, 2, 5 };
	point_slot(a, n_stages, 0, ba);
	point_slot(b, n_stages, 1, bb);
	int32_t prompt[PROMPT];
	for (int i = 0; i < PROMPT; i++)
		prompt[i] = (int32_t)((i * 37 + 11) % f->t.vocab);
	float *la = malloc((size_t)f->t.vocab * 4), *lb = malloc((size_t)f->t.vocab * 4);
	int32_t ta = run(f, a, n_stages, prompt, PROMPT, 0, 0, la);
	const int32_t used = (PROMPT + KN_PAGE_BLK - 1) / KN_PAGE_BLK;
	for (int s = 0; s < n_stages; s++) {
		struct kn_kv_format fa;
		assert_int_equal(kn_stage_kv_format(a[s], &fa), 0);
		assert_int_equal(fa.dtype, KN_DT_F32);
		void *pages = malloc(used * fa.block_bytes);
		assert_int_equal(kn_stage_kv_export(a[s], ba, used, pages, used * fa.block_bytes), 0);
		int rc = kn_stage_kv_import(b[s], bb, used, pages, used * fa.block_bytes, &fa);
		if (rc)
			print_error("import: %s\n", kn_stage_error(b[s]));
		assert_int_equal(rc, 0);
		free(pages);
	}
	int32_t tb = ta;
	for (int i = 0; i < NDEC; i++) {
		int32_t na = run(f, a, n_stages, &ta, 1, PROMPT + i, 0, la);
		int32_t nb = run(f, b, n_stages, &tb, 1, PROMPT + i, 1, lb);
		assert_int_equal(na, nb);
		assert_memory_equal(la, lb, (size_t)f->t.vocab * 4);
		ta = na;
		tb = nb;
	}
	free(la);
	free(lb);
	for (int s = 0; s < n_stages; s++) {
		kn_stage_destroy(a[s]);
		kn_stage_destroy(b[s]);
	}
}

static void a_sequence_decodes_the_same_bits_after_its_pages_move(void **state)
{
	move_and_decode(*state, 1);
}

static void a_split_model_moves_its_pages_stage_by_stage(void **state)
{
	move_and_decode(*state, 2);
}

/* bf16 pages (a CUDA prefill node's) import exactly: read back as f32,
 * every value is its bf16 widened. */
static void bf16_pages_import_exactly(void **state)
{
	struct fixture *f = *state;
	struct kn_stage *st[1];
	make_chain(f, 1, st);
	struct kn_kv_format fm, fb;
	kn_stage_kv_format(st[0], &fm);
	fb = fm;
	fb.dtype = KN_DT_BF16;
	const size_t elems = fm.block_bytes / 4 * 2;
	uint16_t *src = malloc(elems * 2);
	float *back = malloc(elems * 4);
	for (size_t i = 0; i < elems; i++)
		src[i] = (uint16_t)(0x3c00u + (i * 2654435761u >> 20) % 0x0800u) ^ (i & 1 ? 0x8000u : 0);
	const int32_t blocks[2] = { 4, 0 };
	assert_int_equal(kn_stage_kv_import(st[0], blocks, 2, src, elems * 2, &fb), 0);
	assert_int_equal(kn_stage_kv_export(st[0], blocks, 2, back, elems * 4), 0);
	for (size_t i = 0; i < elems; i++) {
		uint32_t u = (uint32_t)src[i] << 16;
		float w;
		memcpy(&w, &u, 4);
		assert_memory_equal(&back[i], &w, 4);
	}
	free(src);
	free(back);
	kn_stage_destroy(st[0]);
}

/* Cut @p len bytes at @p src into pieces of 1, 7, 333, 4 KiB + 3, ...
 * bytes (a row of K or V split anywhere, empty pieces among them) after a
 * @p skip-byte header piece; @return the piece count. */
static int32_t cut(const char *hdr, size_t skip, const char *src, size_t len, struct kn_seg *seg, int32_t cap)
{
	static const size_t sizes[] = { 1, 7, 0, 333, 4099, 64, 8878, 5 };
	int32_t n = 0;
	size_t at = 0;

	seg[n++] = (struct kn_seg){ hdr, skip };
	for (int k = 0; at < len && n < cap - 1; k++) {
		size_t m = sizes[k % 8];

		if (m > len - at)
			m = len - at;
		seg[n++] = (struct kn_seg){ src + at, m };
		at += m;
	}
	assert_true(at == len);
	return n;
}

/* A page message received in place is read from its frames' payloads
 * where they lie: the pool ends up bit for bit as after one buffer's
 * import, f32 pages read straight (the CPU stage reads pieces) and bf16
 * ones gathered and converted; pieces short of the pages are refused. */
static void pages_in_pieces_import_as_from_one_buffer(void **state)
{
	struct fixture *f = *state;
	struct kn_stage *st[1];
	struct kn_kv_format fm, fb;
	struct kn_seg seg[4096];
	const int32_t blocks[3] = { 6, 1, 11 };
	const char hdr[40] = "a header the import passes over";

	make_chain(f, 1, st);
	assert_int_equal(kn_stage_kv_imports_segs(st[0]), 1);
	kn_stage_kv_format(st[0], &fm);
	const size_t len = 3 * fm.block_bytes, elems = len / 4;
	float *src = malloc(len), *want = malloc(len), *got = malloc(len);
	for (size_t i = 0; i < elems; i++)
		src[i] = (float)((int32_t)(i * 2654435761u >> 8) % 100000) / 977.0f;
	assert_int_equal(kn_stage_kv_import(st[0], blocks, 3, src, len, &fm), 0);
	assert_int_equal(kn_stage_kv_export(st[0], blocks, 3, want, len), 0);
	memset(got, 0, len);
	assert_int_equal(kn_stage_kv_import(st[0], blocks, 3, got, len, &fm), 0); /* zero them */
	int32_t n = cut(hdr, sizeof(hdr), (const char *)src, len, seg, 4096);
	assert_true(n > 9); /* every piece size at least once */
	int rc = kn_stage_kv_import_segs(st[0], blocks, 3, seg, n, sizeof(hdr), len, &fm);
	if (rc)
		print_error("%s\n", kn_stage_error(st[0]));
	assert_int_equal(rc, 0);
	assert_int_equal(kn_stage_kv_export(st[0], blocks, 3, got, len), 0);
	assert_memory_equal(got, want, len);

	/* bf16 pages: gathered, converted, the same as from one buffer */
	fb = fm;
	fb.dtype = KN_DT_BF16;
	uint16_t *b16 = malloc(len / 2);
	for (size_t i = 0; i < elems; i++)
		b16[i] = (uint16_t)(0x3c00u + (i * 2654435761u >> 20) % 0x0800u);
	assert_int_equal(kn_stage_kv_import(st[0], blocks, 3, b16, len / 2, &fb), 0);
	assert_int_equal(kn_stage_kv_export(st[0], blocks, 3, want, len), 0);
	memset(got, 0, len);
	assert_int_equal(kn_stage_kv_import(st[0], blocks, 3, got, len, &fm), 0);
	n = cut(hdr, sizeof(hdr), (const char *)b16, len / 2, seg, 4096);
	assert_int_equal(kn_stage_kv_import_segs(st[0], blocks, 3, seg, n, sizeof(hdr), len / 2, &fb), 0);
	assert_int_equal(kn_stage_kv_export(st[0], blocks, 3, got, len), 0);
	assert_memory_equal(got, want, len);

	/* pieces one byte short of the pages: refused, the pool untouched */
	n = cut(hdr, sizeof(hdr), (const char *)src, len - 1, seg, 4096);
	assert_int_equal(kn_stage_kv_import_segs(st[0], blocks, 3, seg, n, sizeof(hdr), len, &fm), -EINVAL);
	assert_non_null(strstr(kn_stage_error(st[0]), "pieces hold"));
	assert_int_equal(kn_stage_kv_export(st[0], blocks, 3, got, len), 0);
	assert_memory_equal(got, want, len);
	free(src);
	free(want);
	free(got);
	free(b16);
	kn_stage_destroy(st[0]);
}

static void bad_moves_are_refused_with_the_reason(void **state)
{
	struct fixture *f = *state;
	struct kn_stage *one[1], *two[2];
	make_chain(f, 1, one);
	make_chain(f, 2, two);
	struct kn_kv_format fm, f0;
	kn_stage_kv_format(one[0], &fm);
	kn_stage_kv_format(two[0], &f0);
	char *buf = calloc(2, fm.block_bytes);
	const int32_t bad[2] = { 1, 12 }, good[2] = { 1, 2 };
	assert_int_equal(kn_stage_kv_export(one[0], bad, 2, buf, 2 * fm.block_bytes), -EINVAL);
	assert_non_null(strstr(kn_stage_error(one[0]), "block 12 (entry 1) is outside the pool 0..11"));
	assert_int_equal(kn_stage_kv_export(one[0], good, 2, buf, 2 * fm.block_bytes - 1), -EINVAL);
	assert_non_null(strstr(kn_stage_error(one[0]), "short"));
	assert_int_equal(kn_stage_kv_export(one[0], good, -1, buf, 0), -EINVAL);
	/* the first half's pages into the whole model's stage */
	assert_int_equal(kn_stage_kv_import(one[0], good, 1, buf, fm.block_bytes, &f0), -EINVAL);
	assert_non_null(strstr(kn_stage_error(one[0]), "layers [0,2)"));
	assert_int_equal(kn_stage_kv_import(one[0], good, 1, buf, fm.block_bytes, NULL), -EINVAL);
	struct kn_kv_format odd = fm;
	odd.dtype = KN_DT_F16;
	assert_int_equal(kn_stage_kv_import(one[0], good, 1, buf, fm.block_bytes, &odd), -EINVAL);
	free(buf);
	kn_stage_destroy(one[0]);
	kn_stage_destroy(two[0]);
	kn_stage_destroy(two[1]);
}

int main(void)
{
	if (kt_need_mkmodel())
		return 77;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_sequence_decodes_the_same_bits_after_its_pages_move),
		cmocka_unit_test(a_split_model_moves_its_pages_stage_by_stage),
		cmocka_unit_test(bf16_pages_import_exactly),
		cmocka_unit_test(pages_in_pieces_import_as_from_one_buffer),
		cmocka_unit_test(bad_moves_are_refused_with_the_reason),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
