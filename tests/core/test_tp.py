"""Tensor parallelism (OLMo-core's `apply_tp`) of a RePo model on two gloo ranks: the logits and positions of the
unsplit model, f_phi split like a feed-forward (each rank holds half of gate_map/content_map's rows), also with
the index blend on."""

from __future__ import annotations

import pytest
import torch
from olmo_core.distributed.utils import get_full_tensor
from olmo_core.testing import run_distributed_test
from torch.distributed.device_mesh import init_device_mesh

from olmo_repo.olmocore.attention import RepoAttention
from olmo_repo.rope import record_positions, set_index_blend

from .tiny import assert_within, olmo2_tiny

pytestmark = pytest.mark.slow  # two spawned processes


def _compare(kv_heads: int | None, blend: float) -> None:
    config = olmo2_tiny("repo", 1, n_kv_heads=kv_heads)
    torch.manual_seed(0)
    model = config.build(init_device="cpu")
    model.init_weights(max_seq_len=32)
    with torch.no_grad():
        for block in model.blocks.values():
            if isinstance(block.attention, RepoAttention):
                block.attention.final_map.weight.mul_(3000.0)
    set_index_blend(model, blend)  # each rank blends its key/value heads' positions with the token index
    ids = torch.randint(0, 100, (2, 16))
    with torch.no_grad(), record_positions(model) as positions:
        want = model(ids)
    want_positions = {i: z.clone() for i, z in positions.items()}
    model.apply_tp(init_device_mesh("cpu", (2,)))
    att = model.blocks["1"].attention
    assert att.gate_map.weight.to_local().shape == (4, 64)  # d/8 = 8 hidden units, 4 on this rank
    assert att.final_map.weight.to_local().shape == ((kv_heads or 4), 4)
    with torch.no_grad(), record_positions(model) as positions:
        got = get_full_tensor(model(ids))
    assert_within(got, want, roundings=4 * 64 * 4, what="logits under TP")
    for layer, z in want_positions.items():
        assert_within(
            get_full_tensor(positions[layer]), z, roundings=2 * 64, what=f"positions of layer {layer}"
        )


@pytest.mark.parametrize("kv_heads, blend", [(None, 0.0), (2, 0.5)])
def test_tensor_parallel_repo_equals_the_unsplit_model(kv_heads, blend):
    # spawn, not fork: earlier tests of this process leave threads (gloo, OLMo-core's bookkeeping) a fork inherits
    args = (kv_heads, blend)
    run_distributed_test(_compare, world_size=2, backend="gloo", start_method="spawn", func_args=args)
