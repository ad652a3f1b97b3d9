// Runs Transformers.js on packages written by hfx.package and prints what it produced as one JSON line.
// node transformers_js_run.mjs <node prefix> <job.json>; the job names the packages, prompts and texts.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const [prefix, jobFile] = process.argv.slice(2);
const { env, pipeline } = createRequire(`${prefix}/`)("@huggingface/transformers");
const job = JSON.parse(readFileSync(jobFile, "utf8"));
env.allowRemoteModels = false;
env.localModelPath = job.root;

const result = { generate: {}, text: {}, extract: {} };
for (const { key, path, dtype, prompts, new_tokens } of job.generate) {
  const generator = await pipeline("text-generation", path, { dtype });
  const greedy = { max_new_tokens: new_tokens, min_new_tokens: new_tokens, do_sample: false };
  result.generate[key] = [];
  result.text[key] = [];
  for (const prompt of prompts) {
    const inputs = generator.tokenizer(prompt);
    const ids = await generator.model.generate({ ...inputs, ...greedy });
    result.generate[key].push(Array.from(ids.data, Number).slice(inputs.input_ids.dims[1]));
    const [out] = await generator(prompt, { ...greedy, return_full_text: false });
    result.text[key].push(out.generated_text);
  }
}
for (const { key, path, texts } of job.extract) {
  const extractor = await pipeline("feature-extraction", path);
  const out = await extractor(texts);
  result.extract[key] = { dims: out.dims, data: Array.from(out.data) };
}
console.log(JSON.stringify(result));
