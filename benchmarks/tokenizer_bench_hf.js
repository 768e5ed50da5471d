// The Hugging Face reference (npm tokenizers, its Rust core) on the same text file: one encode
// call, best of 3, single thread. Usage: node tokenizer_bench_hf.js TOKENIZER_JSON TEXT_FILE
const { Tokenizer } = require("tokenizers");
const fs = require("fs");
(async () => {
  const tokenizer = Tokenizer.fromFile(process.argv[2]);
  const text = fs.readFileSync(process.argv[3], "utf8");
  const bytes = Buffer.byteLength(text, "utf8");
  let best = 1e9, ids = 0;
  for (let round = 0; round < 3; ++round) {
    const t = process.hrtime.bigint();
    const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
    best = Math.min(best, Number(process.hrtime.bigint() - t) / 1e9);
    ids = encoding.getIds().length;
  }
  console.log(`RESULT impl=hf_tokenizers bytes=${bytes} ids=${ids} seconds=${best.toFixed(3)} mb_per_s=${(bytes / best / 1e6).toFixed(2)}`);
})();
