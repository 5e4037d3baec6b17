#!/usr/bin/env python3
"""acpo on CUDA against HF transformers on the same GPU (issue #18), for a random model of the
Qwen3-0.6B shape written by `acpo model init`: teacher-forced log-probabilities and entropies
in f32 and bf16 (the greedy continuation and the tiny models' logits are checked by the CUDA
tests against transformers' fixtures). Writes parity.json under OUT and prints a table.

    python3 tools/gpu/parity.py --acpo ACPO_CUDA_BINARY --out OUT [--tokenizer DIR]

Needs torch + transformers (the GPU machines have them). With --tokenizer (the real Qwen3
tokenizer directory) the sequences are tokenized benchmark-like texts; without it, random ids.
"""
import argparse
import json
import os
import random
import subprocess
import sys

import torch
import transformers

QWEN3_0_6B = dict(  # the shape of Qwen/Qwen3-0.6B's config.json
    architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=1024,
    intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
    tie_word_embeddings=True, attention_bias=False, hidden_act="silu", initializer_range=0.02,
    bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16",
)
TEXTS = [
    "Let $x$ be a real number such that $x^2 - 5x + 6 = 0$. Find the sum of all possible values of $x$.",
    "A bag has 3 red balls and 5 blue balls. Two balls are drawn without replacement. What is the probability that both are red?",
    "Compute $\\int_0^1 x e^{x}\\,dx$ and give the answer in simplest form.",
]


def run(cmd):
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def hf_scores(model_dir, seqs, dtype):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=dtype, attn_implementation="sdpa").cuda().eval()
    out = []
    with torch.no_grad():
        for ids in seqs:
            x = torch.tensor([ids], device="cuda")
            logits = model(x).logits[0, :-1].float()
            lsm = torch.log_softmax(logits, dim=-1)
            lp = lsm.gather(1, x[0, 1:, None])[:, 0]
            ent = -(lsm.exp() * lsm).sum(-1)
            out.append((lp.cpu().tolist(), ent.cpu().tolist()))
    return model, out


def compare(acpo_file, hf):
    got = [json.loads(l) for l in open(acpo_file)]
    dlp = max(abs(a - b) for g, (lp, _) in zip(got, hf) for a, b in zip(g["log_probs"], lp))
    dent = max(abs(a - b) for g, (_, ent) in zip(got, hf) for a, b in zip(g["entropy"], ent))
    return dlp, dent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--acpo", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model_dir = os.path.join(args.out, "qwen3-0.6b-random")
    cfg = os.path.join(args.out, "qwen3-0.6b.json")
    json.dump(QWEN3_0_6B, open(cfg, "w"), indent=1)
    if not os.path.exists(model_dir):
        run([args.acpo, "model", "init", "--config", cfg, "--out", model_dir, "--seed", "0"])
    if args.tokenizer:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
        seqs = [tok.encode(t).ids for t in TEXTS]
    else:
        rng = random.Random(0)
        seqs = [[rng.randrange(QWEN3_0_6B["vocab_size"]) for _ in range(n)] for n in (17, 64, 200)]
    ids_file = os.path.join(args.out, "ids.jsonl")
    with open(ids_file, "w") as f:
        for s in seqs:
            f.write(json.dumps({"ids": s}) + "\n")
    report = {"torch": torch.__version__, "transformers": transformers.__version__,
              "gpu": torch.cuda.get_device_name(0), "sequences": [len(s) for s in seqs], "rows": []}
    for name, dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
        scored = os.path.join(args.out, f"acpo-{name}.jsonl")
        run([args.acpo, "model", "logprobs", "--model", model_dir, "--input", ids_file,
             "--output", scored, "--device", "cuda", "--dtype", name])
        model, hf = hf_scores(model_dir, seqs, dtype)
        dlp, dent = compare(scored, hf)
        row = {"dtype": name, "max_abs_log_prob_diff": dlp, "max_abs_entropy_diff": dent}
        report["rows"].append(row)
        del model
        torch.cuda.empty_cache()
    json.dump(report, open(os.path.join(args.out, "parity.json"), "w"), indent=1)
    print(f"{'dtype':6} {'max |Δ log p|':>14} {'max |Δ H|':>12}")
    for r in report["rows"]:
        print(f"{r['dtype']:6} {r['max_abs_log_prob_diff']:14.2e} {r['max_abs_entropy_diff']:12.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
