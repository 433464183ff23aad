#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Chat templates checked against their reference.

kvferry renders chat prompts in C (kernels/kn_tok_chat.c) instead of running
the model's Jinja template. This test renders every template we claim to
support with python3-jinja2, in the environment Hugging Face transformers'
apply_chat_template builds (trim_blocks, lstrip_blocks, loop controls, its
own tojson, raise_exception, strftime_now, the tokenizer's special tokens as
variables), over a set of conversations, with add_generation_prompt off and
on, and compares string for string with what `kvferry-tok chat` renders for
the same template.

  chat_reference.py KVFERRY_TOK KVFERRY_MKMODEL SOURCE_ROOT WORK_DIR

Templates: tests/kernels/data/chat/*.jinja (written for this test in the form
the ChatML/Qwen and Llama 3 families publish them; llama*.jinja get the Llama
3 special tokens), the templates of tests/kernels/data/tok_tiny*, every
models/*/tokenizer_config.json (or chat_template.jinja) that carries one (so
a model added there is checked without touching this file), and what
kvferry-mkmodel writes for each architecture.

The one allowed difference: where a template silently drops a message
(Qwen 2.5 and 3 render no turn for a role they do not know), the C renderer
refuses the conversation instead (-EINVAL, a 400 from the HTTP API). The test
checks that the template really does drop it: the render without those
messages must equal the render with them.

Exits 77 (skip) when jinja2 is missing.
"""
import datetime
import glob
import json
import os
import subprocess
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("python3-jinja2 is not installed (scripts/install-deps): skipping")
    sys.exit(77)


def make_env():
    """The Jinja environment transformers renders chat templates in."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def m(role, content):
    return {"role": role, "content": content}


THINK = "<think>\nFirst the plan.\n\n</think>\n\nThe answer."

# (name, messages). Every role the renderers know, the whitespace each
# family strips (Llama 3's trim is Python's str.strip: Unicode spaces too),
# text that looks like template syntax, Qwen 3's reasoning split.
CASES = [
    ("system_and_user", [m("system", "You are terse."), m("user", "Hello!")]),
    ("user_only", [m("user", "What is 2 + 2?")]),
    ("multi_turn_with_system", [m("system", "Be brief."), m("user", "hi"), m("assistant", "hello"),
                                m("user", "how are you?")]),
    ("multi_turn_ending_with_assistant", [m("user", "one"), m("assistant", "two"), m("user", "three"),
                                          m("assistant", "four")]),
    ("long_conversation", [m("system", "S")] + [m("user" if i % 2 == 0 else "assistant", "turn %d" % i)
                                                for i in range(9)]),
    ("empty_contents", [m("system", ""), m("user", ""), m("assistant", ""), m("user", "")]),
    ("empty_system_only", [m("system", "")]),
    ("system_only", [m("system", "Nothing else follows.")]),
    ("assistant_only", [m("assistant", "I speak first.")]),
    ("second_system_later", [m("user", "a"), m("system", "Now be formal."), m("user", "b")]),
    ("system_not_first", [m("user", "first"), m("system", "late system")]),
    ("ascii_whitespace", [m("system", "\n\t sys  \r\n"), m("user", "  padded  \n"),
                          m("assistant", "\n\nreply\n\n"), m("user", "\x0b\x0cvt ff\x1c\x1f")]),
    ("unicode_whitespace", [m("system", "\u00a0\u3000sys\u2003\u2028"), m("user", "\u0085\u1680hi\u202f\u205f"),
                            m("assistant", "\u2000\u200aok\u2029\u00a0"), m("user", "\u200bzero width is not space\u200b")]),
    ("template_syntax_and_quotes", [m("user", "{{ messages }} {% if x %}y{% endif %} {# c #} 'single' \"double\" \\n \\"),
                                    m("assistant", "<|im_start|>user\nfake<|im_end|> <|eot_id|>")]),
    ("non_ascii", [m("system", "Réponds en français."), m("user", "你好 \U0001F600 naïve café"),
                   m("assistant", "Ça va ? \u00e9\u0301")]),
    ("newlines_inside", [m("user", "line 1\nline 2\n\nline 4"), m("assistant", "a\r\nb")]),
    ("tool_results", [m("system", "Use tools."), m("user", "weather?"), m("assistant", "calling"),
                      m("tool", "{\"temp\": 21}"), m("tool", "second \"result\"\n\t\x01 é"), m("user", "thanks")]),
    ("tool_first", [m("tool", "orphan result"), m("user", "ok")]),
    ("tool_last", [m("user", "q"), m("assistant", ""), m("tool", "  spaced  ")]),
    ("ipython_role", [m("user", "run it"), m("ipython", "output\n")]),
    ("unknown_role", [m("system", "sys"), m("developer", "Be nice."), m("user", "hi")]),
    ("reasoning_in_history", [m("user", "q1"), m("assistant", THINK), m("user", "q2"),
                              m("assistant", "<think>\nlast thoughts\n</think>\n\nlast answer")]),
    ("reasoning_after_query_not_last", [m("user", "q"), m("assistant", "<think>\n\nr1\n\n</think>a1"),
                                        m("tool", "res"), m("assistant", "no reasoning here"),
                                        m("tool", "res2"), m("assistant", "<think></think>\n\n\nfinal")]),
    ("reasoning_split_twice", [m("user", "q"), m("assistant", "x<think>a<think>\nb\n</think>c</think>\nd")]),
    ("reasoning_unclosed", [m("user", "q"), m("assistant", "<think>never closed")]),
    ("tool_response_as_user", [m("user", "real query"), m("assistant", "<think>t</think>x"),
                               m("user", "<tool_response>\nr\n</tool_response>"), m("assistant", "<think>u</think>y")]),
]


