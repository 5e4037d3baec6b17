#!/usr/bin/env python3
"""Reference fixtures for src/model (issue 4), made with PyTorch + transformers on CPU.

Writes into tests/fixtures/:
  tiny-qwen3/      a random Qwen3 (tied embeddings, head_dim != hidden/heads, GQA), HF layout
  tiny-qwen2/      a random Qwen2 (q/k/v biases, untied lm_head), saved *sharded* (index.json)
  model_reference.json   logits for fixed token ids, a greedy continuation (full recompute
                         each step), Qwen3 tokenizer ids for benchmark problems, and the chat
                         template rendered by transformers for a user message.

Run once (not in CI), from the repository root, with torch + transformers from PyPI:
  python3 tools/oracles/ref_model.py
"""
import json
import os
import torch
import transformers
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

OUT = "tests/fixtures"
torch.manual_seed(0)

def common(**kw):
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-6, initializer_range=0.2, use_cache=True)
    base.update(kw)
    return base

models = {
    "tiny-qwen3": (Qwen3ForCausalLM, Qwen3Config(**common(head_dim=24, tie_word_embeddings=True,
                                                           rope_theta=1_000_000.0, attention_bias=False))),
    "tiny-qwen2": (Qwen2ForCausalLM, Qwen2Config(**common(tie_word_embeddings=False, rope_theta=10_000.0))),
}

ids = torch.tensor([[5, 17, 99, 3, 64, 2, 127, 40, 8, 11], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
reference = {"generator": f"tools/oracles/ref_model.py (torch {torch.__version__}, transformers {transformers.__version__})",
             "input_ids": ids.tolist(), "models": {}}
for name, (cls, cfg) in models.items():
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    # Non-trivial norm weights and biases so a wrong norm or missing bias shows.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.3)
    shard = "40KB" if name == "tiny-qwen2" else "50MB"
    model.save_pretrained(os.path.join(OUT, name), max_shard_size=shard, safe_serialization=True)
    with torch.no_grad():
        logits = model(ids).logits  # (B, T, V)
        seq = ids[:1, :6]
        greedy = []
        for _ in range(12):
            nxt = int(model(seq).logits[0, -1].argmax())
            greedy.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    reference["models"][name] = {"logits": logits.tolist(), "greedy_prompt": ids[0, :6].tolist(),
                                 "greedy": greedy}

tok = AutoTokenizer.from_pretrained("../shared/tokenizers/qwen3")
problems = []
for f in ["math500", "minerva_math", "olympiadbench", "aime_like", "dapo_math_17k"]:
    with open(f"../shared/data/{f}.jsonl") as fh:
        for i, line in enumerate(fh):
            if i >= 4:
                break
            p = json.loads(line)["problem"]
            problems.append({"text": p, "ids": tok.encode(p, add_special_tokens=False)})
msgs = [{"role": "user", "content": "What is $1+1$? Put the answer in \\boxed{}."}]
reference["tokenizer"] = {
    "problems": problems,
    "chat_user": tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
    "chat_user_no_gen": tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False),
    "eos_token": tok.eos_token, "pad_token": tok.pad_token,
}
with open(os.path.join(OUT, "model_reference.json"), "w") as fh:
    json.dump(reference, fh)
print("wrote", OUT)
