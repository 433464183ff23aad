/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The configuration table: every key kvferry-ctrld reads, in one place.
 * The packaged kvferry.conf, --help, `ctrlctl config` and the error messages
 * are all generated from it, so a key added here is documented everywhere.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config_int.h"
#include "ctrl_config.h"
#include "kn_stage.h"

static int check_stages(const char *value, char *err, size_t errlen)
{
	int32_t ends[CTRL_CFG_MAX_STAGES];
	int32_t n;

	return ctrl_config_stages(value, 0, ends, &n, err, errlen);
}

static int check_plans(const char *value, char *err, size_t errlen)
{
	int32_t w[8], n;

	return ctrl_config_plans(value, w, &n, err, errlen);
}

/* "" (the model's own), "none", or a file we can read: a typo fails at
 * start naming the key and where it came from, not at the first chat. */
static int check_chat_template(const char *value, char *err, size_t errlen)
{
	if (!value[0] || !strcmp(value, "none") || access(value, R_OK) == 0)
		return 0;
	snprintf(err, errlen, "access(%s, R_OK) failed: %s; give a readable Jinja template file, "
		 "none, or nothing for the model's own", value, strerror(errno));
	return -EINVAL;
}

static const char *const backend_names[] = {"cpu", "cuda", NULL};
static const char *const worker_return_names[] = {"ring", "dataplane", NULL};
static const char *const pd_role_names[] = {"both", "prefill", "decode", NULL};
static const char *const cuda_gemv_names[] = {"auto", "ffma", "mma", NULL};
static const char *const cuda_wide_x_names[] = {"round", "split", NULL};
static const char *const cuda_attn_names[] = {"auto", "column", "tile", NULL};

#define OFF(f) offsetof(struct ctrl_settings, f)
#define KIB 1024.0
#define GIB (1024.0 * 1024.0 * 1024.0)

const char *const g_cfg_sections[] = {"http", "model", "engine", "sched", "ctrl", "pd", NULL};

