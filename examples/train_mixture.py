"""A 3-source weighted mixture trained in plain PyTorch, checkpointed every step, resumed exactly.

    tokentape corpora --out corpora                    # the built-in corpora: prose, code, notes
    python examples/train_mixture.py corpora run 40    # stop it at any time; rerun it to resume

Each source is tokenized once (a rerun finds its store complete); the plan's tape fixes every
batch, and the data state saved with the model resumes at exactly the next one.
"""

import sys
from pathlib import Path

import torch

import tokentape
from tokentape.torch import to_torch

data, run, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
shares = {"prose": 50, "code": 40, "notes": 10}  # weights: normalised by the plan
mix = {n: {"path": tokentape.tokenize(data / n, run / n).out, "weight": shares[n]} for n in shares}
plan = tokentape.Plan.build(mix, seq_len=128, seed=1234, total_tokens="500K")
model = torch.nn.Embedding(plan.vocab_size, plan.vocab_size)  # a bigram language model
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
loader = tokentape.Loader(plan, 0, tokentape.BatchConfig(1, 4, 2), step_log=run / "steps.jsonl")
parts = {"model": model, "opt": opt, "data": loader}  # one checkpoint holds all three
saved = torch.load(run / "ckpt.pt", weights_only=True) if (run / "ckpt.pt").exists() else {}
for key in saved:  # resume: the model, the optimizer and the data where they were saved
    parts[key].load_state_dict(saved[key])
while loader.state.step < steps:
    for t in map(to_torch, loader.step().micro_batches):  # this step's micro-batches
        loss = torch.nn.functional.cross_entropy(model(t["inputs"]).mT, t["targets"])
        (loss / loader.config.accum).backward()
    opt.step()
    opt.zero_grad()
    loader.commit()  # after optimizer.step(): the only thing that advances the data
    torch.save({key: part.state_dict() for key, part in parts.items()}, run / "next.pt")
    (run / "next.pt").replace(run / "ckpt.pt")  # atomic: a kill leaves the old or the new one
