# SPDX-License-Identifier: Apache-2.0
"""The tokenizer of models/ferry: byte-level BPE trained with Hugging Face
`tokenizers` on the corpus that scripts/corpus prepares.

Chosen for what kvferry's tokenizer (kernels/kn_tok_*) reads exactly, so the
C encoder and `tokenizers` give the same ids (kernels/TOKENIZER.md):
  - model BPE, no byte_fallback, no continuing-subword prefix;
  - no normalizer; pre-tokenizer ByteLevel with GPT-2's split regex
    (use_regex), no prefix space; ByteLevel decoder;
  - three special tokens, ids 0..2: <|endoftext|> (ends every document),
    <|im_start|> and <|im_end|> (ChatML turns; kn_tok picks its ChatML
    family from the template's <|im_start|>).

Imported by train.py; nothing here runs on import.
"""
import json
import os

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML in the form kn_tok_chat.c renders (no default system block, no
# trimming), written for this model. The generation prompt opens the
# assistant turn; the model closes it with <|im_end|>.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts, vocab_size):
    """Train byte-level BPE on an iterable of strings. Returns a tokenizers.Tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def write_files(tok, out, model_max_length):
    """tokenizer.json + tokenizer_config.json (chat template inside, where
    kn_tok reads it) through transformers' own save_pretrained."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None, bos_token=None,
                                   model_max_length=model_max_length,
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    # Recent transformers write the template to chat_template.jinja; the
    # loaders that read tokenizer_config.json only (kn_tok) need it there.
    cfgp = os.path.join(out, "tokenizer_config.json")
    with open(cfgp) as f:
        cfg = json.load(f)
    jinja = os.path.join(out, "chat_template.jinja")
    if os.path.exists(jinja):
        os.remove(jinja)
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["eos_token"] = "<|im_end|>"
    cfg["pad_token"] = "<|endoftext|>"
    cfg["bos_token"] = None
    cfg["add_bos_token"] = False
    cfg["model_max_length"] = model_max_length
    cfg.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    with open(cfgp, "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    for extra in ("special_tokens_map.json",):
        p = os.path.join(out, extra)
        if os.path.exists(p):
            os.remove(p)
    return fast
