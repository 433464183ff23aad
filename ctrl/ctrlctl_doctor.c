/* SPDX-License-Identifier: Apache-2.0 */
/*
 * `ctrlctl doctor`: checks a node before (or while) it serves, without the
 * daemon. Each line is OK, WARN or FAIL with what was found and, when not
 * OK, the command that fixes it. Exit 0 when nothing FAILs (a WARN is
 * something a node may lack on purpose: a CPU node has no GPU, a node on
 * memif binds no NIC), 1 when something does. --json prints the same as
 * {"checks":[{check, result, detail, fix}], "failed": N, "warned": N}.
 *
 * What it reads: the configuration ctrld would (kvferry.conf, KVFERRY_*,
 * --config), /proc/meminfo and /proc/mounts (hugepages), /sys (IOMMU
 * groups, vfio-pci and the devices bound to it, NVIDIA devices), the
 * process's memlock limit, the model directory (opened as ctrld opens it),
 * the TCP ports (bound for a moment), the runtime directory, the units'
 * memlock limits (systemctl show), the CUDA backend's module (kvferry-cuda:
 * loaded, the driver's and runtime's CUDA versions, the GPUs it sees).
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <grp.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <jansson.h>

#include "ctrl_config.h"
#include "ctrlctl_doctor.h"
#include "kn_model.h"
#include "kn_stage.h"
#include "kn_tok.h"

enum { DR_OK = 0, DR_WARN = 1, DR_FAIL = 2 };

struct doctor {
	json_t *rows;
	int failed, warned, as_json;
};

static void report(struct doctor *d, int result, const char *check, const char *fix, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

static void report(struct doctor *d, int result, const char *check, const char *fix, const char *fmt, ...)
{
	static const char *const names[] = { "OK", "WARN", "FAIL" };
	char detail[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	d->failed += result == DR_FAIL;
	d->warned += result == DR_WARN;
	if (d->as_json) {
		json_array_append_new(d->rows, json_pack("{s:s, s:s, s:s, s:s?}", "check", check, "result", names[result],
							 "detail", detail, "fix", result != DR_OK ? fix : NULL));
		return;
	}
	printf("%-4s  %-12s %s\n", names[result], check, detail);
	if (result != DR_OK && fix != NULL)
		printf("      %-12s fix: %s\n", "", fix);
}

static long meminfo(const char *key)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	long v = -1;
	size_t kl = strlen(key);

	while (f != NULL && fgets(line, sizeof(line), f) != NULL)
		if (!strncmp(line, key, kl) && line[kl] == ':') {
			v = strtol(line + kl + 1, NULL, 10);
			break;
		}
	if (f != NULL)
		fclose(f);
	return v;
}

static int hugetlbfs_mount(char *where, size_t n)
{
	FILE *f = fopen("/proc/mounts", "r");
	char dev[256], dir[512], type[64];
	int found = 0;

	while (f != NULL && !found && fscanf(f, "%255s %511s %63s %*[^\n]", dev, dir, type) == 3)
		if (!strcmp(type, "hugetlbfs")) {
			snprintf(where, n, "%s", dir);
			found = 1;
		}
	if (f != NULL)
		fclose(f);
	return found;
}

static int count_entries(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.' && (prefix == NULL || !strncmp(e->d_name, prefix, strlen(prefix)));
	closedir(d);
	return n;
}

static void check_hugepages(struct doctor *d)
{
	long total = meminfo("HugePages_Total"), freep = meminfo("HugePages_Free"), size = meminfo("Hugepagesize");
	char where[512];

	if (total <= 0)
		report(d, DR_WARN, "hugepages", "kvferry-setup hugepages reserve 2G (dpdk-hugepages.py, persisted in "
		       "/etc/dpdk/dpdk.conf)",
		       "none reserved: the dataplane and the region fall back to ordinary shared memory");
	else
		report(d, freep > 0 ? DR_OK : DR_WARN, "hugepages", "kvferry-setup hugepages reserve 4G (reserve more)",
		       "%ld pages of %ld kB reserved, %ld free", total, size, freep);
	if (hugetlbfs_mount(where, sizeof(where)))
		report(d, DR_OK, "hugetlbfs", NULL, "mounted on %s", where);
	else
		report(d, DR_WARN, "hugetlbfs", "kvferry-setup hugepages reserve 2G (mounts /dev/hugepages for the kvferry "
		       "group)",
		       "not mounted");
}

static void check_nic(struct doctor *d)
{
	int groups = count_entries("/sys/kernel/iommu_groups", NULL);
	int bound = count_entries("/sys/bus/pci/drivers/vfio-pci", "0000:");

	if (groups > 0)
		report(d, DR_OK, "iommu", NULL, "%d IOMMU groups", groups);
	else
		report(d, DR_WARN, "iommu", "boot with intel_iommu=on (or amd_iommu=on) iommu=pt",
		       "no IOMMU groups: vfio-pci cannot take a NIC (net_memif and net_af_packet still work)");
	if (bound < 0)
		report(d, DR_WARN, "vfio-pci", "modprobe vfio-pci (kvferry-setup nic bind IFACE loads it)",
		       "the vfio-pci driver is not loaded");
	else if (bound == 0)
		report(d, DR_WARN, "nic", "kvferry-setup nic bind IFACE (dpdk-devbind.py --bind=vfio-pci, persisted in "
		       "/etc/dpdk/interfaces)",
		       "no device bound to vfio-pci: the dataplane needs a NIC, or a vdev (net_memif, net_af_packet)");
	else
		report(d, DR_OK, "nic", NULL, "%d device(s) bound to vfio-pci", bound);
}

static void check_memlock(struct doctor *d)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
		return;
	if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (rlim_t)1 << 30)
		report(d, DR_OK, "memlock", NULL, "%s", rl.rlim_cur == RLIM_INFINITY ? "unlimited" : ">= 1 GiB");
	else
		report(d, DR_WARN, "memlock", "LimitMEMLOCK=infinity in the units (the packaged ones set it); ulimit -l unlimited",
		       "%llu kB for this shell: pinned buffers may fail to lock", (unsigned long long)rl.rlim_cur / 1024);
}

/* The units' own limits, as systemd will apply them (only where systemd runs
 * and the units are installed): the dataplane (vfio DMA mappings) and the
 * workers (the CUDA engine pins the region) lock what they map. */
