#!/usr/bin/env python3
# Writes the seed corpus of each libFuzzer target in tests/fuzz/ (valid
# inputs of every shape the reader knows, and edge cases), one folder per
# target. The input layouts are the targets' (see each fuzz_*.c).
#   tests/fuzz/gen_seeds.py tests/fuzz
# Seeds that reproduce a fixed finding are named regress-* and are kept by
# hand beside these (the script never removes a file).
import json
import os
import struct
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
src = os.path.abspath(os.path.join(root, '..', '..'))


def put(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)


def js(o):
    return json.dumps(o, separators=(',', ':'))


# ---- http: byte 0 = route (bits 0-1: completions, chat, tokenize,
# detokenize; 0x40: /generate) | tokenizer << 2 (0 ferry, 1 tok_tiny, 2 tok_tiny + Llama 3,
# 3.. tests/kernels/data/chat/*.jinja in name order)
M = 'kvferry-fuzz'
http = {
    'completion': (0, {'model': M, 'prompt': 'Hello, world', 'max_tokens': 8}),
    'completion-every-param': (0, {'model': M, 'prompt': ['Once upon a time'], 'max_tokens': 16,
                                   'temperature': 0.7, 'top_p': 0.9, 'top_k': 40, 'seed': -5,
                                   'stop': ['\n\n', 'The end', ''], 'logprobs': 3, 'stream': True,
                                   'stream_options': {'include_usage': True}, 'ignore_eos': False,
                                   'n': 1, 'presence_penalty': 0, 'logit_bias': {}, 'echo': False,
                                   'user': 'u1'}),
    'completion-ids': (0, {'model': M, 'prompt': [1, 2, 3, 4000], 'max_tokens': 1}),
    'completion-list-n': (0, {'model': M, 'prompt': ['a b', [1, 2, 3], 'c'], 'n': 3, 'max_tokens': 2,
                              'stop': ['x'], 'logprobs': 2, 'seed': 9}),
    'completion-echo': (0, {'model': M, 'prompt': ['x\ny', [5, 6]], 'echo': True, 'stop': ['\n'],
                            'max_tokens': 3, 'stream': True}),
    'completion-echo-logprobs': (0, {'model': M, 'prompt': [[1, 2, 3, 4], 'x y'], 'echo': True, 'logprobs': 1,
                                     'max_tokens': 1, 'temperature': 0}),
    'completion-prompt-only': (0, {'model': M, 'prompt': 'score me', 'echo': True, 'logprobs': 5,
                                   'max_tokens': 0, 'stream': True}),
    'chat-tools': (1 | 9 << 2, {'model': M, 'tools': [{'type': 'function', 'function': {
        'name': 'get_weather', 'parameters': {'type': 'object', 'properties': {'city': {'type': 'string'}},
                                              'examples': [1.5, -0.0, 1e-05, 1e+16]}}}],
        'tool_choice': 'auto', 'stop_token_ids': [5], 'include_stop_str_in_output': True,
        'chat_template_kwargs': {'enable_thinking': False},
        'messages': [{'role': 'user', 'content': 'weather?'},
                     {'role': 'assistant', 'content': None, 'tool_calls': [
                         {'id': 'c1', 'type': 'function',
                          'function': {'name': 'get_weather', 'arguments': '{"city": "Paris"}'}}]},
                     {'role': 'tool', 'tool_call_id': 'c1', 'content': '21 C'}]}),
    'chat-n-stream': (1, {'model': M, 'messages': [{'role': 'user', 'content': 'hi'}], 'n': 4,
                          'stream': True, 'max_tokens': 3}),
    'completion-bootstrap': (0, {'model': M, 'prompt': 'pd', 'bootstrap_room': 12345,
                                 'bootstrap_host': '10.0.0.2', 'bootstrap_port': 8998}),
    'completion-too-long': (0, {'model': M, 'prompt': 'word ' * 300, 'max_tokens': 900}),
    'completion-no-model': (0, {'prompt': 'x'}),
    'completion-unsupported': (0, {'model': M, 'prompt': 'x', 'logit_bias': {'5': 1},
                                   'response_format': {'type': 'json_object'}, 'n': 2}),
    'chat': (1, {'model': M, 'messages': [{'role': 'system', 'content': 'Be brief.'},
                                          {'role': 'user', 'content': 'Hi there'}],
                 'max_completion_tokens': 12}),
    'chat-parts-logprobs': (1, {'model': M, 'messages': [{'role': 'user', 'content': [
        {'type': 'text', 'text': 'part one '}, {'type': 'text', 'text': 'part two'}]},
        {'role': 'assistant', 'content': None}, {'role': 'user', 'content': 'more'}],
        'logprobs': True, 'top_logprobs': 5, 'stop': 'END', 'tools': [], 'tool_choice': 'none'}),
    'chat-tool-role': (1 | 4 << 2, {'model': M, 'messages': [{'role': 'user', 'content': 'q'},
                                                            {'role': 'tool', 'content': '{"r": 1}'}]}),
    'chat-llama3': (1 | 2 << 2, {'model': M, 'messages': [{'role': 'user', 'content': '  spaced  '}]}),
    'chat-qwen3': (1 | 12 << 2, {'model': M, 'messages': [{'role': 'system', 'content': 's'},
                                                         {'role': 'user', 'content': 'u'},
                                                         {'role': 'assistant', 'content': '<think>a</think>b'},
                                                         {'role': 'user', 'content': 'again'}]}),
    'chat-bad-role': (1 | 1 << 2, {'model': M, 'messages': [{'role': 5, 'content': 'x'}]}),
    'tokenize': (2, {'prompt': 'Hello <|im_start|>', 'add_special_tokens': False}),
    'tokenize-chat': (2 | 1 << 2, {'model': M, 'messages': [{'role': 'user', 'content': 'hi'}]}),
    'detokenize': (3, {'tokens': [1, 72, 300, 2, 8191]}),
    'detokenize-bad': (3, {'model': M, 'tokens': [-1, 'x']}),
    # 0x40: SGLang's /generate
    'generate': (0x40, {'text': 'Hello, world', 'sampling_params': {'max_new_tokens': 8, 'temperature': 0}}),
    'generate-every-param': (0x40 | 1 << 2, {
        'input_ids': [1, 2, 3], 'stream': True, 'return_logprob': True, 'top_logprobs_num': 3,
        'return_text_in_logprobs': True, 'rid': 'r1', 'logprob_start_len': -1, 'bootstrap_host': '10.0.0.2',
        'bootstrap_port': None, 'bootstrap_room': 9223372036854775807,
        'sampling_params': {'max_new_tokens': 4, 'temperature': 0.7, 'top_p': 0.9, 'top_k': 40, 'stop': ['x', ''],
                            'ignore_eos': True, 'sampling_seed': 5, 'n': 1, 'min_p': 0, 'stop_token_ids': [],
                            'skip_special_tokens': True, 'json_schema': None}}),
    'generate-input-logprobs': (0x40, {'input_ids': [5, 6, 7, 8], 'return_logprob': True, 'logprob_start_len': 1,
                                       'top_logprobs_num': 2, 'sampling_params': {'max_new_tokens': 0}}),
    'generate-refused': (0x40, {'text': ['a', 'b'], 'sampling_params': {'frequency_penalty': 1, 'bogus': 2}}),
}
for name, (b0, body) in http.items():
    put('http', name, bytes([b0]) + js(body).encode())
