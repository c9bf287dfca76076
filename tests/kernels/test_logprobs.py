"""Chunked and Triton log-prob/entropy agree with the naive computation (values and gradients)."""

from __future__ import annotations

import pytest
import torch

from agentrl.kernels import (
    chunked_logprobs_entropy,
    naive_logprobs_entropy,
    token_logprobs_entropy,
    triton_available,
)


def _inputs(n: int, dim: int, vocab: int, seed: int = 0, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, dim, generator=gen, dtype=torch.float32).mul(2.0).to(device, dtype)
    weight = torch.randn(vocab, dim, generator=gen, dtype=torch.float32).div(dim**0.5).to(device, dtype)
    targets = torch.randint(0, vocab, (n,), generator=gen).to(device)
    return hidden.requires_grad_(), weight.requires_grad_(), targets


def _grads(fn, hidden, weight, targets, seed=1, **kw):
    """Values and gradients of a random linear combination of both outputs (fp32 round-off only:
    sums over rows and vocabulary in a different order, hence rtol=atol=1e-5)."""
    gen = torch.Generator().manual_seed(seed)
    c_logp = torch.randn(hidden.shape[0], generator=gen).to(hidden.device)
    c_ent = torch.randn(hidden.shape[0], generator=gen).to(hidden.device)
    logp, ent = fn(hidden, weight, targets, **kw)
    (c_logp * logp + c_ent * ent).sum().backward()
    out = (logp.detach(), ent.detach(), hidden.grad.detach().clone(), weight.grad.detach().clone())
    hidden.grad = None
    weight.grad = None
    return out


@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_matches_naive_fp32(chunk_rows, temperature):
    hidden, weight, targets = _inputs(n=13, dim=24, vocab=301)
    ref = _grads(naive_logprobs_entropy, hidden, weight, targets, temperature=temperature)
    got = _grads(
        chunked_logprobs_entropy, hidden, weight, targets, temperature=temperature, chunk_rows=chunk_rows
    )
    for name, a, b in zip(("logp", "entropy", "grad_hidden", "grad_weight"), got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{name} differs")


def test_chunked_single_output_gradients():
    """Only one output used: the other's gradient is None and must be skipped, not treated as 0-size."""
    hidden, weight, targets = _inputs(n=5, dim=8, vocab=50)
    logp, _ = chunked_logprobs_entropy(hidden, weight, targets, chunk_rows=2)
    logp.sum().backward()
    g_chunk = hidden.grad.clone()
    hidden.grad = None
    logp_ref, _ = naive_logprobs_entropy(hidden, weight, targets)
    logp_ref.sum().backward()
    torch.testing.assert_close(g_chunk, hidden.grad, rtol=0, atol=1e-5)


def test_chunked_bf16_close_to_fp32():
    hidden, weight, targets = _inputs(n=9, dim=32, vocab=200)
    ref_logp, ref_ent = naive_logprobs_entropy(hidden.detach(), weight.detach(), targets)
    logp, ent = chunked_logprobs_entropy(
        hidden.detach().bfloat16(), weight.detach().bfloat16(), targets, chunk_rows=4
    )
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=0.15)  # bf16 matmul error on |z| ~ 5
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=0.15)


def test_entropy_of_uniform_is_log_vocab():
    hidden = torch.zeros(3, 4)
    weight = torch.randn(17, 4)
    logp, ent = token_logprobs_entropy(hidden, weight, torch.tensor([0, 5, 16]), impl="chunked")
    torch.testing.assert_close(ent, torch.full((3,), float(torch.log(torch.tensor(17.0)))))
    torch.testing.assert_close(logp, torch.full((3,), -float(torch.log(torch.tensor(17.0)))))


def test_auto_picks_chunked_on_cpu():
    from agentrl.kernels import resolve_impl

    assert resolve_impl("auto", torch.device("cpu")) == "chunked"
    with pytest.raises(ValueError, match="not one of"):
        resolve_impl("fast", torch.device("cpu"))