static void check_unit_memlock(struct doctor *d)
{
	static const char *const units[] = { "kvferry-dataplane.service", "kvferry-worker@0.service", NULL };

	if (access("/run/systemd/system", F_OK) != 0)
		return;
	for (int i = 0; units[i]; i++) {
		char cmd[160], line[160] = "";
		snprintf(cmd, sizeof(cmd), "systemctl show -P LoadState -P LimitMEMLOCK %s 2>/dev/null", units[i]);
		FILE *f = popen(cmd, "r");
		char state[160] = "";
		if (!f)
			return;
		/* systemctl show prints the properties in its own order; the
		 * load state is a word, the limit a number or "infinity" */
		for (int k = 0; k < 2 && fgets(cmd, sizeof(cmd), f); k++) {
			cmd[strcspn(cmd, "\n")] = '\0';
			if (!strcmp(cmd, "loaded") || !strcmp(cmd, "not-found") || !strcmp(cmd, "masked")
			    || !strcmp(cmd, "error") || !strcmp(cmd, "bad-setting"))
				snprintf(state, sizeof(state), "%s", cmd);
			else
				snprintf(line, sizeof(line), "%s", cmd);
		}
		pclose(f);
		if (strcmp(state, "loaded") != 0)
			continue;
		if (!strcmp(line, "infinity") || strtoull(line, NULL, 10) >= (1ull << 30))
			report(d, DR_OK, "unit memlock", NULL, "%s: LimitMEMLOCK=%s", units[i], line);
		else
			report(d, DR_WARN, "unit memlock",
			       "systemctl edit UNIT: [Service] LimitMEMLOCK=infinity (the packaged units set it)",
			       "%s: LimitMEMLOCK=%s: pinned buffers may fail to lock", units[i], line);
	}
}