put('http', 'not-an-object', b'\x00[1, 2, 3]')
put('http', 'duplicate-keys', b'\x00{"model": "a", "model": "b"}')
put('http', 'big-integer', b'\x00{"model":"kvferry-fuzz","prompt":"x","max_tokens":123456789012345678901234}')
put('http', 'empty', b'\x01')

# ---- tok_load: tokenizer.json [NUL tokenizer_config.json]
data = os.path.join(src, 'tests', 'kernels', 'data')
tiny = open(os.path.join(data, 'tok_tiny', 'tokenizer.json'), 'rb').read()
tiny_cfg = open(os.path.join(data, 'tok_tiny', 'tokenizer_config.json'), 'rb').read()
put('tok_load', 'tok-tiny', tiny + b'\0' + tiny_cfg)
put('tok_load', 'tok-tiny-llama3', tiny + b'\0' + open(os.path.join(data, 'tok_tiny_llama3_config.json'), 'rb').read())
put('tok_load', 'tok-tiny-unknown-template',
    tiny + b'\0' + open(os.path.join(data, 'tok_unknown_template_config.json'), 'rb').read())
put('tok_load', 'malformed', open(os.path.join(data, 'tok_malformed.json'), 'rb').read())
put('tok_load', 'unigram', open(os.path.join(data, 'tok_unigram.json'), 'rb').read())
vocab = {c: i for i, c in enumerate(['a', 'b', 'c', 'ab', 'abc', '\u0120', '\u0120a', '<0x41>'])}
small = {
    'added_tokens': [{'id': 8, 'content': '<s>', 'special': True, 'lstrip': True, 'rstrip': True},
                     {'id': 9, 'content': '<pad>', 'special': False}],
    'normalizer': {'type': 'Sequence', 'normalizers': [{'type': 'NFC'}]},
    'pre_tokenizer': {'type': 'Sequence', 'pretokenizers': [
        {'type': 'Split', 'pattern': {'String': ' '}, 'behavior': 'MergedWithNext', 'invert': False},
        {'type': 'ByteLevel', 'add_prefix_space': False, 'use_regex': True}]},
    'model': {'type': 'BPE', 'vocab': vocab, 'merges': ['a b', ['ab', 'c'], '\u0120 a'],
              'byte_fallback': True, 'ignore_merges': True},
}
cfg = b'{"bos_token": {"content": "<s>"}, "eos_token": "<pad>", "model_max_length": 1000000000000000019884624838656, "chat_template": [{"name": "default", "template": "{% for message in messages %}<|im_start|>{{ message.role }}\\n{{ message.content }}<|im_end|>\\n{% endfor %}"}]}'
put('tok_load', 'small-bpe', js(small).encode() + b'\0' + cfg)
small['pre_tokenizer'] = {'type': 'ByteLevel', 'add_prefix_space': True}
small['normalizer'] = None
put('tok_load', 'prefix-space', js(small).encode())
put('tok_load', 'bigint-in-string', b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "x": "12345678901234567890123"}, "y": 12345678901234567890123}')

