"""A 3-source weighted mixture trained in plain PyTorch, checkpointed every step, resumed exactly.

    tokentape corpora --out corpora                    # the built-in corpora: prose, code, notes
    python examples/train_mixture.py corpora run 40    # stop it at any time; rerun it to resume

Each source is tokenized once (a rerun finds its store complete); the plan's tape fixes every
batch, and the data state saved with the model resumes at exactly the next one.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch

import tokentape
from tokentape.torch import to_torch

data, run, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
shares = {"prose": 50, "code": 40, "notes": 10}  # weights: normalised by the plan
mix = {n: {"path": tokentape.tokenize(data / n, run / n).out, "weight": shares[n]} for n in shares}
plan = tokentape.Plan.build(mix, seq_len=128, seed=1234, total_tokens="500K")
model = torch.nn.Embedding(plan.vocab_size, plan.vocab_size)  # a bigram language model
opt = torch.optim.SGD(model.parameters(), lr=0.5)  # no state of its own: the weights are all
loader = tokentape.Loader(plan, 0, tokentape.BatchConfig(1, 4, 2), step_log=run / "steps.jsonl")
if (run / "ckpt.npz").exists():  # resume: the weights and the data where they were saved
    saved = np.load(run / "ckpt.npz")  # plain arrays and text: nothing is unpickled
    model.weight.data.copy_(torch.from_numpy(saved["weight"]))
    loader.load_state_dict(json.loads(str(saved["data"])))
while loader.state.step < steps:
    for t in map(to_torch, loader.step().micro_batches):  # this step's micro-batches
        loss = torch.nn.functional.cross_entropy(model(t["inputs"]).mT, t["targets"])
        (loss / loader.config.accum).backward()
    opt.step()
    opt.zero_grad()
    loader.commit()  # after optimizer.step(): the only thing that advances the data
    state = {"weight": model.weight.detach().numpy(), "data": json.dumps(loader.state_dict())}
    np.savez(run / "next.npz", **state)  # then renamed: a kill leaves the old or the new one
    (run / "next.npz").replace(run / "ckpt.npz")