static void check_model(struct doctor *d, const struct ctrl_settings *s)
{
	char err[1024];
	struct kn_model *m = kn_model_open(s->model_dir, err, sizeof(err));
	struct kn_tok *t;

	if (m == NULL) {
		report(d, DR_FAIL, "model", "set model_dir in kvferry.conf ([model]) to a Hugging Face model directory",
		       "%s: %s", s->model_dir, err);
		return;
	}
	t = kn_tok_open(s->model_dir, err, sizeof(err));
	if (t == NULL)
		report(d, DR_FAIL, "model", "put the model's tokenizer.json beside its weights", "%s: %s", s->model_dir, err);
	else
		report(d, DR_OK, "model", NULL, "%s: %d layers, hidden %d, vocabulary %d", s->model_dir,
		       kn_model_config(m)->n_layers, kn_model_config(m)->hidden_size, kn_model_config(m)->vocab_size);
	/* the CPU backend computes over the weights where they are mapped: they
	 * must fit the memory left, beside the KV pool, or the node swaps
	 * (a GPU node holds them in device memory instead) */
	if (s->backend == CTRL_CFG_BACKEND_CPU) {
		int32_t nt;
		uint64_t wb;
		long avail_kb = meminfo("MemAvailable");
		double need;

		/* kv_memory is each stage's: the stages as ctrld splits the model */
		int32_t ends[CTRL_CFG_MAX_STAGES], stages = 1;
		char serr[256];

		if (ctrl_config_stages(s->stages, kn_model_config(m)->n_layers, ends, &stages, serr, sizeof(serr)) != 0) {
			report(d, DR_FAIL, "stages", "give stages ([engine]) as N or contiguous ranges a-b,b-c from 0",
			       "stages = %s: %s", s->stages, serr);
			stages = 1;
		}
		kn_model_range_tensors(m, 0, kn_model_config(m)->n_layers, &nt, &wb);
		need = (double)wb + (double)s->kv_memory * stages;
		if (avail_kb < 0)
			report(d, DR_WARN, "model memory", NULL, "no MemAvailable in /proc/meminfo: not checked");
		else if (need <= (double)avail_kb * 1024.0)
			report(d, DR_OK, "model memory", NULL, "weights %.1f MiB + KV pools %d x %.1f MiB fit the %.1f MiB available",
			       (double)wb / 1048576.0, stages, (double)s->kv_memory / 1048576.0, (double)avail_kb / 1024.0);
		else
			report(d, DR_WARN, "model memory",
			       "a smaller model, a smaller kv_memory ([engine]), the stages split over nodes, or more memory",
			       "weights %.1f MiB + KV pools %d x %.1f MiB exceed the %.1f MiB available: the node would swap",
			       (double)wb / 1048576.0, stages, (double)s->kv_memory / 1048576.0, (double)avail_kb / 1024.0);
	}
	kn_tok_close(t);
	kn_model_close(m);
}

/* Bind @p port on @p addr for a moment: 0 free, -errno not. */
static int try_bind(const char *addr, int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), rc = 0;

	if (fd < 0)
		return -errno;
	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
		sa.sin_addr.s_addr = htonl(INADDR_ANY);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		rc = -errno;
	close(fd);
	return rc;
}

static void check_port(struct doctor *d, const char *what, const char *addr, int port)
{
	int rc;

	if (port == 0) {
		report(d, DR_OK, what, NULL, "port 0: a free one is picked at start");
		return;
	}
	rc = try_bind(addr, port);
	if (rc == 0)
		report(d, DR_OK, what, NULL, "%s:%d is free", addr, port);
	else
		report(d, rc == -EADDRINUSE ? DR_WARN : DR_FAIL, what,
		       "ss -ltnp 'sport = :PORT' shows who holds it; stop it or change the port in kvferry.conf",
		       "%s:%d: %s%s", addr, port, strerror(-rc),
		       rc == -EADDRINUSE ? " (a running kvferry-ctrld holds it, or another program)" : "");
}

static void check_runtime(struct doctor *d, const struct ctrl_settings *s)
{
	char dir[CTRL_CFG_STRLEN], *slash;
	struct stat st;
	struct group *g;

	snprintf(dir, sizeof(dir), "%s", s->admin_socket);
	slash = strrchr(dir, '/');
	if (slash == NULL || slash == dir)
		return;
	*slash = '\0';
	if (stat(dir, &st) != 0) {
		report(d, DR_WARN, "runtime dir", "systemd-tmpfiles --create /usr/lib/tmpfiles.d/kvferry.conf",
		       "%s is missing: the admin socket cannot be made", dir);
		return;
	}
	g = getgrgid(st.st_gid);
	if (g != NULL && !strcmp(g->gr_name, "kvferry"))
		report(d, DR_OK, "runtime dir", NULL, "%s, group kvferry", dir);
	else
		report(d, DR_WARN, "runtime dir", "chgrp kvferry DIR && chmod 0750 DIR (or systemd-tmpfiles --create)",
		       "%s belongs to group %s, not kvferry: ctrlctl needs membership of the group that owns it", dir,
		       g != NULL ? g->gr_name : "?");
}

static void check_gpu(struct doctor *d, const struct ctrl_settings *s)
{
	struct stat st;
	int cuda = s->backend == CTRL_CFG_BACKEND_CUDA;

	if (stat("/dev/nvidia0", &st) == 0)
		report(d, DR_OK, "gpu", NULL, "/dev/nvidia0 present%s", cuda ? "" : " (backend = cpu: not used)");
	else
		report(d, cuda ? DR_FAIL : DR_OK, "gpu", "install NVIDIA's driver, or set backend = cpu",
		       "no /dev/nvidia0%s", cuda ? ": backend = cuda cannot run here" : " (backend = cpu)");
}

/* The CUDA backend's module (package kvferry-cuda), loaded as a stage
 * would load it: where from, the driver's and the runtime's CUDA, GPUs. */
