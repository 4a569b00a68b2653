"""Zero-eliding gradient exchange (ByteSplat §6.2): the encoder/decoder kernels against their
references, and the sparse reverse all_to_all against the dense one over gloo.

The Triton kernels run under ``TRITON_INTERPRET=1`` in ONE child process (Triton fixes
compiled-vs-interpreted at import, and the variable must not leak into other test modules): the
parent writes fresh seeded inputs (and the references' encodings, so decode is tested on its own),
the child (``python tests/test_sparse_comm.py kernels IN OUT``) runs the kernels, and the parent
compares. Bitwise comparisons look at int32 views, so NaN payloads and -0.0 count; NaN never passes.
"""

import sys

import pytest
import torch

from interpreted import run_interpreted

from splat_train.kernels import sparse_comm as sc
from splat_train.trainer.exchange import _all_to_all_rows
from splat_train.trainer.launch import DistContext, launch
from splat_train.trainer.sparse_exchange import sparse_all_to_all_rows

NAN, INF = float("nan"), float("inf")


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.equal(bits(a), bits(b)), what


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str = "", rtol: float = 1e-6) -> None:
    """Values close where finite; NaN and +-Inf exactly where the other has them."""
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert torch.equal(a.isnan(), b.isnan()), what
    fa, fb = a.nan_to_num(0.0, 0.0, 0.0), b.nan_to_num(0.0, 0.0, 0.0)
    assert torch.equal(a.isinf() & (a > 0), b.isinf() & (b > 0)), what
    assert torch.equal(a.isinf() & (a < 0), b.isinf() & (b < 0)), what
    assert torch.allclose(fa, fb, rtol=rtol, atol=1e-6), (what, float((fa - fb).abs().max()))


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------


def random_rows(num_rows, d, zero_frac, gen):
    """float32 [num_rows, d] with about zero_frac rows exactly zero (+0.0)."""
    x = torch.randn(num_rows, d, generator=gen)
    x[torch.rand(num_rows, generator=gen) < zero_frac] = 0.0
    return x


def make_case(name, seed):
    gen = torch.Generator().manual_seed(seed)
    if name == "R0":
        x = torch.zeros(0, 12)
    elif name == "R1":
        x = random_rows(1, 12, 0.0, gen)
    elif name in ("R31", "R33", "R100"):
        x = random_rows(int(name[1:]), 12, 0.7, gen)
    elif name == "R32_all_nonzero":  # bit 31 set: a negative int32 word
        x = random_rows(32, 14, 0.0, gen)
    elif name == "all_zero":
        x = torch.zeros(100, 14)
    elif name == "all_nonzero":
        x = random_rows(300, 14, 0.0, gen)
    elif name == "single_lane":  # each kept row has one nonzero lane, the last lane and subnormals included
        x = torch.zeros(203, 12)
        keep = (torch.rand(203, generator=gen) < 0.4).nonzero().flatten()
        lane = torch.randint(0, 12, (keep.numel(),), generator=gen)
        lane[:3] = 11
        x[keep, lane] = torch.randn(keep.numel(), generator=gen)
        x[keep[0], 11] = 1e-45  # the smallest subnormal is not zero
    elif name == "neg_zero_nan_inf":
        x = random_rows(150, 14, 0.7, gen)
        x[0] = -0.0  # a row of -0.0 is zero: elided
        x[5] = 0.0
        x[5, 3] = -0.0
        x[7] = 0.0
        x[7, 13] = NAN  # a lone NaN keeps its row
        x[8] = -0.0
        x[8, 0] = 2.0  # kept; its -0.0 lanes travel bitwise
        x[40] = 0.0
        x[40, 2], x[41] = INF, -INF
        x[63] = 0.0
        x[63, 6] = NAN
    elif name == "wide":  # D > 64: the lane loop takes several steps
        x = random_rows(1000, 70, 0.7, gen)
        x[10:20] = 0.0
        x[10:15, 5] = 1.0  # nonzero only in the first lane block
        x[15:20, 66] = -1.0  # nonzero only in the second
    elif name == "D1":
        x = random_rows(97, 1, 0.5, gen)
    else:
        raise KeyError(name)
    num_targets = 17
    bitmap, rows = sc.reference_encode(x)
    return dict(
        grad=x,
        bitmap=bitmap,
        rows=rows,
        base=torch.randn(x.shape, generator=gen),
        index=torch.randint(0, num_targets, (x.shape[0],), generator=gen),  # duplicates add up
        num_targets=num_targets,
    )


CASES = [
    "R0",
    "R1",
    "R31",
    "R33",
    "R100",
    "R32_all_nonzero",
    "all_zero",
    "all_nonzero",
    "single_lane",
    "neg_zero_nan_inf",
    "wide",
    "D1",
]


# ------------------------------------------------------------------------------------------------
# References: the format itself (in-process, CPU; the public functions use these here)
# ------------------------------------------------------------------------------------------------


