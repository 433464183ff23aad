/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the model loader's readers on bytes instead of files:
 * config.json (every spelling, rope scaling, dtypes, EOS lists) and a
 * safetensors file (its 8-byte header length, the JSON header, each
 * tensor's dtype, shape and data_offsets), then the checks kn_model_open()
 * makes before an engine may trust them (no name twice, every tensor the
 * architecture needs with its shape) and what it computes after
 * (the fingerprint, a stage's tensor count).
 *
 * Input: config.json, then optionally a NUL byte and the safetensors bytes.
 *
 * Beyond the sanitizers it checks kn_model.c's invariant: every tensor it
 * registers lies inside the bytes it was read from, with the bytes its
 * dtype and shape need.
 *
 * The readers are static: the target includes kn_model.c (as unit tests
 * may) and links no copy of the kernels library.
 */
#include "kn_model.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *st = memchr(data, 0, size);
	size_t cfg_len = st ? (size_t)(st - data) : size, st_len = st ? size - cfg_len - 1 : 0;
	struct kn_model m = { .dir = "fuzz" };
	char err[512];
	json_error_t je;
	json_t *root = json_loadb((const char *)data, cfg_len, 0, &je);
	int cfg_ok = 0;

	if (st)
		st++;
	if (root) {
		cfg_ok = kn_model_config_from_json(root, "config.json", &m.cfg, err, sizeof(err)) == 0;
		json_decref(root);
	}
	if (st && read_safetensors(&m, st, st_len, "model.safetensors", err, sizeof(err)) == 0 &&
	    index_tensors(&m, err, sizeof(err)) == 0) {
		for (size_t i = 0; i < m.n_tensors; i++) {
			const struct kn_tensor *t = &m.tensors[i];
			uint64_t n = dtype_size(t->dtype);

			for (int d = 0; d < t->n_dims; d++)
				n *= (uint64_t)t->shape[d];
			if ((const uint8_t *)t->data < st + 8 || t->nbytes != n ||
			    (const uint8_t *)t->data + t->nbytes > st + st_len)
				abort();
		}
		if (cfg_ok && validate(&m, err, sizeof(err)) == 0) {
			int32_t nt;
			uint64_t bytes;

			(void)fingerprint(&m);
			kn_model_range_tensors(&m, 0, m.cfg.n_layers, &nt, &bytes);
			if (nt < 2)
				abort();
		}
	}
	for (size_t i = 0; i < m.n_tensors; i++)
		free((void *)m.tensors[i].name);
	free(m.tensors);
	return 0;
}