static void check_cuda(struct doctor *d, const struct ctrl_settings *s)
{
	int cuda = s->backend == CTRL_CFG_BACKEND_CUDA;
	struct kn_cuda_info ci;
	char err[768];
	int rc = kn_cuda_open(s->cuda_module, &ci, err, sizeof(err));

	if (rc == -ENODEV && !cuda) {
		report(d, DR_OK, "cuda", NULL, "kvferry-cuda not installed (backend = cpu: not needed)");
		return;
	}
	if (rc < 0) {
		report(d, cuda ? DR_FAIL : DR_WARN, "cuda",
		       rc == -ENODEV ? "apt install kvferry-cuda (with NVIDIA's cuda-cudart-13-0 and libcublas-13-0)"
		       : rc == -ENOENT ? "set [engine] cuda_module to the module's path, or empty to search"
				       : "install NVIDIA's CUDA 13 runtime and cuBLAS, and kvferry-cuda of kvferry's version",
		       "%s", err);
		return;
	}
	if (ci.driver_version == 0 || ci.devices == 0) {
		report(d, cuda ? DR_FAIL : DR_WARN, "cuda", "install NVIDIA's driver (nvidia-smi lists the GPUs), or set backend = cpu",
		       "%s: runtime CUDA %d.%d, but %s", ci.module, ci.runtime_version / 1000,
		       ci.runtime_version % 1000 / 10, ci.driver_version == 0 ? "no driver" : "no GPU visible");
		return;
	}
	if (ci.driver_version < ci.runtime_version) {
		report(d, cuda ? DR_FAIL : DR_WARN, "cuda", "upgrade NVIDIA's driver to one for CUDA 13 or later",
		       "%s: the driver supports CUDA %d.%d, the runtime needs %d.%d", ci.module,
		       ci.driver_version / 1000, ci.driver_version % 1000 / 10, ci.runtime_version / 1000,
		       ci.runtime_version % 1000 / 10);
		return;
	}
	report(d, DR_OK, "cuda", NULL, "%s: driver CUDA %d.%d, runtime %d.%d, %d GPU(s)%s", ci.module,
	       ci.driver_version / 1000, ci.driver_version % 1000 / 10, ci.runtime_version / 1000,
	       ci.runtime_version % 1000 / 10, ci.devices, cuda ? "" : " (backend = cpu: not used)");
}

int ctrlctl_doctor(int argc, char **argv, int as_json)
{
	extern char **environ;
	struct doctor d = { .rows = json_array(), .as_json = as_json };
	const char *path = getenv("KVFERRY_CONFIG");
	struct ctrl_config *c = ctrl_config_new();
	const struct ctrl_settings *s = NULL;
	char err[1024];
	int must = path != NULL && *path, rc;

	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "--config") && i + 1 < argc)
			path = argv[++i], must = 1;
	if (c == NULL || d.rows == NULL)
		return 1;
	rc = ctrl_config_load_file(c, path != NULL && *path ? path : CTRL_CONFIG_PATH, must, err, sizeof(err));
	if (!rc)
		rc = ctrl_config_load_env(c, environ, err, sizeof(err));
	if (!rc)
		rc = ctrl_config_check(c, err, sizeof(err));
	if (rc)
		report(&d, DR_FAIL, "config", "ctrlctl config shows each value's origin; kvferry-ctrld --check names the key",
		       "%s", err);
	else {
		const char *f = path != NULL && *path ? path : CTRL_CONFIG_PATH;

		s = ctrl_config_settings(c);
		report(&d, DR_OK, "config", NULL, "%s%s", f, access(f, R_OK) == 0 ? "" : " (absent: the defaults)");
	}
	check_hugepages(&d);
	check_nic(&d);
	check_memlock(&d);
	check_unit_memlock(&d);
	if (s != NULL) {
		check_model(&d, s);
		check_port(&d, "http port", s->listen_address, (int)s->port);
		if (s->pd_role == CTRL_CFG_PD_PREFILL)
			check_port(&d, "bootstrap", s->listen_address, (int)s->bootstrap_port);
		check_runtime(&d, s);
		check_gpu(&d, s);
		check_cuda(&d, s);
	}
	if (as_json) {
		json_t *o = json_pack("{s:o, s:i, s:i}", "checks", d.rows, "failed", d.failed, "warned", d.warned);
		char *txt = json_dumps(o, JSON_INDENT(2));

		printf("%s\n", txt != NULL ? txt : "null");
		free(txt);
		json_decref(o);
	} else {
		printf("%d failed, %d warned\n", d.failed, d.warned);
		json_decref(d.rows);
	}
	ctrl_config_free(c);
	return d.failed ? 1 : 0;
}
