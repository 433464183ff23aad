/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hugging Face model directory loader: config.json and
 * generation_config.json (kn_model_config.c) and safetensors (single file,
 * sharded with an index, or a bare set of shards), checked against what the
 * architecture needs.
 *
 * Invariants: after kn_model_open() returns, every tensor the architecture
 * needs exists with the expected shape and a supported dtype, and every
 * tensor's bytes lie inside its mmapped file. Engines rely on both and never
 * re-check; breaking either would let a lying header read out of bounds.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kn_err.h"
#include "kn_model.h"
#include "kn_model_int.h"

struct kn_mapping {
	char *path;
	void *base;
	size_t size;
};

struct kn_model {
	char *dir;
	struct kn_model_config cfg;
	struct kn_mapping *maps;
	size_t n_maps;
	struct kn_tensor *tensors; /* sorted by name */
	size_t n_tensors, cap_tensors;
	uint64_t fingerprint;
};

static size_t dtype_size(enum kn_dtype d)
{
	return d == KN_DT_F32 ? 4 : 2;
}

/* ----------------------------------------------------------- safetensors */

static int tensor_cmp(const void *a, const void *b)
{
	return strcmp(((const struct kn_tensor *)a)->name, ((const struct kn_tensor *)b)->name);
}

static int add_tensor(struct kn_model *m, const struct kn_tensor *t)
{
	if (m->n_tensors == m->cap_tensors) {
		size_t cap = m->cap_tensors ? 2 * m->cap_tensors : 256;
		struct kn_tensor *n = realloc(m->tensors, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		m->tensors = n;
		m->cap_tensors = cap;
	}
	m->tensors[m->n_tensors++] = *t;
	return 0;
}

/* Register the tensors of one safetensors file's bytes [@p size at @p base]
 * (named @p path in messages), checking every offset and size against them
 * so a lying header is refused, not read. @return 0, -EINVAL, -ENOMEM. */
static int read_safetensors(struct kn_model *m, const void *base, size_t size, const char *path,
			    char *err, size_t errlen)
{
	json_t *hdr = NULL, *v;
	json_error_t je;
	const char *key;
	int rc = -EINVAL;

	if (size < 8) {
		kn_seterr(err, errlen, "%s: truncated safetensors file (%zu bytes; needs an 8-byte header length)", path, size);
		return -EINVAL;
	}
	uint64_t hlen;
	memcpy(&hlen, base, 8); /* little-endian on every host we build for */
	if (hlen > size - 8 || hlen > (100u << 20)) {
		kn_seterr(err, errlen, "%s: header length %llu exceeds the file (%zu bytes): truncated or corrupt safetensors",
		       path, (unsigned long long)hlen, size);
		return -EINVAL;
	}
	hdr = json_loadb((const char *)base + 8, hlen, 0, &je);
	if (!hdr || !json_is_object(hdr)) {
		kn_seterr(err, errlen, "%s: safetensors header is not a JSON object: %s", path, hdr ? "wrong type" : je.text);
		goto out;
	}
	const uint8_t *data = (const uint8_t *)base + 8 + hlen;
	size_t dlen = size - 8 - hlen;
	json_object_foreach(hdr, key, v) {
		struct kn_tensor t = { 0 };
		if (!strcmp(key, "__metadata__"))
			continue;
		json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
		       *off = json_object_get(v, "data_offsets");
		if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off) || json_array_size(off) != 2
		    || !json_is_integer(json_array_get(off, 0)) || !json_is_integer(json_array_get(off, 1))) {
			kn_seterr(err, errlen, "%s: tensor %s: header entry lacks dtype/shape/data_offsets", path, key);
			goto out;
		}
		const char *dts = json_string_value(dt);
		if (!strcmp(dts, "F32"))
			t.dtype = KN_DT_F32;
		else if (!strcmp(dts, "F16"))
			t.dtype = KN_DT_F16;
		else if (!strcmp(dts, "BF16"))
			t.dtype = KN_DT_BF16;
		else {
			kn_seterr(err, errlen, "%s: tensor %s has dtype %s; supported: F32, F16, BF16", path, key, dts);
			goto out;
		}
		if (json_array_size(sh) > 4) {
			kn_seterr(err, errlen, "%s: tensor %s has %zu dims (at most 4 supported)", path, key, json_array_size(sh));
			goto out;
		}
		t.n_dims = (int32_t)json_array_size(sh);
		uint64_t n = 1;
		for (int i = 0; i < t.n_dims; i++) {
			json_t *e = json_array_get(sh, (size_t)i);
			if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > (1ll << 40)) {
				kn_seterr(err, errlen, "%s: tensor %s: bad shape entry %d", path, key, i);
				goto out;
			}
			t.shape[i] = json_integer_value(e);
			n *= (uint64_t)t.shape[i];
			if (n > (1ull << 40)) {
				kn_seterr(err, errlen, "%s: tensor %s: shape too large", path, key);
				goto out;
			}
		}
		json_int_t b = json_integer_value(json_array_get(off, 0));
		json_int_t e = json_integer_value(json_array_get(off, 1));
		uint64_t need = n * dtype_size(t.dtype);
		if (b < 0 || e < b || (uint64_t)e > dlen || (uint64_t)(e - b) != need) {
			kn_seterr(err, errlen, "%s: tensor %s: data_offsets [%lld, %lld] do not hold %llu bytes inside the %zu-byte data section (truncated file or lying header)",
			       path, key, (long long)b, (long long)e, (unsigned long long)need, dlen);
			goto out;
		}
		t.data = data + b;
		t.nbytes = (size_t)need;
		t.name = strdup(key);
		if (!t.name || add_tensor(m, &t) < 0) {
			free((void *)t.name);
			rc = -ENOMEM;
			kn_seterr(err, errlen, "out of memory reading %s", path);
			goto out;
		}
	}
	rc = 0;