def test_reference_format_by_hand():
    x = torch.zeros(33, 3)
    x[0, 0], x[31, 2], x[32, 1] = 1.0, NAN, -0.5
    x[5] = -0.0
    bitmap, rows = sc.reference_encode(x)
    assert bitmap.dtype == torch.int32
    assert bitmap.tolist() == [1 - 2**31, 1]  # bits 0 and 31 | bit 0
    assert_same_bits(rows, x[[0, 31, 32]])
    assert sc.reference_unpack_bits(bitmap, 33).nonzero().flatten().tolist() == [0, 31, 32]
    out = sc.reference_decode_copy(torch.zeros(33, 3), bitmap, rows)
    want = torch.zeros(33, 3)
    want[[0, 31, 32]] = x[[0, 31, 32]]
    assert_same_bits(out, want)  # row 5 (-0.0) comes back as +0.0


@pytest.mark.parametrize("name", CASES)
def test_reference_round_trip(name):
    c = make_case(name, seed=CASES.index(name))
    x = c["grad"]
    mask = sc.reference_row_mask(x)
    # the mask agrees with a value-level definition: any lane != 0 or NaN
    assert torch.equal(mask, ((x != 0) | x.isnan()).any(dim=1))
    assert c["rows"].shape == (int(mask.sum()), x.shape[1])
    decoded = sc.reference_decode_copy(torch.zeros_like(x), c["bitmap"], c["rows"])
    assert_same_bits(decoded, torch.where(mask[:, None], x, torch.zeros_like(x)))
    # on CPU without the interpreter the public functions are the references
    if not sc._INTERPRETED:
        b, r = sc.encode(x)
        assert_same_bits(b, c["bitmap"])
        assert_same_bits(r, c["rows"])


def test_decode_errors():
    bitmap = sc.reference_pack_bits(torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match="set bits"):
        sc.decode_copy(torch.zeros(3, 4), bitmap, torch.zeros(1, 4))
    with pytest.raises(ValueError, match="bitmap must be int32"):
        sc.decode_add(torch.zeros(40, 4), bitmap, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="float32"):
        sc.encode(torch.zeros(3, 4, dtype=torch.float64))


# ------------------------------------------------------------------------------------------------
# Kernels under the Triton interpreter (one child process)
# ------------------------------------------------------------------------------------------------


def _run_kernels(in_path, out_path):
    """Child side: run every kernel on the parent's inputs and save what they return."""
    assert sc._use_kernels(torch.empty(0)), "TRITON_INTERPRET=1 must be set before the import"
    results = {}
    for name, c in torch.load(in_path).items():
        x = c["grad"]
        bitmap, rows = sc.encode(x)
        results[name] = dict(
            bitmap=bitmap,
            rows=rows,
            copy=sc.decode_copy(torch.zeros_like(x), c["bitmap"], c["rows"]),
            add=sc.decode_add(c["base"].clone(), c["bitmap"], c["rows"]),
            index_add=sc.decode_index_add(
                torch.zeros(c["num_targets"], x.shape[1]), c["index"], c["bitmap"], c["rows"]
            ),
        )
    try:  # one set bit too many for the rows given
        sc.decode_copy(torch.zeros(40, 4), torch.tensor([7, 0], dtype=torch.int32), torch.zeros(2, 4))
        results["error"] = None
    except ValueError as e:
        results["error"] = str(e)
    torch.save(results, out_path)


@pytest.fixture(scope="module")
def kernel_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sparse_kernels")
    cases = {name: make_case(name, seed=100 + i) for i, name in enumerate(CASES)}
    torch.save(cases, tmp / "in.pt")
    run_interpreted(__file__, "kernels", str(tmp / "in.pt"), str(tmp / "out.pt"), timeout=300)
    return cases, torch.load(tmp / "out.pt")


@pytest.mark.parametrize("name", CASES)
def test_kernels_match_references(kernel_results, name):
    cases, results = kernel_results
    c, k = cases[name], results[name]
    x = c["grad"]
    assert_same_bits(k["bitmap"], c["bitmap"], "encode bitmap")
    assert_same_bits(k["rows"], c["rows"], "encode rows")
    assert_same_bits(k["copy"], sc.reference_decode_copy(torch.zeros_like(x), c["bitmap"], c["rows"]), "copy")
    # one addition per element, as in the reference: equal bits
    assert_same_bits(k["add"], sc.reference_decode_add(c["base"].clone(), c["bitmap"], c["rows"]), "add")
    ref = sc.reference_decode_index_add(torch.zeros(c["num_targets"], x.shape[1]), c["index"], c["bitmap"], c["rows"])
    assert_close(k["index_add"], ref, "index_add")  # atomics: the summation order may differ


def test_kernel_decode_rejects_wrong_row_count(kernel_results):
    assert "set bits" in kernel_results[1]["error"]


# ------------------------------------------------------------------------------------------------
# The exchange over gloo: sparse == dense, fewer bytes when most rows are zero
# ------------------------------------------------------------------------------------------------

