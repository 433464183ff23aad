/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Runs the frame parser over every file of the corpus (argv[1]): ok-* must
 * parse (and a data payload must match its CRC), bad-* must be refused.
 * The fuzz target starts from the same files; this test keeps them honest
 * in every build, under ASan/UBSan in CI.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_wire.h"

static int check_one(const char *dir, const char *name)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "fopen(%s) failed: %s\n", path, strerror(errno));
		return 1;
	}
	static unsigned char buf[DP_FRAME_MAX + 1];
	size_t len = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	/* Exact-size heap copy so ASan catches any read past the frame. */
	unsigned char *frame = malloc(len ? len : 1);
	if (!frame)
		return 1;
	memcpy(frame, buf, len);
	struct dp_wire_view v;
	int r = dp_wire_parse(frame, len, len, DP_WIRE_UDP_PORT, &v);
	int want_ok = strncmp(name, "ok-", 3) == 0;
	int bad = 0;
	if (want_ok && r != 0) {
		fprintf(stderr, "%s: refused (%s), expected accepted\n", name, dp_drop_reason_name((unsigned)r));
		bad = 1;
	} else if (!want_ok && r == 0) {
		fprintf(stderr, "%s: accepted, expected refused\n", name);
		bad = 1;
	} else if (r == 0 && (v.h.flags & DP_WF_PCSUM) &&
		   dp_crc32c(0, frame + v.payload_off, v.h.payload_len) != v.h.payload_csum) {
		fprintf(stderr, "%s: payload CRC mismatch\n", name);
		bad = 1;
	} else {
		printf("%-28s %s\n", name, r ? dp_drop_reason_name((unsigned)r) : "accepted");
	}
	free(frame);
	return bad;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	DIR *d = opendir(argv[1]);
	if (!d) {
		fprintf(stderr, "opendir(%s) failed: %s\n", argv[1], strerror(errno));
		return 1;
	}
	int failed = 0, n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		failed += check_one(argv[1], e->d_name);
		n++;
	}
	closedir(d);
	if (n < 10) {
		fprintf(stderr, "only %d corpus files in %s: regenerate with gen_corpus.py\n", n, argv[1]);
		return 1;
	}
	printf("%d files, %d failed\n", n, failed);
	return failed ? 1 : 0;
}
