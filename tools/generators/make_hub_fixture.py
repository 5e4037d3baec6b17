#!/usr/bin/env python3
"""Writes tests/fixtures/hub/dapo-math-17k-tiny.parquet: the verl schema of the hub's
BytedTsinghua-SIA/DAPO-Math-17k parquet (data_source, prompt = [{content, role}], ability,
reward_model = {ground_truth, style}, extra_info = {index}) for 4 problems, the block repeated
3 times as the release repeats it 100 times. Run once with pyarrow: python3 tools/generators/make_hub_fixture.py
"""
import os
import pyarrow as pa
import pyarrow.parquet as pq

HEAD = ("Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
TAIL = "\n\nRemember to put your answer on its own line after \"Answer:\"."
problems = [("What is $1+1$?", "2"), ("Compute $\\frac{6}{4}$ in lowest terms as a+b for a/b.", "5"),
            ("What is $1+1$?", "2"), ("Find $x$ if $2x=10$.", "5")]  # one exact duplicate in the block
rows = {"data_source": [], "prompt": [], "ability": [], "reward_model": [], "extra_info": []}
for rep in range(3):
    for i, (p, a) in enumerate(problems):
        rows["data_source"].append("math_dapo")
        rows["prompt"].append([{"content": HEAD + p + TAIL, "role": "user"}])
        rows["ability"].append("MATH")
        rows["reward_model"].append({"ground_truth": a, "style": "rule-lawyer"})
        rows["extra_info"].append({"index": str(i)})
os.makedirs("tests/fixtures/hub", exist_ok=True)
pq.write_table(pa.table(rows), "tests/fixtures/hub/dapo-math-17k-tiny.parquet")
print("wrote tests/fixtures/hub/dapo-math-17k-tiny.parquet")
