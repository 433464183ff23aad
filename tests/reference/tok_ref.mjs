// SPDX-License-Identifier: Apache-2.0
// Reference ids from @lenml/tokenizers: `node tok_ref.mjs MODEL_DIR < corpus.jsonl`
// reads {"text": ...} lines and writes {"ids": [...]} lines, encoding as
// Hugging Face's encode(text, add_special_tokens=False) does (special-token
// text becomes the special token). MODEL_DIR holds tokenizer.json and
// tokenizer_config.json.
import { TokenizerLoader } from "@lenml/tokenizers";
import fs from "fs";
import readline from "readline";

const dir = process.argv[2];
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(dir + "/tokenizer.json", "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(dir + "/tokenizer_config.json", "utf8")),
});
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
const lines = [];
for await (const line of rl) {
  if (!line) continue;
  const { text } = JSON.parse(line);
  lines.push(JSON.stringify({ ids: tok.encode(text, { add_special_tokens: false }) }));
}
process.stdout.write(lines.join("\n") + "\n");