def token_text(v):
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


_compiled = {}


def render_jinja(env, tmpl, cfg, msgs, gen, think=None, tools=None):
    if tmpl not in _compiled:
        _compiled[tmpl] = env.from_string(tmpl)
    kw = {} if think is None else {"enable_thinking": think}
    for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
        t = token_text(cfg.get(k))
        if t is not None:
            kw[k] = t
    # as apply_chat_template calls it (tools as vLLM passes them: the
    # request's list, each tool call's arguments a dict)
    return _compiled[tmpl].render(messages=msgs, tools=tools, documents=None,
                                  add_generation_prompt=gen, **kw)


def render_c(tok, tokenizer, config, cases, gen, think=None):
    cmd = [tok, "chat", "--tokenizer", tokenizer, "--config", config] + (["--gen"] if gen else []) + \
        (["--no-thinking"] if think is False else [])
    inp = "".join(json.dumps(c[1] if len(c) == 2 else {"messages": c[1], "tools": c[2]}, ensure_ascii=False) + "\n"
                  for c in cases)
    p = subprocess.run(cmd, input=inp.encode(), capture_output=True)
    # split on "\n" only: str.splitlines() also breaks at U+2028, U+0085, ...
    lines = p.stdout.decode().split("\n")[:-1]
    if len(lines) != len(cases):
        raise RuntimeError("%s: %d lines for %d conversations; stderr: %s" %
                           (" ".join(cmd), len(lines), len(cases), p.stderr.decode()))
    return [json.loads(line) for line in lines]


def drops_a_message(env, tmpl, cfg, msgs, gen, want, think=None):
    """Whether the template renders nothing for one of the messages: the
    conversation without it renders the same."""
    for i in range(len(msgs)):
        rest = msgs[:i] + msgs[i + 1:]
        try:
            if rest and render_jinja(env, tmpl, cfg, rest, gen, think) == want:
                return True
        except jinja2.exceptions.TemplateError:
            pass
    return False


def first_diff(a, b):
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


def call(name, args, cid="call_1"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city, \"quoted\" and \u00e9 \u4f60\n",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "the city"},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 10, "default": 3},
        "ratio": {"type": "number", "multipleOf": 0.1, "examples": [1.5, 100.0, 1e-05, 1e+16, 12345678.9, -0.0]},
        "deep": {"type": "array", "items": {"type": "object", "properties": {}}, "x": [True, False, None, {}, []]}},
        "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}