out:
	json_decref(hdr);
	return rc;
}

/* Map one safetensors file and register its tensors (read_safetensors()). */
static int load_safetensors(struct kn_model *m, const char *path, char *err, size_t errlen)
{
	int fd, rc;
	struct stat st;
	void *base;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		kn_seterr(err, errlen, "open(%s) failed: %s", path, strerror(errno));
		return rc;
	}
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		kn_seterr(err, errlen, "fstat(%s) failed: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	size_t size = (size_t)st.st_size;
	if (size < 8) { /* too short to map; read_safetensors() refuses it by name */
		close(fd);
		return read_safetensors(m, NULL, size, path, err, errlen);
	}
	base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (base == MAP_FAILED) {
		rc = -errno;
		kn_seterr(err, errlen, "mmap(%s, %zu) failed: %s", path, size, strerror(errno));
		return rc;
	}
	struct kn_mapping *maps = realloc(m->maps, (m->n_maps + 1) * sizeof(*maps));
	if (!maps) {
		munmap(base, size);
		kn_seterr(err, errlen, "out of memory mapping %s", path);
		return -ENOMEM;
	}
	m->maps = maps;
	m->maps[m->n_maps].base = base;
	m->maps[m->n_maps].size = size;
	m->maps[m->n_maps].path = strdup(path);
	m->n_maps++;
	if (!m->maps[m->n_maps - 1].path)
		return -ENOMEM;
	return read_safetensors(m, base, size, path, err, errlen);
}


/* Sort the tensors by name (kn_model_tensor() searches them) and refuse a
 * name that two files, or one header, hold twice. @return 0 or -EINVAL. */
