// SPDX-License-Identifier: Apache-2.0
// Deterministic tokenizer test corpus: `node tok_corpus.mjs [count]` writes
// JSON lines {"text": ...} to stdout. The same count always gives the same
// strings (seeded PRNG), so ids recorded from Hugging Face tokenizers for a
// string stay valid. Categories: several scripts, emoji (skin tones, ZWJ
// sequences, flags, keycaps), zero-width characters and U+FEFF, whitespace
// runs, digit runs, code, contractions, special-token text.

const count = Number(process.argv[2] ?? 2400);

let seed = 0x6b766672; // mulberry32
function rnd() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));

const fragments = {
  latin: ["café", "naïve", "résumé", "Ångström", "façade", "jalapeño", "Übermaß",
    "straße", "cœur", "Dvořák", "Łódź", "São Paulo", "hello", "world", "The quick brown fox",
    "e\u0301", "A\u030A", "n\u0303o", "ﬁne", "Ǆemal", "İstanbul", "ıi", "ſtate"],
  cjk: ["你好", "世界", "中华人民共和国", "東京都", "ひらがな", "カタカナ", "한국어", "안녕하세요",
    "漢字かな交じり文", "（全角）", "。、「」", "𠮷野家", "〇一二三"],
  arabic: ["مرحبا", "السلام عليكم", "العربية", "ﷺ", "٠١٢٣٤٥٦٧٨٩"],
  devanagari: ["नमस्ते", "हिन्दी", "क्षत्रिय", "१२३४"],
  cyrillic: ["Привет", "мир", "Ёжик", "ЩЪЫЬ", "україна"],
  other: ["Γειά σου", "שלום", "สวัสดี", "ሰላም", "Ελληνικά", "ქართული", "Tiếng Việt"],
  emoji: ["😀", "👍", "👍🏽", "👩🏿‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸🇬🇧", "1️⃣", "❤️", "🤷‍♀️",
    "🧑🏻‍🤝‍🧑🏼", "🐈‍⬛", "✨", "🎉🎉🎉", "©️", "™"],
  zw: ["\u200B", "\u200C", "\u200D", "\u2060", "\u00AD", "\u200E", "\u200F"],
  bom: ["\uFEFF", "\uFEFF\uFEFF"],
  space: [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n ", "\u00A0", "\u3000",
    "\u2028", "\u2003", " \t \n", "\n\n\n\n", "        ", "\u0085"],
  digits: ["0", "7", "42", "123", "2024", "12345", "3.14159", "1,000,000", "000", "9876543210",
    "1e-9", "0x1F", "12345678901234567890", "-17", "٣"],
  code: ["int main(void) {\n    return 0;\n}", "def f(x):\n\treturn x ** 2\n",
    "for (i = 0; i < n; i++) a[i] += b[i];", "{\"key\": [1, 2, 3], \"ok\": true}",
    "#include <stdio.h>", "x => x.map(y => y * 2)", "SELECT * FROM t WHERE id = 7;",
    "if err != nil {\n\t\treturn err\n\t}", "    indented\n        more", "a&&b||!c", "<div class=\"x\">",
    "printf(\"%d\\n\", n);", "$HOME/.config", "ls -la | grep '^d'", "// comment */ /* x"],
  contractions: ["I'm", "I'M", "you're", "YOU'RE", "You'Re", "it's", "IT'S", "don't", "DON'T",
    "Don'T", "we've", "WE'VE", "they'll", "THEY'LL", "he'd", "HE'D", "'s", "'t", "''", "'S'",
    "rock 'n' roll", "it\u2019s"],
  special: ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<think>", "</think>", "<|im_start", "im_end|>",
    "<|im_start|>user\nhi<|im_end|>", "<|reserved_special_token_3|>", "<|fake_token|>", "< |im_start| >"],
  punct: [",", ".", "!", "?", "...", "—", "–", "…", "«»", "¿", "¡", "@#$%^&*", "()", "[]", "{}",
    "\"quoted\"", "'single'", "~/", "\\", "|", ":-)", "¯\\_(ツ)_/¯"],
};
const cats = Object.keys(fragments);
const seps = ["", " ", " ", " ", "", "\n", "\t", "  ", "\uFEFF", "\u200D"];

const out = new Set();
// Every fragment alone, and each with text around it.
for (const c of cats)
  for (const f of fragments[c]) {
    out.add(f);
    out.add("x" + f + "y");
    out.add("Hello " + f + " world");
  }
// BOM at the start and after text in every position that matters.
for (const f of ["hi", "Hello world", "你好", " a", "\n", "123", "<|im_start|>"]) {
  out.add("\uFEFF" + f);
  out.add(f + "\uFEFF");
  out.add(f + " \uFEFF" + f);
  out.add(f + "\uFEFF " + f);
}
// Digit runs of every length 1..24.
for (let n = 1; n <= 24; n++) {
  let d = "";
  for (let i = 0; i < n; i++) d += String(int(0, 9));
  out.add(d);
  out.add("x" + d + " " + d);
}
// Whitespace runs of many shapes.
for (let n = 1; n <= 40; n++) {
  let w = "";
  for (let i = 0; i < n; i++) w += pick([" ", " ", "\t", "\n", "\r\n", "\r"]);
  out.add("a" + w + "b");
  out.add(w);
}
// Random mixtures until the count is reached.
while (out.size < count) {
  const k = int(1, 7);
  let s = "";
  for (let i = 0; i < k; i++) {
    if (i) s += pick(seps);
    s += pick(fragments[pick(cats)]);
  }
  out.add(s);
}
for (const s of out) process.stdout.write(JSON.stringify({ text: s }) + "\n");