# (name, messages, tools): tool definitions and tool calls, as an OpenAI
# client sends them and vLLM hands them to the template.
TOOL_CASES = [
    ("tools_user_only", [m("user", "weather in Paris?")], [WEATHER]),
    ("tools_with_system", [m("system", "You are a weather bot."), m("user", "Paris?")], [WEATHER, CLOCK]),
    ("tools_round_trip", [m("system", "S"), m("user", "weather and time?"),
                          {"role": "assistant", "content": "Let me look.",
                           "tool_calls": [call("get_weather", {"city": "Paris", "days": 2, "ratio": 0.5}),
                                          call("now", {}, "call_2")]},
                          m("tool", "{\"temp\": 21}"), m("tool", "12:00"), m("assistant", "21 degrees at noon."),
                          m("user", "thanks")], [WEATHER, CLOCK]),
    ("tools_call_without_content", [m("user", "q"),
                                    {"role": "assistant", "content": None,
                                     "tool_calls": [call("get_weather", {"city": "\u00c9vian \"x\"\n"})]},
                                    m("tool", "r")], [WEATHER]),
    ("tools_reasoning_and_calls", [m("user", "q"),
                                   {"role": "assistant", "content": "<think>\nplan\n</think>\n\nok",
                                    "tool_calls": [call("now", {})]},
                                   m("tool", "r")], [CLOCK]),
    ("tool_calls_without_tools", [m("user", "q"), {"role": "assistant", "content": "",
                                                   "tool_calls": [call("now", {"a": [1, 2.25]})]}], []),
]


def check_tools(env, tok, name, tmpl, tokenizer, cfg_path, cfg):
    """The tool cases: equal to jinja2 where the C renderer renders them; a
    template that lists tools in <tools> (Qwen 2.5, 3) or in the first user
    message (Llama 3.1+) must, unless its Jinja raises. Returns
    (failures, compared, refused)."""
    fails = compared = refused = 0
    for gen in (False, True):
        got = render_c(tok, tokenizer, cfg_path, TOOL_CASES, gen)
        for (case, msgs, tools), c in zip(TOOL_CASES, got):
            try:
                want = render_jinja(env, tmpl, cfg, msgs, gen, tools=tools)
            except Exception:  # noqa: BLE001 (a template without tools may trip on a null content)
                want = None
            if "error" in c:
                has_tools = ("<tools>" in tmpl and "<tool_call>" in tmpl) or \
                    ("Environment: ipython" in tmpl and "tools_in_user_message" in tmpl)
                if has_tools and want is not None:
                    print("FAIL %s %s gen=%d: the C renderer refused tools (%s) on a template that has them" %
                          (name, case, gen, c["error"]))
                    fails += 1
                else:
                    refused += 1
                continue
            compared += 1
            if c["prompt"] != want:
                i = first_diff(want or "", c["prompt"])
                print("FAIL %s %s gen=%d: differs at offset %d\n  jinja2: %r\n  C:      %r" %
                      (name, case, gen, i, (want or "")[max(0, i - 40):i + 60], c["prompt"][max(0, i - 40):i + 60]))
                fails += 1
    return fails, compared, refused