static int index_tensors(struct kn_model *m, char *err, size_t errlen)
{
	if (m->n_tensors) /* a header of no tensors leaves m->tensors NULL: qsort() must not see it */
		qsort(m->tensors, m->n_tensors, sizeof(*m->tensors), tensor_cmp);
	for (size_t i = 1; i < m->n_tensors; i++)
		if (!strcmp(m->tensors[i].name, m->tensors[i - 1].name)) {
			kn_seterr(err, errlen, "%s: tensor %s appears twice", m->dir, m->tensors[i].name);
			return -EINVAL;
		}
	return 0;
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Which files hold the weights: the index's shards, else model.safetensors,
 * else every *.safetensors in the directory (sorted). */
static int load_weights(struct kn_model *m, char *err, size_t errlen)
{
	char path[4096];
	json_error_t je;
	char **files = NULL;
	size_t n = 0, i;
	int rc = 0;

	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", m->dir);
	json_t *idx = json_load_file(path, 0, &je);
	if (idx) {
		json_t *wm = json_object_get(idx, "weight_map"), *v;
		const char *key;
		if (!json_is_object(wm)) {
			kn_seterr(err, errlen, "%s: no weight_map object", path);
			json_decref(idx);
			return -EINVAL;
		}
		files = calloc(json_object_size(wm) + 1, sizeof(*files));
		if (!files) {
			json_decref(idx);
			return -ENOMEM;
		}
		json_object_foreach(wm, key, v) {
			if (!json_is_string(v) || strchr(json_string_value(v), '/')) {
				kn_seterr(err, errlen, "%s: weight_map[%s] is not a plain file name", path, key);
				rc = -EINVAL;
				break;
			}
			size_t k;
			for (k = 0; k < n; k++)
				if (!strcmp(files[k], json_string_value(v)))
					break;
			if (k == n && !(files[n++] = strdup(json_string_value(v))))
				rc = -ENOMEM;
			if (rc)
				break;
		}
		json_decref(idx);
	} else {
		snprintf(path, sizeof(path), "%s/model.safetensors", m->dir);
		DIR *d = opendir(m->dir);
		struct dirent *de;
		if (!d) {
			rc = -errno;
			kn_seterr(err, errlen, "opendir(%s) failed: %s", m->dir, strerror(errno));
			return rc;
		}
		size_t cap = 0;
		while ((de = readdir(d))) {
			size_t l = strlen(de->d_name);
			if (l < 12 || strcmp(de->d_name + l - 12, ".safetensors"))
				continue;
			if (n == cap) {
				cap = cap ? 2 * cap : 8;
				char **nf = realloc(files, cap * sizeof(*nf));
				if (!nf) {
					rc = -ENOMEM;
					break;
				}
				files = nf;
			}
			if (!(files[n++] = strdup(de->d_name))) {
				rc = -ENOMEM;
				break;
			}
		}
		closedir(d);
		if (!rc && n == 0) {
			kn_seterr(err, errlen, "%s: no model.safetensors, model.safetensors.index.json or *.safetensors file", m->dir);
			rc = -ENOENT;
		}
	}
	if (!rc)
		qsort(files, n, sizeof(*files), str_cmp);
	for (i = 0; !rc && i < n; i++) {
		snprintf(path, sizeof(path), "%s/%s", m->dir, files[i]);
		rc = load_safetensors(m, path, err, errlen);
	}
	for (i = 0; i < n; i++)
		free(files[i]);
	free(files);
	return rc ? rc : index_tensors(m, err, errlen);
}

/* ------------------------------------------------------------ validation */

static int expect(struct kn_model *m, const char *name, int nd, int64_t d0, int64_t d1,
		  char *err, size_t errlen)
{
	const struct kn_tensor *t = kn_model_tensor(m, name);
	if (!t) {
		if (nd > 1)
			kn_seterr(err, errlen, "%s: missing tensor %s (expected shape [%lld, %lld])", m->dir, name,
			       (long long)d0, (long long)d1);
		else
			kn_seterr(err, errlen, "%s: missing tensor %s (expected shape [%lld])", m->dir, name, (long long)d0);
		return -EINVAL;
	}
	if (t->n_dims != nd || t->shape[0] != d0 || (nd > 1 && t->shape[1] != d1)) {
		char found[96];
		int o = snprintf(found, sizeof(found), "[");
		for (int i = 0; i < t->n_dims && o < (int)sizeof(found) - 24; i++)
			o += snprintf(found + o, sizeof(found) - (size_t)o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
		snprintf(found + o, sizeof(found) - (size_t)o, "]");
		if (nd > 1)
			kn_seterr(err, errlen, "%s: tensor %s has shape %s, expected [%lld, %lld]", m->dir, name, found,
			       (long long)d0, (long long)d1);
		else
			kn_seterr(err, errlen, "%s: tensor %s has shape %s, expected [%lld]", m->dir, name, found, (long long)d0);
		return -EINVAL;
	}
	return 0;
}

static int validate(struct kn_model *m, char *err, size_t errlen)
{
	const struct kn_model_config *c = &m->cfg;
	char name[128];
	int64_t H = c->hidden_size, V = c->vocab_size, I = c->intermediate_size;
	int64_t Q = (int64_t)c->n_heads * c->head_dim, KV = (int64_t)c->n_kv_heads * c->head_dim;

	if (expect(m, "model.embed_tokens.weight", 2, V, H, err, errlen)
	    || expect(m, "model.norm.weight", 1, H, 0, err, errlen))
		return -EINVAL;
	if (!c->tie_embeddings || kn_model_tensor(m, "lm_head.weight"))
		if (expect(m, "lm_head.weight", 2, V, H, err, errlen))
			return -EINVAL;
	for (int l = 0; l < c->n_layers; l++) {
		static const struct { const char *s; int nd; char d0, d1; } tab[] = {
			{ "input_layernorm.weight", 1, 'H', 0 },
			{ "post_attention_layernorm.weight", 1, 'H', 0 },
			{ "self_attn.q_proj.weight", 2, 'Q', 'H' },
			{ "self_attn.k_proj.weight", 2, 'K', 'H' },
			{ "self_attn.v_proj.weight", 2, 'K', 'H' },
			{ "self_attn.o_proj.weight", 2, 'H', 'Q' },
			{ "mlp.gate_proj.weight", 2, 'I', 'H' },
			{ "mlp.up_proj.weight", 2, 'I', 'H' },
			{ "mlp.down_proj.weight", 2, 'H', 'I' },
			{ "self_attn.q_proj.bias", 1, 'Q', 'b' },
			{ "self_attn.k_proj.bias", 1, 'K', 'b' },
			{ "self_attn.v_proj.bias", 1, 'K', 'b' },
			{ "self_attn.q_norm.weight", 1, 'D', 'n' },
			{ "self_attn.k_norm.weight", 1, 'D', 'n' },
		};
		for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
			if (tab[i].d1 == 'b' && !c->qkv_bias)
				continue;
			if (tab[i].d1 == 'n' && !c->qk_norm)
				continue;
			int64_t dim[2];
			for (int k = 0; k < 2; k++) {
				char x = k ? tab[i].d1 : tab[i].d0;
				dim[k] = x == 'H' ? H : x == 'Q' ? Q : x == 'K' ? KV : x == 'I' ? I : x == 'D' ? c->head_dim : 0;
			}
			snprintf(name, sizeof(name), "model.layers.%d.%s", l, tab[i].s);
			if (expect(m, name, tab[i].nd, dim[0], dim[1], err, errlen))
				return -EINVAL;
		}
	}
	return 0;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* The configuration, each tensor's name and shape and its first 64 bytes. */
static uint64_t fingerprint(const struct kn_model *m)
{
	uint64_t h = fnv(0xcbf29ce484222325ull, &m->cfg, sizeof(m->cfg));
	for (size_t i = 0; i < m->n_tensors; i++) {
		const struct kn_tensor *t = &m->tensors[i];
		h = fnv(h, t->name, strlen(t->name));
		h = fnv(h, t->shape, sizeof(t->shape));
		h = fnv(h, t->data, t->nbytes < 64 ? t->nbytes : 64);
	}
	return h;
}

/* ------------------------------------------------------------------ API */

struct kn_model *kn_model_open(const char *dir, char *err, size_t errlen)
{
	struct kn_model *m;
	int rc;

	if (!dir) {
		kn_seterr(err, errlen, "kn_model_open: no directory given");
		errno = EINVAL;
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m || !(m->dir = strdup(dir))) {
		free(m);
		kn_seterr(err, errlen, "kn_model_open(%s): out of memory", dir);
		errno = ENOMEM;
		return NULL;
	}
	rc = kn_model_parse_config(dir, &m->cfg, err, errlen);
	if (!rc)
		rc = load_weights(m, err, errlen);
	if (!rc)
		rc = validate(m, err, errlen);
	if (rc) {
		if (rc == -ENOMEM)
			kn_seterr(err, errlen, "kn_model_open(%s): out of memory", dir);
		kn_model_close(m);
		errno = -rc;
		return NULL;
	}
	m->fingerprint = fingerprint(m);
	return m;
}

void kn_model_close(struct kn_model *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n_tensors; i++)
		free((void *)m->tensors[i].name);
	free(m->tensors);
	for (size_t i = 0; i < m->n_maps; i++) {
		munmap(m->maps[i].base, m->maps[i].size);
		free(m->maps[i].path);
	}
	free(m->maps);
	free(m->dir);
	free(m);
}

const struct kn_model_config *kn_model_config(const struct kn_model *m)
{
	return &m->cfg;
}

const char *kn_model_dir(const struct kn_model *m)
{
	return m->dir;
}

const struct kn_tensor *kn_model_tensor(const struct kn_model *m, const char *name)
{
	struct kn_tensor key = { .name = name };
	if (!m->tensors)
		return NULL;
	return bsearch(&key, m->tensors, m->n_tensors, sizeof(key), tensor_cmp);
}

/* Call @p fn for each tensor a stage of layers [ls, le) reads (the list
 * kn_model_range_tensors() documents), each once; stop at the first
 * nonzero return. @return that return, or 0. */
static int range_foreach(const struct kn_model *m, int32_t ls, int32_t le,
			 int (*fn)(void *arg, const struct kn_tensor *t), void *arg)
{
	static const char *const per_layer[] = {
		"input_layernorm.weight", "post_attention_layernorm.weight",
		"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
		"self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
		"mlp.down_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.bias",
		"self_attn.v_proj.bias", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
	};
	const struct kn_tensor *t;
	char name[128];
	const char *extra[3];
	int n_extra = 0, rc;

	for (int32_t l = ls; l < le; l++)
		for (size_t i = 0; i < sizeof(per_layer) / sizeof(per_layer[0]); i++) {
			snprintf(name, sizeof(name), "model.layers.%d.%s", l, per_layer[i]);
			if ((t = kn_model_tensor(m, name)) != NULL && (rc = fn(arg, t)) != 0)
				return rc;
		}
	if (ls == 0)
		extra[n_extra++] = "model.embed_tokens.weight";
	if (le == m->cfg.n_layers) {
		extra[n_extra++] = "model.norm.weight";
		/* a tied head reads the embedding on the last stage too */
		extra[n_extra++] = kn_model_tensor(m, "lm_head.weight") != NULL ? "lm_head.weight"
				   : ls != 0 ? "model.embed_tokens.weight" : NULL;
	}
	for (int i = 0; i < n_extra; i++)
		if (extra[i] != NULL && (t = kn_model_tensor(m, extra[i])) != NULL && (rc = fn(arg, t)) != 0)
			return rc;
	return 0;
}

struct range_count {
	int32_t n;
	uint64_t bytes;
};

static int count_tensor(void *arg, const struct kn_tensor *t)
{
	struct range_count *c = arg;

	c->n++;
	c->bytes += t->nbytes;
	return 0;
}

void kn_model_range_tensors(const struct kn_model *m, int32_t ls, int32_t le, int32_t *n, uint64_t *bytes)
{
	struct range_count c = { 0, 0 };

	range_foreach(m, ls, le, count_tensor, &c);
	*n = c.n;
	*bytes = c.bytes;
}

/* Bytes read between progress calls, and the unit of read-ahead: large
 * enough that one madvise() moves a disk's worth of I/O, small enough that
 * a progress line is at most ~1/10 s late at 200 MB/s. */
#define READ_CHUNK ((size_t)16 << 20)

struct range_read {
	const struct kn_model *m;
	uint64_t done, total;
	int (*progress)(void *arg, uint64_t done, uint64_t total);
	void *arg;
	char *err;
	size_t errlen;
};

static const char *map_path(const struct kn_model *m, const void *p)
{
	for (size_t i = 0; i < m->n_maps; i++)
		if ((const char *)p >= (const char *)m->maps[i].base
		    && (const char *)p < (const char *)m->maps[i].base + m->maps[i].size)
			return m->maps[i].path;
	return "?";
}

/* Bring [p, p + n) of a mapping into memory with large reads, reporting a
 * read error instead of leaving it to a SIGBUS in the middle of a step.
 * MADV_POPULATE_READ (Linux 5.14) reads and maps the pages and fails with
 * EFAULT / EIO where a touch would fault; an older kernel gets MADV_WILLNEED
 * (read-ahead only). @return 0 or -errno. */
static int populate(const void *p, size_t n)
{
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)p & ~(pg - 1), b = ((uintptr_t)p + n + pg - 1) & ~(pg - 1);

#ifdef MADV_POPULATE_READ
	for (;;) {
		if (madvise((void *)a, b - a, MADV_POPULATE_READ) == 0)
			return 0;
		if (errno != EINTR && errno != EAGAIN)
			break;
	}
	if (errno != EINVAL)
		return -errno;
#endif
	(void)madvise((void *)a, b - a, MADV_WILLNEED); /* advice: a failure only loses read-ahead */
	return 0;
}