@pytest.mark.skipif(not triton_available(), reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize(("n", "dim", "vocab"), [(5, 16, 40), (21, 40, 150)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_triton_matches_naive_fp32(n, dim, vocab, temperature):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hidden, weight, targets = _inputs(n=n, dim=dim, vocab=vocab, seed=n, device=device)
    ref = _grads(naive_logprobs_entropy, hidden, weight, targets, temperature=temperature)
    got = _grads(token_logprobs_entropy, hidden, weight, targets, impl="triton", temperature=temperature)
    for name, a, b in zip(("logp", "entropy", "grad_hidden", "grad_weight"), got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{name} differs")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_bf16_on_gpu_is_exact_up_to_fp32_accumulation():
    """bf16 inputs: the kernel multiplies them into fp32 tiles, so it matches the fp32 computation on
    the same (upcast) inputs; cuBLAS rounds bf16 logits to bf16 (|z| ~ 6 -> steps of 2^-5), so chunked
    is off by up to ~0.03 there (seen on an H200: 0.026)."""
    hidden, weight, targets = _inputs(n=300, dim=256, vocab=5000, device="cuda", dtype=torch.bfloat16)
    exact_h = hidden.detach().float().requires_grad_()
    exact_w = weight.detach().float().requires_grad_()
    exact = _grads(naive_logprobs_entropy, exact_h, exact_w, targets)
    got = _grads(token_logprobs_entropy, hidden, weight, targets, impl="triton")
    chunked = _grads(chunked_logprobs_entropy, hidden, weight, targets)
    for name, a, c, e in zip(("logp", "entropy"), got[:2], chunked[:2], exact[:2], strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-3, msg=f"triton {name}")
        torch.testing.assert_close(c, e, rtol=0, atol=6e-2, msg=f"chunked {name}")


@pytest.mark.skipif(not triton_available(), reason="Triton needs CUDA or TRITON_INTERPRET=1")
@pytest.mark.parametrize("tiles", [(16, 16, 16), (32, 64, 16), (16, 128, 32)])
def test_triton_result_does_not_depend_on_the_tiles(tiles):
    """Ragged sizes (no dimension a multiple of any tile) exercise every mask."""
    from agentrl.kernels.triton_logprobs import Blocks, triton_logprobs_entropy

    device = "cuda" if torch.cuda.is_available() else "cpu"
    hidden, weight, targets = _inputs(n=37, dim=50, vocab=203, seed=3, device=device)
    ref = _grads(naive_logprobs_entropy, hidden, weight, targets, temperature=0.8)
    got = _grads(triton_logprobs_entropy, hidden, weight, targets, temperature=0.8, blocks=Blocks(*tiles))
    for name, a, b in zip(("logp", "entropy", "grad_hidden", "grad_weight"), got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{name} differs with tiles {tiles}")


def test_tiles_must_be_powers_of_two_of_at_least_16():
    pytest.importorskip("triton")
    from agentrl.kernels.triton_logprobs import Blocks

    with pytest.raises(ValueError, match=r"Blocks.v=48: a tile side must be a power of two >= 16"):
        Blocks(16, 48, 32)
    with pytest.raises(ValueError, match=r"Blocks.d=8"):
        Blocks(16, 64, 8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_kernel_with_the_gpu_tiles_matches_naive_at_the_builtin_models_width():
    from agentrl.kernels.triton_logprobs import GPU_BLOCKS, blocks_for

    assert blocks_for(torch.device("cuda")) == GPU_BLOCKS  # the compiled kernel, not the interpreter
    hidden, weight, targets = _inputs(n=257, dim=576, vocab=5003, seed=5, device="cuda")
    ref = _grads(naive_logprobs_entropy, hidden, weight, targets)
    got = _grads(token_logprobs_entropy, hidden, weight, targets, impl="triton")
    for name, a, b in zip(("logp", "entropy", "grad_hidden", "grad_weight"), got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"{name} differs")
