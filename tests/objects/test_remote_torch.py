"""A plan over a bucket through a stock torch DataLoader whose workers are forked from a
process that already read the bucket (an s3fs client and fetch threads do not survive a fork)."""

from __future__ import annotations

import pytest
from helpers import PLAN, plan_of, small_shard_stores

pytestmark = [pytest.mark.s3, pytest.mark.torch, pytest.mark.slow]


def test_forked_dataloader_workers_read_the_bucket(tmp_path, s3):
    torch = pytest.importorskip("torch")
    from tokentape.torch import TapeDataset

    small_shard_stores(tmp_path)
    s3.upload_tree(tmp_path / "stores", f"{s3.url}/stores")
    remote = plan_of(tmp_path, PLAN.replace('path = "stores/', f'path = "{s3.url}/stores/'))
    dataset, local = TapeDataset(remote), TapeDataset(plan_of(tmp_path))
    assert torch.equal(dataset[0]["inputs"], local[0]["inputs"])  # the parent read the bucket
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=4, sampler=range(24), num_workers=2, multiprocessing_context="fork"
    )
    got = [batch["inputs"] for _, batch in zip(range(6), loader, strict=False)]
    want = [torch.stack([local[i]["inputs"] for i in range(b * 4, b * 4 + 4)]) for b in range(6)]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