static int read_tensor(void *arg, const struct kn_tensor *t)
{
	struct range_read *c = arg;
	const uint8_t *p = t->data, *end = p + t->nbytes;

	while (p < end) {
		size_t n = (size_t)(end - p) < READ_CHUNK ? (size_t)(end - p) : READ_CHUNK;
		int rc = populate(p, n);

		if (rc < 0) {
			kn_seterr(c->err, c->errlen, "reading tensor %s (bytes %zu..%zu of it) from %s failed: %s: the file "
				  "shrank or its disk failed since the model was opened; check it and restart",
				  t->name, (size_t)(p - (const uint8_t *)t->data),
				  (size_t)(p - (const uint8_t *)t->data) + n, map_path(c->m, p), strerror(-rc));
			return rc;
		}
		/* one load per 64-byte line pulls every byte through the caches:
		 * the read is real on a kernel that only read ahead, and the
		 * time is that of reading the weights, not of mapping them */
		for (const volatile uint8_t *q = p; q < p + n; q += 64)
			(void)*q;
		p += n;
		c->done += n;
		if (c->progress != NULL && c->progress(c->arg, c->done, c->total) != 0) {
			kn_seterr(c->err, c->errlen, "reading the stage's weights: stopped by the caller after %llu of "
				  "%llu bytes", (unsigned long long)c->done, (unsigned long long)c->total);
			return -ECANCELED;
		}
	}
	return 0;
}

int kn_model_read_range(const struct kn_model *m, int32_t ls, int32_t le,
			int (*progress)(void *arg, uint64_t done, uint64_t total), void *arg, char *err,
			size_t errlen)
{
	struct range_read c = { .m = m, .progress = progress, .arg = arg, .err = err, .errlen = errlen };
	int32_t n;

	kn_model_range_tensors(m, ls, le, &n, &c.total);
	return range_foreach(m, ls, le, read_tensor, &c);
}

uint64_t kn_model_fingerprint(const struct kn_model *m)
{
	return m->fingerprint;
}