# ---- tok_text: byte 0 = tokenizer (bit 0) | SPECIAL (2) | ADD_BOS (4) | SKIP_SPECIAL (8)
texts = {
    'english': (0, 'The quick brown fox jumps over the lazy dog. It\'s 42 degrees!'),
    'unicode': (1, 'd\u00e9j\u00e0 vu \u00c5ngstr\u00f6m A\u030a \u4f60\u597d \U0001f600 \u200b'),
    'specials': (2 | 8, '<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|im'),
    'specials-tiny': (3 | 4, '<|im_start|><think>x</think><|im_end|><|im'),
    'whitespace': (0, '  \t\n\n\r\n   x  \u00a0 \n'),
    'digits': (1, '3.14159 1,000,000 0x1F 2024-05-01'),
    'code': (0, 'int main(void) { return a->b[i] >> 2; } // \'s \'ll \'d'),
}
for name, (b0, t) in texts.items():
    put('tok_text', name, bytes([b0]) + t.encode())
put('tok_text', 'invalid-utf8', b'\x00ab\xff\xc3(\xe2\x82 \xf0\x9f\x98')
put('tok_text', 'ids', b'\x08' + bytes(range(256)))


# ---- model: config.json [NUL safetensors]
def safetensors(tensors, dtype='BF16', meta=True, lie=None):
    size = {'F32': 4, 'F16': 2, 'BF16': 2}[dtype]
    hdr, off = {}, 0
    if meta:
        hdr['__metadata__'] = {'format': 'pt'}
    for name, shape in tensors:
        n = size
        for d in shape:
            n *= d
        hdr[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [off, off + n]}
        off += n
    if lie:
        lie(hdr)
    h = js(hdr).encode()
    h += b' ' * (-len(h) % 8)
    return struct.pack('<Q', len(h)) + h + bytes(off)


