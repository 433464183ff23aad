// SPDX-License-Identifier: Apache-2.0
// Compare kvferry-tok's ids with @lenml/tokenizers' and check the round trip.
//
//   node tok_check.mjs --model NAME --corpus C.jsonl --ours O.jsonl --ref R.jsonl
//                      --decoded D.jsonl --diffs DIFFS.json --tokenizer tokenizer.json [--record]
//
// Every string must get the @lenml ids, except those listed under NAME in
// DIFFS.json: there @lenml is known to disagree with Hugging Face tokenizers
// (ECMAScript's \s counts U+FEFF as space and not U+0085; tokenizers'
// Oniguruma and PCRE2 use Unicode White_Space, the other way round). For a
// listed string our ids must equal "hf" (the ids tokenizers gives, recorded
// by hf_tok_compare.py) or, until those are recorded, the "ours" pinned when
// the list was made; @lenml's ids must still be the recorded "lenml" ones.
// decode(encode(s)) must give back s for every string, or NFC(s) when the
// --tokenizer file's normalizer is NFC (a decomposed input cannot come back).
// --record rewrites NAME's list from this run's disagreements (keeping "hf").
import fs from "fs";

const arg = (k) => { const i = process.argv.indexOf(k); return i > 0 ? process.argv[i + 1] : null; };
const lines = (f) => fs.readFileSync(f, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l));
const model = arg("--model");
const corpus = lines(arg("--corpus")).map((o) => o.text);
const ours = lines(arg("--ours"));
const ref = lines(arg("--ref")).map((o) => o.ids);
const decoded = lines(arg("--decoded"));
const diffsPath = arg("--diffs");
const record = process.argv.includes("--record");
const tj = arg("--tokenizer") ? JSON.parse(fs.readFileSync(arg("--tokenizer"), "utf8")) : {};
const nfc = tj.normalizer?.type === "NFC";
const diffs = fs.existsSync(diffsPath) ? JSON.parse(fs.readFileSync(diffsPath, "utf8")) : {};
const listed = new Map((diffs[model] ?? []).map((d) => [d.text, d]));
const same = (a, b) => Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => x === b[i]);

if (ours.length !== corpus.length || ref.length !== corpus.length || decoded.length !== corpus.length) {
  console.log(`${model}: line counts differ: corpus ${corpus.length}, ours ${ours.length}, ref ${ref.length}, decoded ${decoded.length}`);
  process.exit(1);
}
let agree = 0, known = 0, hfChecked = 0, roundTrip = 0;
const failures = [], newList = [];
corpus.forEach((text, i) => {
  const o = ours[i].ids, r = ref[i];
  if (!o) failures.push(`error ${JSON.stringify(ours[i])} for ${JSON.stringify(text)}`);
  if (decoded[i].text === (nfc ? text.normalize("NFC") : text)) roundTrip++;
  else failures.push(`round trip: ${JSON.stringify(text)} came back as ${JSON.stringify(decoded[i].text)}`);
  const d = listed.get(text);
  if (record) {
    if (!same(o, r)) newList.push({ text, lenml: r, ours: o, hf: d?.hf ?? null });
    return;
  }
  if (!d) {
    if (same(o, r)) agree++;
    else failures.push(`${JSON.stringify(text)}: ours ${JSON.stringify(o)} @lenml ${JSON.stringify(r)}`);
    return;
  }
  known++;
  const want = d.hf ?? d.ours;
  if (d.hf) hfChecked++;
  if (!same(o, want))
    failures.push(`${JSON.stringify(text)} (listed): ours ${JSON.stringify(o)} expected ${JSON.stringify(want)} (${d.hf ? "tokenizers" : "pinned"})`);
  if (!same(r, d.lenml))
    failures.push(`${JSON.stringify(text)} (listed): @lenml now gives ${JSON.stringify(r)}, recorded ${JSON.stringify(d.lenml)}`);
});
if (record) {
  diffs[model] = newList;
  fs.writeFileSync(diffsPath, JSON.stringify(diffs, null, 1) + "\n");
  console.log(`${model}: recorded ${newList.length} strings where @lenml disagrees`);
  process.exit(0);
}
for (const f of failures.slice(0, 20)) console.log("FAIL " + f);
console.log(`${model}: ${corpus.length} strings: ${agree} equal to @lenml, ${known} listed @lenml differences ` +
  `(${hfChecked} checked against tokenizers' ids), ${failures.length} failures; round trip ${roundTrip}/${corpus.length}`);
process.exit(failures.length ? 1 : 0);