const struct cfg_key g_cfg_keys[] = {
	/* [http] */
	{"listen_address", "http", CFG_STRING, OFF(listen_address), "127.0.0.1", 0, 0,
	 "KVFERRY_LISTEN_ADDRESS", "--listen-address", NULL, NULL,
	 "IPv4 or IPv6 address the OpenAI-compatible HTTP API listens on (0.0.0.0 for every interface)"},
	{"port", "http", CFG_INT, OFF(port), "8000", 0, 65535,
	 "KVFERRY_PORT", "--port", NULL, NULL,
	 "TCP port of the HTTP API; 0 picks a free port and logs it"},
	{"http_threads", "http", CFG_INT, OFF(http_threads), "4", 1, 256,
	 "KVFERRY_HTTP_THREADS", "--http-threads", NULL, NULL,
	 "HTTP worker threads (request parsing and tokenizing run on them)"},
	{"request_body_limit", "http", CFG_SIZE, OFF(request_body_limit), "1M", KIB, 1024 * KIB * KIB,
	 "KVFERRY_REQUEST_BODY_LIMIT", "--request-body-limit", NULL, NULL,
	 "largest request body accepted; bigger ones get 413"},
	{"connection_timeout", "http", CFG_INT, OFF(connection_timeout), "30", 0, 86400,
	 "KVFERRY_CONNECTION_TIMEOUT", "--connection-timeout", NULL, NULL,
	 "seconds an HTTP connection may send and receive nothing before it is closed: an idle "
	 "keep-alive connection, a client that stopped mid-request (a Content-Length larger than its "
	 "body); a request waiting for its tokens is not idle. Keep it above the idle timeout of a "
	 "load balancer that reuses connections to ctrld; 0 = never"},
	{"request_timeout", "http", CFG_INT, OFF(request_timeout), "60", 0, 86400,
	 "KVFERRY_REQUEST_TIMEOUT", "--request-timeout", NULL, NULL,
	 "seconds a connection may take to deliver a whole request (headers and body), counted from "
	 "its opening or its previous answer's end, however slowly it trickles; later ones are "
	 "closed unanswered. It also ends an idle keep-alive connection if connection_timeout has "
	 "not; 0 = no deadline"},
	{"max_connections", "http", CFG_INT, OFF(max_connections), "1024", 0, 1 << 20,
	 "KVFERRY_MAX_CONNECTIONS", "--max-connections", NULL, NULL,
	 "open HTTP connections served; a request arriving while more are open gets 503 "
	 "too_many_connections and its connection is closed (64 more are accepted to say so; "
	 "beyond those, connections wait in the listen backlog). Each takes a file descriptor; "
	 "0 = no 503, libmicrohttpd's own limit (1020)"},
	{"cors_allow_origins", "http", CFG_STRING, OFF(cors_allow_origins), "", 0, 0,
	 "KVFERRY_CORS_ALLOW_ORIGINS", "--cors-allow-origins", NULL, NULL,
	 "web pages allowed to call the API from a browser (CORS): \"*\" for any, or origins "
	 "separated by commas (https://chat.example.com,http://localhost:3000); answers then carry "
	 "Access-Control-Allow-Origin and OPTIONS preflights get 204. Empty = none: browsers refuse "
	 "a page's cross-origin calls (clients outside a browser are not affected)"},
	/* [model] */
	{"model_dir", "model", CFG_STRING, OFF(model_dir), "/var/lib/kvferry/model", 0, 0,
	 "KVFERRY_MODEL_DIR", "--model-dir", NULL, NULL,
	 "Hugging Face model directory (config.json, *.safetensors, tokenizer.json)"},
	{"served_model_name", "model", CFG_STRING, OFF(served_model_name), "", 0, 0,
	 "KVFERRY_SERVED_MODEL_NAME", "--served-model-name", NULL, NULL,
	 "model name clients send and /v1/models lists; empty = the model directory's name"},
	{"max_tokens_default", "model", CFG_INT, OFF(max_tokens_default), "256", 1, 1 << 24,
	 "KVFERRY_MAX_TOKENS_DEFAULT", "--max-tokens-default", NULL, NULL,
	 "max_tokens of a request that does not say (capped by what the context has left)"},
	{"max_context", "model", CFG_INT, OFF(max_context), "0", 0, 1 << 24,
	 "KVFERRY_MAX_CONTEXT", "--max-context", NULL, NULL,
	 "longest sequence (prompt + output) in tokens; 0 = the model's max_position_embeddings"},
	{"chat_template", "model", CFG_STRING, OFF(chat_template), "", 0, 0,
	 "KVFERRY_CHAT_TEMPLATE", "--chat-template", NULL, check_chat_template,
	 "chat template file (Jinja text, or JSON with a chat_template key) used instead of the "
	 "model's tokenizer_config.json one; none = no chat (/v1/chat/completions answers 400); "
	 "empty = the model's. kvferry renders the ChatML (Qwen) and Llama 3 families; a model whose "
	 "template is of another family is refused at start until this names one of theirs"},
	/* [engine] */
	{"stages", "engine", CFG_STRING, OFF(stages), "1", 0, 0,
	 "KVFERRY_STAGES", "--stages", NULL, check_stages,
	 "pipeline stages: a count (layers split evenly) or layer ranges like 0-8,8-16"},
	{"backend", "engine", CFG_ENUM, OFF(backend), "cpu", 0, 1,
	 "KVFERRY_BACKEND", "--backend", backend_names, NULL,
	 "stage engine: cpu or cuda"},
	{"threads", "engine", CFG_INT, OFF(threads), "0", 0, 1024,
	 "KVFERRY_THREADS", "--threads", NULL, NULL,
	 "CPU engine threads per stage; 0 = online cores"},
	{"kv_blocks", "engine", CFG_INT, OFF(kv_blocks), "0", 0, 1 << 24,
	 "KVFERRY_KV_BLOCKS", "--kv-blocks", NULL, NULL,
	 "KV pool blocks per stage (16 positions each); 0 = as many as kv_memory holds"},
	{"kv_memory", "engine", CFG_SIZE, OFF(kv_memory), "1G", 64 * KIB, 1024 * GIB,
	 "KVFERRY_KV_MEMORY", "--kv-memory", NULL, NULL,
	 "CPU backend: bytes of KV pool per stage when kv_blocks is 0"},
	{"kv_mem_fraction", "engine", CFG_FLOAT, OFF(kv_mem_fraction), "0.9", 0.01, 1.0,
	 "KVFERRY_KV_MEM_FRACTION", "--kv-mem-fraction", NULL, NULL,
	 "CUDA backend: share of free device memory the KV pool takes when kv_blocks is 0"},
	{"device", "engine", CFG_INT, OFF(device), "0", 0, 63,
	 "KVFERRY_DEVICE", "--device", NULL, NULL,
	 "CUDA device ordinal of the first stage (stage i uses device + i)"},
	{"cuda_gemv", "engine", CFG_ENUM, OFF(cuda_gemv), "auto", 0, 2,
	 "KVFERRY_CUDA_GEMV", "--cuda-gemv", cuda_gemv_names, NULL,
	 "cuda: skinny products (plans <= 16 columns): auto (FFMA at 1 column, tensor cores at 2..16), "
	 "ffma or mma everywhere (one kernel family across widths 1..16)"},
	{"cuda_wide_x", "engine", CFG_ENUM, OFF(cuda_wide_x), "round", 0, 1,
	 "KVFERRY_CUDA_WIDE_X", "--cuda-wide-x", cuda_wide_x_names, NULL,
	 "cuda: plans > 16 columns round X to bf16 for cuBLAS (round), or add the remainder's product "
	 "(split: f32-grade X at twice the tensor work, for validation)"},
	{"cuda_attn", "engine", CFG_ENUM, OFF(cuda_attn), "auto", 0, 2,
	 "KVFERRY_CUDA_ATTN", "--cuda-attn", cuda_attn_names, NULL,
	 "cuda: attention kernel: auto (tensor-core tile kernel on plans > 16 columns, column kernel "
	 "below), column or tile everywhere"},
	{"cuda_batch_invariant", "engine", CFG_BOOL, OFF(cuda_batch_invariant), "no", 0, 1,
	 "KVFERRY_CUDA_BATCH_INVARIANT", "--cuda-batch-invariant", NULL, NULL,
	 "cuda: yes: one numerics family at every plan width (warpgroup-MMA linears, tile attention in "
	 "fixed pieces), so a request's tokens do not depend on what it is batched with; Hopper only "
	 "(refused at start elsewhere); decode steps take 0.94-1.17x as long, prompt chunks 1.3-1.4x (H100)"},
	{"cuda_module", "engine", CFG_STRING, OFF(cuda_module), "", 0, 0,
	 "KVFERRY_CUDA_MODULE", "--cuda-module", NULL, NULL,
	 "cuda: the CUDA backend's module, kvferry-cuda.so (empty: beside the program, else the "
	 "kvferry-cuda package's)"},
	{"plans", "engine", CFG_STRING, OFF(plans), "auto", 0, 0,
	 "KVFERRY_PLANS", "--plans", NULL, check_plans,
	 "step widths each stage compiles (a launch pads to the next one; prefill-only launches "
	 "use the widest): up to 8 ascending, e.g. 8,32,64,256; auto = 8,64 on cpu (mb_k when "
	 "wider), 1,8,16,32,64,128,256,512 on cuda (mb_k when wider), where a step's cost grows "
	 "with its padded width"},
	/* [sched] */
	{"max_slots", "sched", CFG_INT, OFF(max_slots), "64", 1, 4096,
	 "KVFERRY_MAX_SLOTS", "--max-slots", NULL, NULL,
	 "sequences generating at once per replica"},
	{"mb_k", "sched", CFG_INT, OFF(mb_k), "0", 0, 4096,
	 "KVFERRY_MB_K", "--mb-k", NULL, NULL,
	 "micro-batch width: columns of a launch that carries decode work (a quarter of them "
	 "kept for prefill chunks while a prompt waits); 0 = 32 on cpu, 512 on cuda"},
	{"step_budget", "sched", CFG_FLOAT, OFF(step_budget), "1.9", 1.0, 100.0,
	 "KVFERRY_STEP_BUDGET", "--step-budget", NULL, NULL,
	 "cuda: prompt positions ride beside the decodes only while a launch's predicted time "
	 "stays within this many times the decodes' own (every decoding sequence waits for its "
	 "whole launch: this bounds the inter-token latency that prefill adds); the prediction "
	 "is fit to the step times the worker measures; 1 = no cap (mb_k alone)"},
	{"groups", "sched", CFG_INT, OFF(groups), "0", 0, 256,
	 "KVFERRY_GROUPS", "--groups", NULL, NULL,
	 "micro-batch groups in flight; 0 = stages + 1, the least that keeps every stage busy"},
	{"max_queue", "sched", CFG_INT, OFF(max_queue), "65536", 1, 1 << 24,
	 "KVFERRY_MAX_QUEUE", "--max-queue", NULL, NULL,
	 "requests waiting for admission beyond this get 503"},
	{"replicas", "sched", CFG_INT, OFF(replicas), "1", 1, 64,
	 "KVFERRY_REPLICAS", "--replicas", NULL, NULL,
	 "independent pipelines: in ctrld, or of kvferry-worker processes (replica R > 0 on rings "
	 "serve.rR.sK.in / serve.rR.ret; worker_return = ring); requests go to the least loaded one "
	 "that serves, and a replica whose worker died hands its waiting requests to another"},
	{"prefill_pipeline", "sched", CFG_BOOL, OFF(prefill_pipeline), "yes", 0, 1,
	 "KVFERRY_PREFILL_PIPELINE", "--prefill-pipeline", NULL, NULL,
	 "with several stages a long prompt's next chunk leaves before the previous one came back: "
	 "stage k computes chunk j + 1 while stage k + 1 computes chunk j, so a lone 1,024-token "
	 "prompt on two CPU stages took 0.57-0.59 of its time to its first token, a 2,048-token one "
	 "on two CUDA stages (1B, H200) 0.86-0.87; each launch beside running decodes may then carry "
	 "a chunk more often. no: one chunk of a prompt in flight"},
	{"prefix_cache", "sched", CFG_BOOL, OFF(prefix_cache), "yes", 0, 1,
	 "KVFERRY_PREFIX_CACHE", "--prefix-cache", NULL, NULL,
	 "keep the KV blocks of prompts for later prompts that start with the same tokens (16-token "
	 "blocks: a shared system prompt, a chat's earlier turns): those compute only the rest. Idle "
	 "cached blocks are not counted in blocks_in_use and go back first when the pool runs dry; "
	 "all are forgotten when a worker re-joins or a micro-batch is lost, and on POST /flush_cache. "
	 "Answers are unchanged on the CPU backend and with cuda_batch_invariant (a prompt's KV has "
	 "the same bits however it was chunked); the CUDA backend's default kernels may differ in the "
	 "last bits, as batched requests do. no: every prompt computed whole"},
	{"spec", "sched", CFG_BOOL, OFF(spec), "yes", 0, 1,
	 "KVFERRY_SPEC", "--spec", NULL, NULL,
	 "prompt-lookup speculative decoding for greedy requests (output is unchanged)"},
	{"spec_depth", "sched", CFG_INT, OFF(spec_depth), "8", 1, 64,
	 "KVFERRY_SPEC_DEPTH", "--spec-depth", NULL, NULL,
	 "most drafted tokens verified per round"},
	{"spec_c_full", "sched", CFG_INT, OFF(spec_c_full), "8", 0, 4096,
	 "KVFERRY_SPEC_C_FULL", "--spec-c-full", NULL, NULL,
	 "full speculation depth while at most this many sequences are live"},
	{"spec_c_half", "sched", CFG_INT, OFF(spec_c_half), "32", 0, 4096,
	 "KVFERRY_SPEC_C_HALF", "--spec-c-half", NULL, NULL,
	 "depth min(spec_depth, 4) while at most this many are live; no speculation above"},
	{"replay_max", "sched", CFG_INT, OFF(replay_max), "2", 0, 100,
	 "KVFERRY_REPLAY_MAX", "--replay-max", NULL, NULL,
	 "a request whose stage died under it runs again from its prompt plus the tokens it already "
	 "generated, once the chain re-forms (the restarted worker answers); its client sees a pause, "
	 "the same tokens as an undisturbed run (greedy and seeded sampling alike) and no error. At "
	 "most this many times per request, then it fails naming the stage; 0 = it fails at once"},
	{"replay_timeout", "sched", CFG_INT, OFF(replay_timeout), "30", 1, 86400,
	 "KVFERRY_REPLAY_TIMEOUT", "--replay-timeout", NULL, NULL,
	 "seconds a request waits for a chain that re-forms after a stage died (replay_max > 0) before "
	 "it fails naming the stage; set it above the time a worker takes to restart and load its "
	 "layers"},
	/* [ctrl] */
	{"admin_socket", "ctrl", CFG_STRING, OFF(admin_socket), CTRL_ADMIN_PATH, 0, 0,
	 "KVFERRY_ADMIN_SOCKET", "--admin-socket", NULL, NULL,
	 "Unix socket ctrlctl talks to (mode 0660)"},
	{"drain_timeout", "ctrl", CFG_INT, OFF(drain_timeout), "30", 0, 86400,
	 "KVFERRY_DRAIN_TIMEOUT", "--drain-timeout", NULL, NULL,
	 "seconds SIGTERM waits for in-flight requests before cancelling them"},
	{"poll_spin_us", "ctrl", CFG_INT, OFF(poll_spin_us), "-1", -1, 1000000,
	 "KVFERRY_POLL_SPIN_US", "--poll-spin-us", NULL, NULL,
	 "the scheduler keeps polling (one core busy) this long after its last work before it "
	 "sleeps between polls; -1 = 2000 on cuda (a step returns within ms), 0 on cpu (leave the "
	 "cores to the CPU engine)"},
	/* [engine] stages in kvferry-worker processes (ctrl_proc_chain.h) */
	{"worker_region", "engine", CFG_STRING, OFF(worker_region), "", 0, 0,
	 "KVFERRY_WORKER_REGION", "--worker-region", NULL, NULL,
	 "shm region of this node through which the stages' kvferry-worker processes are reached; "
	 "empty: stages run inside ctrld"},
	{"worker_region_size", "engine", CFG_SIZE, OFF(worker_region_size), "0", 0, 64.0 * GIB,
	 "KVFERRY_WORKER_REGION_SIZE", "--worker-region-size", NULL, NULL,
	 "create worker_region with this size (a node without kvferry-dataplane); 0: attach to the "
	 "region the dataplane created"},
	{"worker_return", "engine", CFG_ENUM, OFF(worker_return), "ring", 0, 1,
	 "KVFERRY_WORKER_RETURN", "--worker-return", worker_return_names, NULL,
	 "how results come back: ring (the last stage's worker runs on this node) or dataplane "
	 "(it runs on another node)"},
	{"worker_join_timeout", "engine", CFG_INT, OFF(worker_join_timeout), "60", 1, 3600,
	 "KVFERRY_WORKER_JOIN_TIMEOUT", "--worker-join-timeout", NULL, NULL,
	 "seconds ctrld waits at start for every stage's worker to join"},
	{"worker_group_timeout", "engine", CFG_INT, OFF(worker_group_timeout), "30", 1, 3600,
	 "KVFERRY_WORKER_GROUP_TIMEOUT", "--worker-group-timeout", NULL, NULL,
	 "a micro-batch without a result for this many seconds fails its requests (a stage on "
	 "another node died)"},
	/* [pd] prefill/decode disaggregation (ctrl_pd_boot.h) */
	{"role", "pd", CFG_ENUM, OFF(pd_role), "both", 0, 2,
	 "KVFERRY_PD_ROLE", "--pd-role", pd_role_names, NULL,
	 "both: prefill and decode here; prefill: also answer the bootstrap routes (PUT/GET /route, "
	 "GET /health) decode nodes and routers read, and with dataplane_region ship rooms' KV pages; "
	 "decode: prefill every prompt on the prefill nodes ([pd] prefill) and decode from their KV "
	 "pages (needs dataplane_region; stages inside ctrld, one replica)"},
	{"bootstrap_port", "pd", CFG_INT, OFF(bootstrap_port), "8998", 0, 65535,
	 "KVFERRY_BOOTSTRAP_PORT", "--bootstrap-port", NULL, NULL,
	 "role = prefill: TCP port of the bootstrap routes, on listen_address (0 picks a free port and "
	 "logs it)"},
	{"rank_address", "pd", CFG_STRING, OFF(rank_address), "", 0, 0,
	 "KVFERRY_RANK_ADDRESS", "--rank-address", NULL, NULL,
	 "role = prefill: host:port this node's ranks register as the address their KV pages leave "
	 "from (rank_ip, rank_port); empty: listen_address and bootstrap_port"},
	{"dataplane_region", "pd", CFG_STRING, OFF(pd_dataplane_region), "", 0, 0,
	 "KVFERRY_PD_DATAPLANE_REGION", "--pd-dataplane-region", NULL, NULL,
	 "role = prefill: the region kvferry-dataplane created on this node; a completion carrying "
	 "bootstrap_room then holds its prompt's KV until the decode node's manifest comes over the "
	 "dataplane, and the pages go there (stages inside ctrld); empty: the routes only"},
	{"prefill", "pd", CFG_STRING, OFF(pd_prefill), "", 0, 0,
	 "KVFERRY_PD_PREFILL", "--pd-prefill", NULL, NULL,
	 "role = decode: the prefill nodes' bootstrap addresses, host:port, comma-separated (their "
	 "bootstrap_port); each request goes to the healthy one with the fewest rooms in flight"},
	{"heartbeat_interval", "pd", CFG_INT, OFF(pd_heartbeat_interval), "5", 2, 3600,
	 "KVFERRY_PD_HEARTBEAT_INTERVAL", "--pd-heartbeat-interval", NULL, NULL,
	 "role = decode: seconds between two GET /health probes of a prefill node"},
	{"heartbeat_failures", "pd", CFG_INT, OFF(pd_heartbeat_failures), "2", 1, 100,
	 "KVFERRY_PD_HEARTBEAT_FAILURES", "--pd-heartbeat-failures", NULL, NULL,
	 "role = decode: missed probes in a row after which a prefill node is lost (its unfinished "
	 "rooms fail)"},
	{"room_timeout", "pd", CFG_INT, OFF(pd_room_timeout), "300", 1, 86400,
	 "KVFERRY_PD_ROOM_TIMEOUT", "--pd-room-timeout", NULL, NULL,
	 "role = decode: seconds a request may wait for its prefill node's KV pages and first token "
	 "before it fails"},
	{"room_retries", "pd", CFG_INT, OFF(pd_room_retries), "1", 0, 10,
	 "KVFERRY_PD_ROOM_RETRIES", "--pd-room-retries", NULL, NULL,
	 "role = decode: times a request whose room was lost with a dataplane's session (this node's "
	 "or its prefill node's kvferry-dataplane restarted) runs again in a fresh room before it "
	 "fails; nothing has reached its client by then, so it sees no error. 0: such a request fails"},
	{"worker_rx", "pd", CFG_BOOL, OFF(pd_worker_rx), "yes", 0, 1,
	 "KVFERRY_PD_WORKER_RX", "--pd-worker-rx", NULL, NULL,
	 "role = decode with stages in kvferry-worker processes: each stage's worker takes its layers' "
	 "KV pages from the dataplane itself (its own receive ring) and imports them, ctrld only opening "
	 "and closing the rooms; no: ctrld takes every page message and hands it to the stage"},
	{"ship_chunk", "pd", CFG_INT, OFF(pd_ship_chunk), "512", 0, 1 << 20,
	 "KVFERRY_PD_SHIP_CHUNK", "--pd-ship-chunk", NULL, NULL,
	 "role = prefill: a room's prompt runs in chunks of at most this many tokens (rounded down to "
	 "whole 16-position pages), and each chunk's pages leave for the decode node as soon as every "
	 "stage has computed it, overlapping the transfer with the rest of the prompt; 0: the whole "
	 "prompt at once, its pages after it"},
	{"page_buffers", "pd", CFG_INT, OFF(pd_page_buffers), "16", 2, 1024,
	 "KVFERRY_PD_PAGE_BUFFERS", "--pd-page-buffers", NULL, NULL,
	 "role = prefill: KV page messages a node may have on their way at once, each a buffer in the "
	 "dataplane's region as large as its rx_large buffers (4 MiB by default, at most that); a room's "
	 "pages wait for one to come back when all are out, which delays a prompt's last chunk when "
	 "fewer than ~64 MiB are on their way (H200, 1B, 2048 tokens). Takes effect when the region is created"},
	{"ship_taper", "pd", CFG_BOOL, OFF(pd_ship_taper), "yes", 0, 1,
	 "KVFERRY_PD_SHIP_TAPER", "--pd-ship-taper", NULL, NULL,
	 "role = prefill, with ship_chunk: only a prompt's last chunk is ship_chunk tokens; the ones "
	 "before run as wide as a launch takes (wide launches compute faster, and their pages leave while "
	 "the later chunks compute), so what the decode node waits for after the prompt stays one "
	 "ship_chunk of pages"},
	{"first_token_early", "pd", CFG_BOOL, OFF(pd_first_early), "yes", 0, 1,
	 "KVFERRY_PD_FIRST_TOKEN_EARLY", "--pd-first-token-early", NULL, NULL,
	 "role = decode: a disaggregated request's first token (the prefill node's) goes to its client "
	 "as soon as its room succeeds, while its last KV pages are still landing; decoding starts once "
	 "they all landed (no: the first token waits for them too)"},
};