def llama_tensors(V, H, I, L, Q, KV, D, bias=False, qk_norm=False, tie=True):
    t = [('model.embed_tokens.weight', [V, H]), ('model.norm.weight', [H])]
    if not tie:
        t.append(('lm_head.weight', [V, H]))
    for l in range(L):
        p = 'model.layers.%d.' % l
        t += [(p + 'input_layernorm.weight', [H]), (p + 'post_attention_layernorm.weight', [H]),
              (p + 'self_attn.q_proj.weight', [Q, H]), (p + 'self_attn.k_proj.weight', [KV, H]),
              (p + 'self_attn.v_proj.weight', [KV, H]), (p + 'self_attn.o_proj.weight', [H, Q]),
              (p + 'mlp.gate_proj.weight', [I, H]), (p + 'mlp.up_proj.weight', [I, H]),
              (p + 'mlp.down_proj.weight', [H, I])]
        if bias:
            t += [(p + 'self_attn.q_proj.bias', [Q]), (p + 'self_attn.k_proj.bias', [KV]),
                  (p + 'self_attn.v_proj.bias', [KV])]
        if qk_norm:
            t += [(p + 'self_attn.q_norm.weight', [D]), (p + 'self_attn.k_norm.weight', [D])]
    return t


def config(arch, **kw):
    c = {'architectures': [arch], 'vocab_size': 16, 'hidden_size': 8, 'intermediate_size': 12,
         'num_hidden_layers': 2, 'num_attention_heads': 2, 'num_key_value_heads': 1,
         'max_position_embeddings': 64, 'rms_norm_eps': 1e-5, 'tie_word_embeddings': True,
         'torch_dtype': 'bfloat16', 'bos_token_id': 1, 'eos_token_id': [2, 3]}
    c.update(kw)
    return js(c).encode()


base = llama_tensors(16, 8, 12, 2, 8, 4, 4)
put('model', 'llama', config('LlamaForCausalLM') + b'\0' + safetensors(base))
put('model', 'qwen2-bias', config('Qwen2ForCausalLM', tie_word_embeddings=False) + b'\0' +
    safetensors(llama_tensors(16, 8, 12, 2, 8, 4, 4, bias=True, tie=False), 'F32'))
put('model', 'qwen3-qk-norm', config('Qwen3ForCausalLM', head_dim=4, dtype='float16') + b'\0' +
    safetensors(llama_tensors(16, 8, 12, 2, 8, 4, 4, qk_norm=True), 'F16'))
put('model', 'llama3-rope', config('LlamaForCausalLM', rope_scaling={
    'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
    'original_max_position_embeddings': 8192}, rope_theta=500000.0) + b'\0' + safetensors(base))
nested = {'architectures': ['MistralForCausalLM'], 'text_config': json.loads(config('LlamaForCausalLM')),
          'rope_parameters': {'rope_theta': 1e6, 'rope_type': 'default'}}
put('model', 'nested-text-config', js(nested).encode() + b'\0' + safetensors(base))
put('model', 'model-type-only', js({'model_type': 'qwen2', 'vocab_size': 16, 'hidden_size': 8,
                                    'intermediate_size': 12, 'num_hidden_layers': 1,
                                    'num_attention_heads': 2}).encode())
put('model', 'ferry-config', open(os.path.join(src, 'models', 'ferry', 'config.json'), 'rb').read())