# Each scenario: (D, rows[s][t] = records rank s sends rank t in forward, zero fraction of the
# gradient rows that rank t returns to rank s).
SCENARIOS = {
    2: [
        (14, [[37, 300], [129, 65]], [[0.7, 0.7], [0.7, 0.7]]),  # mostly zero, unequal splits
        (12, [[37, 300], [129, 65]], [[0.0, 0.0], [0.0, 0.0]]),  # every row nonzero
        (14, [[10, 0], [50, 40]], [[0.7, 0.7], [1.0, 0.7]]),  # 0 -> 1 has no rows; 1 -> 0 all zero
    ],
    3: [
        (14, [[5, 200, 33], [0, 64, 97], [310, 1, 0]], [[0.7] * 3] * 3),
        (12, [[5, 200, 33], [0, 64, 97], [310, 1, 0]], [[0.0] * 3] * 3),
        (14, [[70, 90, 0], [64, 1, 0], [0, 0, 0]], [[1.0, 0.7, 0.7], [0.7, 1.0, 0.7], [0.7] * 3]),  # rank 2: no rows
    ],
}


def backward_grad(seed, t, d, rows, zero_frac):
    """Rank t's gradient of what it received: chunk s (rows[s][t] rows) goes back to rank s."""
    gen = torch.Generator().manual_seed(1000 * seed + t)
    chunks = []
    for s in range(len(rows)):
        chunk = random_rows(rows[s][t], d, zero_frac[s][t], gen)
        if chunk.shape[0] > 3 and zero_frac[s][t] < 1.0:  # kept rows the bits must survive:
            chunk[0] = torch.randn(d, generator=gen)
            chunk[0, 0] = -0.0  # a -0.0 lane in a nonzero row
            chunk[1:3] = 0.0
            chunk[1, d - 1], chunk[2, 1] = NAN, 1e-45  # a lone NaN, a lone subnormal
        chunks.append(chunk)
    return torch.cat(chunks)


def _exchange_rank(ctx: DistContext, out_dir):
    torch.set_num_threads(1)
    t = ctx.rank
    results = []
    for seed, (d, rows, zero_frac) in enumerate(SCENARIOS[ctx.world_size]):
        grad = backward_grad(seed, t, d, rows, zero_frac)
        recv_rows = [rows[s][t] for s in range(ctx.world_size)]  # forward: what t received
        send_rows = list(rows[t])  # forward: what t sent
        ctx.stats.reset()
        sparse = sparse_all_to_all_rows(ctx, grad, recv_rows, send_rows)
        sparse_stats = ctx.stats.reset()
        dense = _all_to_all_rows(ctx, grad, recv_rows, send_rows)
        dense_stats = ctx.stats.reset()
        results.append(dict(sparse=sparse, dense=dense, sparse_stats=sparse_stats, dense_stats=dense_stats))
    torch.save(results, f"{out_dir}/rank{t}.pt")


def expected_bytes(rank, world_size, d, rows, grads):
    """(sent, received) bytes of the sparse exchange on `rank`: counts + bitmaps + kept rows."""
    nnz = lambda t, s: int(sc.reference_row_mask(torch.split(grads[t], [r[t] for r in rows])[s]).sum())  # noqa: E731
    sent = recv = 8 * (world_size - 1)
    for j in range(world_size):
        if j != rank:
            sent += 4 * (sc.num_words(rows[j][rank]) + nnz(rank, j) * d)
            recv += 4 * (sc.num_words(rows[rank][j]) + nnz(j, rank) * d)
    return sent, recv


@pytest.mark.parametrize("world_size", [2, 3], ids=["W2", "W3"])
def test_sparse_exchange_equals_dense(tmp_path, world_size):
    rc = launch(_exchange_rank, (str(tmp_path),), nproc_per_node=world_size, device="cpu")
    assert rc == 0
    outs = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    for seed, (d, rows, zero_frac) in enumerate(SCENARIOS[world_size]):
        grads = [backward_grad(seed, t, d, rows, zero_frac) for t in range(world_size)]
        total_sparse = total_dense = 0
        for r in range(world_size):
            o = outs[r][seed]
            # what rank r must get back: chunk r of every rank's gradient, in rank order
            want = torch.cat([torch.split(grads[t], [x[t] for x in rows])[r] for t in range(world_size)])
            assert_same_bits(o["dense"], want, "dense exchange")
            assert_same_bits(o["sparse"], o["dense"], f"scenario {seed} rank {r}")
            sent, recv = expected_bytes(r, world_size, d, rows, grads)
            stats = o["sparse_stats"]
            assert stats["calls"] == {"forward/all_to_all_sparse": 2}
            assert stats["bytes_sent"]["forward/all_to_all_sparse"] == sent
            assert stats["bytes_recv"]["forward/all_to_all_sparse"] == recv
            total_sparse += sent
            total_dense += o["dense_stats"]["bytes_sent"].get("forward/all_to_all", 0)
        if min(min(f) for f in zero_frac) >= 0.7:  # ~70% zero rows or more: well under half
            assert total_sparse < 0.45 * total_dense, (seed, total_sparse, total_dense)


if __name__ == "__main__" and sys.argv[1:2] == ["kernels"]:
    _run_kernels(sys.argv[2], sys.argv[3])