const size_t g_cfg_n_keys = sizeof(g_cfg_keys) / sizeof(g_cfg_keys[0]);

/* The file also holds the worker's [worker] (and each instance's [worker.K]) and the dataplane's
 * [dp] sections; their variables
 * (KVFERRY_WK_*, KVFERRY_DP_*) and the libraries' measurement knobs (the CUDA engine's, which
 * it checks itself when a stage starts, the shm fallback directory, the ring fence) are not
 * ctrld's; KVFERRY_LOG_TIME is the log line's (kvf_log.h). KVFERRY_CUDA_BATCH_INVARIANT is
 * ([engine] cuda_batch_invariant), so the engine's are named one by one (KN_CUDA_ENV_KNOBS,
 * kn_stage.h), not by their prefix: a misspelt one is refused. */
static const char *const foreign_sections[] = {"worker", "worker.", "dp", NULL};
static const char *const env_skip[] = {"KVFERRY_WK_", "KVFERRY_DP_", "KVFERRY_SHM_DIR", "KVFERRY_RING_FENCE",
				       "KVFERRY_LOG_TIME", KN_CUDA_ENV_KNOBS, NULL};

const struct cfg_table g_cfg_table = {
	.program = "kvferry-ctrld",
	.keys = g_cfg_keys,
	.n_keys = sizeof(g_cfg_keys) / sizeof(g_cfg_keys[0]),
	.sections = g_cfg_sections,
	.foreign_sections = foreign_sections,
	.env_prefix = "KVFERRY_",
	.env_skip = env_skip,
	.settings_size = sizeof(struct ctrl_settings),
};