def check_template(env, tok, name, tmpl, tokenizer, base_cfg_path, work):
    """Compare every case with gen off and on; return the number of failures."""
    with open(base_cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["chat_template"] = tmpl
    cfg_path = os.path.join(work, name.replace("/", "_") + ".tokenizer_config.json")
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False)
    fails = compared = refused = 0
    # and chat_template_kwargs {"enable_thinking": false} (Qwen 3 reads it)
    for gen, think in ((False, None), (True, None), (True, False)):
        got = render_c(tok, tokenizer, cfg_path, CASES, gen, think)
        for (case, msgs), c in zip(CASES, got):
            try:
                want = render_jinja(env, tmpl, cfg, msgs, gen, think)
            except jinja2.exceptions.TemplateError as e:
                want = None
                why = str(e)
            if "error" in c:
                if want is None:
                    refused += 1  # both refuse
                    continue
                if drops_a_message(env, tmpl, cfg, msgs, gen, want, think):
                    refused += 1  # the template drops a message; C refuses instead
                    continue
                print("FAIL %s %s gen=%d: the C renderer refused (%s); jinja2 renders %r" %
                      (name, case, gen, c["error"], want))
                fails += 1
                continue
            if want is None:
                print("FAIL %s %s gen=%d: jinja2 raises (%s); the C renderer gives %r" %
                      (name, case, gen, why, c["prompt"]))
                fails += 1
                continue
            compared += 1
            if c["prompt"] != want:
                i = first_diff(want, c["prompt"])
                print("FAIL %s %s gen=%d: differs at offset %d\n  jinja2: %r\n  C:      %r" %
                      (name, case, gen, i, want[max(0, i - 40):i + 60], c["prompt"][max(0, i - 40):i + 60]))
                fails += 1
    tf, tc, tr = check_tools(env, tok, name, tmpl, tokenizer, cfg_path, cfg)
    fails += tf
    print("%-4s %-44s %3d renders equal, %d refused where the template drops a message; tools: %d equal, %d "
          "refused" % ("ok" if not fails else "FAIL", name, compared, refused, tc, tr))
    return fails


def main():
    if len(sys.argv) != 5:
        print(__doc__)
        return 2
    tok, mkmodel, root, work = sys.argv[1:]
    os.makedirs(work, exist_ok=True)
    data = os.path.join(root, "tests", "kernels", "data")
    tiny_tok = os.path.join(data, "tok_tiny", "tokenizer.json")
    chatml_cfg = os.path.join(data, "tok_tiny", "tokenizer_config.json")
    llama_cfg = os.path.join(data, "tok_tiny_llama3_config.json")
    env = make_env()
    targets = []  # (name, template, tokenizer.json, tokenizer_config.json for the special tokens)

    for path in sorted(glob.glob(os.path.join(data, "chat", "*.jinja"))):
        with open(path, encoding="utf-8") as f:
            tmpl = f.read()
        base = os.path.basename(path)
        targets.append(("chat/" + base, tmpl, tiny_tok, llama_cfg if base.startswith("llama") else chatml_cfg))

    def from_config(name, tokenizer, cfg_path):
        with open(cfg_path, encoding="utf-8") as f:
            t = json.load(f).get("chat_template")
        if isinstance(t, list):
            t = next((x["template"] for x in t if x.get("name") == "default"), None)
        jinja = os.path.join(os.path.dirname(cfg_path), "chat_template.jinja")
        if os.path.exists(jinja):  # transformers reads it in preference, as kn_tok_open does
            with open(jinja, encoding="utf-8") as f:
                t = f.read()
        if isinstance(t, str):
            targets.append((name, t, tokenizer, cfg_path))

    from_config("tok_tiny", tiny_tok, chatml_cfg)
    from_config("tok_tiny_llama3_config", tiny_tok, llama_cfg)
    models = sorted(glob.glob(os.path.join(root, "models", "*", "tokenizer_config.json")))
    for cfg_path in models:
        d = os.path.dirname(cfg_path)
        from_config("models/" + os.path.basename(d), os.path.join(d, "tokenizer.json"), cfg_path)
    for arch in ("llama", "qwen2", "qwen3"):
        out = os.path.join(work, "mkmodel-" + arch)
        subprocess.run([mkmodel, "--out", out, "--preset", "tiny", "--arch", arch], check=True,
                       stdout=subprocess.DEVNULL)
        from_config("kvferry-mkmodel --arch " + arch, os.path.join(out, "tokenizer.json"),
                    os.path.join(out, "tokenizer_config.json"))

    fails = sum(check_template(env, tok, *t, work) for t in targets)
    print("%d templates x %d conversations x add_generation_prompt off/on/on with enable_thinking false: %s" %
          (len(targets), len(CASES), "%d mismatches" % fails if fails else "all equal"))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
