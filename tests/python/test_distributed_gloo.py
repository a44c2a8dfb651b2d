"""Context-parallel attention across processes on the CPU: 2 and 4 gloo
ranks, both strategies, causal and not, forward and backward, against
single-process reference attention (tests/python/distributed_cases.py)."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import distributed_cases  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


@pytest.mark.parametrize("world_size", [2, 4])
def test_context_parallel_equals_single_process_attention(world_size, tmp_path, seed):
    mp.spawn(distributed_cases.run, args=(world_size, str(tmp_path / "init"), seed),
             nprocs=world_size, join=True)


def test_bad_arguments_name_the_argument(group_of_one):
    from flash3.distributed import ReferenceBackend, ring_attention

    q, k = torch.randn(1, 8, 4, 16), torch.randn(1, 8, 2, 16)
    ref = ReferenceBackend()
    cases = [
        (dict(strategy="tree"), r"strategy: expected one of \('ring', 'all_to_all'\); got 'tree'"),
        (dict(layout="striped"), r"layout: expected one of \('zigzag', 'contiguous'\)"),
        (dict(k=k[:, :6], v=k[:, :6]), r"k: the local sequence length must equal q's \(8\)"),
        (dict(k=torch.randn(1, 8, 3, 16), v=torch.randn(1, 8, 3, 16)),
         r"k: heads_q \(4\) must be a multiple of heads_kv \(3\)"),
        (dict(v=k[..., :8]), r"v: shape must equal k's"),
        (dict(q=q[0]), r"q: expected \(batch, seqlen, heads, head_dim\)"),
    ]
    for overrides, message in cases:
        args = dict(q=q, k=k, v=k, strategy="ring", layout="zigzag") | overrides
        with pytest.raises(ValueError, match=message):
            ring_attention(args["q"], args["k"], args["v"], group_of_one, strategy=args["strategy"],
                           layout=args["layout"], backend=ref)