def lie_offsets(h):
    h['model.norm.weight']['data_offsets'] = [0, 1 << 40]


def lie_shape(h):
    h['model.norm.weight']['shape'] = [1 << 41]


put('model', 'lying-offsets', config('LlamaForCausalLM') + b'\0' + safetensors(base, lie=lie_offsets))
put('model', 'lying-shape', config('LlamaForCausalLM') + b'\0' + safetensors(base, lie=lie_shape))
put('model', 'header-past-end', config('LlamaForCausalLM') + b'\0' + struct.pack('<Q', 1 << 30) + b'{}')
# a header of no tensors: qsort(NULL, 0) was UB (found by the target)
put('model', 'empty-header', config('LlamaForCausalLM') + b'\0' + struct.pack('<Q', 2) + b'{}')
put('model', 'short', b'{}\0\x01\x02')

# ---- ini: byte 0 = daemon (0 kvferry-ctrld, 1 kvferry-worker, 2 kvferry-dataplane)
put('ini', 'ctrld', b'\0' + b'''# kvferry-ctrld
[http]
listen_address = 0.0.0.0
port = 8000
request_body_limit = 4M
[model]
model_dir = "/var/lib/kvferry/model"
max_context = 2048
chat_template = none
[engine]
stages = 0-4,4-8
backend = CPU
kv_memory = 512MiB
kv_mem_fraction = 0.5
plans = 1,8,64
[sched]
spec = off
step_budget = 2.5
[pd]
role = decode
prefill = 10.0.0.2:8998
[worker]
region = kvferry
[dp]
port = net_memif0
''')
put('ini', 'ctrld-bad', b'\0[http]\nport = 70000\n[engine]\nstages = 8-4\n[nope]\n')
put('ini', 'worker-instance', b'\x01' + b'''[worker]
region = r1
model = /m
in = 0:in
out = 0:out
depth = 1
[worker.stage1]
role = stage-one
threads = 2
[worker.other]
threads = 9
[http]
port = 1
''')
put('ini', 'worker-bad-instance', b'\x01[worker.bad name]\nx = 1\n')
put('ini', 'dataplane', b'\x02' + b'''[dp]
node_id = 1
port = net_memif0,socket=/run/kvferry/memif.sock
region = kvferry
ip = 10.0.0.1
peers = 2=02:00:00:00:00:02,10.0.0.2,47474 3=10.0.0.3
impair = loss=0.05,dup=0.01,reorder=0.02,corrupt=0.001,seed=7
rx_small = 128:65536
max_msgs = 32
window = 1024
tx_copy = yes
''')
put('ini', 'dataplane-bad', b'\x02[dp]\nport = p\nregion = r\nwindow = 1000\nip = 1.2.3.999\n')
put('ini', 'quotes-and-comments', b'\0; comment\n  # comment\n[http]\nlisten_address = "\n[ctrl]\n')

# ---- admin: byte 0 = bytes per read - 1
lines = [{'cmd': '/help'}, {'cmd': 'stages', 'params': {}}, {'cmd': '/pd/rooms', 'params': {'x': [1, 'y', None]}},
         {'cmd': 'status'}, {'cmd': 'drain'}, {'cmd': '/ctrl/status'}, {'cmd': 'nope'}, {'cmd': '/pd/nope'},
         {'cmd': '/http/requests', 'params': [1]}]
put('admin', 'session', b'\xff' + b''.join(js(l).encode() + b'\n' for l in lines))
put('admin', 'trickle', b'\x00' + js({'cmd': '/pd/status', 'params': {'k': 'v'}}).encode() + b'\n{"cmd":')
put('admin', 'malformed', b'\x07not json\n[]\n{"cmd": 1}\n\n{"cmd":"/help"} trailing\n')

# ---- pd_msg: the wire layout of ctrl/pd_msg.c, session 7
MAGIC, VER = 0x4450564b, 2


def hdr(kind, room, length, session=7):
    return struct.pack('<IHHQII', MAGIC, VER, kind, room, length, session)


def manifest(room, blocks, rank=0, cached=0, session=7):
    body = struct.pack('<III', rank, cached, len(blocks)) + b''.join(struct.pack('<I', b) for b in blocks)
    return hdr(1, room, 24 + len(body), session) + body


def status(room, rank=0, failed=0, first=42, cached=0, text=b'', lp=-0.5, top=(), session=7):
    body = struct.pack('<IIiII', rank, failed, first, cached, len(text)) + text + struct.pack('<fI', lp, len(top))
    body += b''.join(struct.pack('<If', i, p) for i, p in top)
    return hdr(2, room, 24 + len(body), session) + body


def abort(room, text=b'client gone', rank=0):
    body = struct.pack('<II', rank, len(text)) + text
    return hdr(3, room, 24 + len(body)) + body


put('pd_msg', 'manifest', manifest(1, [5, 6, 7], cached=20))
put('pd_msg', 'status-first-token', status(1, top=[(42, -0.5), (7, -1.25)]))
put('pd_msg', 'status-rank1-no-token', status(2, rank=1, first=-1))
put('pd_msg', 'status-failed', status(1, failed=1, first=-1, text=b'no room for the pages'))
put('pd_msg', 'status-bad-rank', status(1, rank=5))
put('pd_msg', 'status-bootstrapping', status(3))
put('pd_msg', 'status-failed-room', status(4))
put('pd_msg', 'status-other-session', status(1, session=8))
put('pd_msg', 'abort', abort(2))
put('pd_msg', 'abort-ack', hdr(4, 2, 28) + struct.pack('<I', 0))
put('pd_msg', 'bad-version', struct.pack('<IHHQII', MAGIC, 1, 2, 1, 24, 7))

# ---- http_stream: byte 0 = chat (bit 0) | finish << 1 (length, stop,
# cancelled, error); a request body; NUL; events of 3 bytes (id, 16 bits;
# control: bit 0 pump, bit 1 build, bits 2-6 top logprobs). The ids are
# models/ferry's encoding of "Hello there. The end is near.\n\nMore text
# follows, caf\u00e9 \u2615 and 123 numbers.<|im_end|>" (kvferry-tok encode).
ferry_ids = [5530, 640, 16, 400, 1057, 313, 3529, 16, 201, 201, 5511, 1392, 3512, 14, 277, 4665, 130, 105,
             4552, 249, 246, 304, 1733, 21, 2149, 16, 2]


def events(ids, ctl):
    return b''.join(struct.pack('<HB', i, ctl(k)) for k, i in enumerate(ids))


streams = {
    'completion-stop-held-back': (0, {'model': M, 'prompt': 'x', 'stream': True, 'stop': ['The end', 'zz'],
                                      'logprobs': 2}, lambda k: 3 | (2 << 2)),
    'chat-stop-newlines-usage': (1 | 1 << 1, {'model': M, 'messages': [{'role': 'user', 'content': 'hi'}],
                                              'stream': True, 'stream_options': {'include_usage': True},
                                              'stop': '\n\n', 'logprobs': True, 'top_logprobs': 3},
                                 lambda k: k % 4 | (3 << 2)),
    'completion-cancelled-utf8-stop': (2 << 1, {'model': M, 'prompt': 'x', 'stream': True,
                                                'stop': ['\u00e9 \u2615']}, lambda k: 1 if k % 3 else 2),
    'chat-error': (1 | 3 << 1, {'model': M, 'messages': [{'role': 'user', 'content': 'hi'}]}, lambda k: 0),
    'completion-no-stop': (0, {'model': M, 'prompt': 'x'}, lambda k: k & 3),
}
for name, (b0, body, ctl) in streams.items():
    put('http_stream', name, bytes([b0]) + js(body).encode() + b'\0' + events(ferry_ids, ctl))
