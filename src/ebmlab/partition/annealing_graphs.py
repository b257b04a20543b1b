"""RBM annealing on a CUDA GPU, replayed as CUDA graphs.

The annealing loop of :func:`ebmlab.partition.rbm_ais` (Salakhutdinov & Murray 2008)
runs thousands of steps of a few small kernels each (14,500 temperatures for the
paper's schedule). On a GPU each step then costs more in kernel launches from Python
than in arithmetic. Here the step reads its temperatures from a device tensor instead
of Python numbers, so a chunk of steps is captured once as a CUDA graph and replayed
with one launch per chunk; the uniforms of a chunk are drawn in one call before it.
The arithmetic is that of the portable loop in :mod:`ebmlab.partition.ais`, with
W_q = W in float32. Without ``graphs`` the same chunks run eagerly, on any device.
"""

from __future__ import annotations

import torch

from ebmlab.devices import warm_and_capture, wide_dtype

_CHUNK_WORDS = 2**26  # uniform words drawn at once: 256 MB of int32
_MAX_CHUNK = 256  # steps per captured graph
_SCALE = 2.0**31  # a uniform int32 word u is below scale * p with probability (1 + p) / 2


def replaces_loop(device: torch.device) -> bool:
    """Whether annealing on ``device`` runs here rather than in the portable loop: on
    CUDA devices, where the graphs pay off.

    Args:
        device: the device of the RBM's weights.
    """
    return device.type == "cuda"


def anneal_rbm_in_chunks(
    v: torch.Tensor,
    betas: torch.Tensor,
    W: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    b_a: torch.Tensor,
    gen: torch.Generator | None,
    graphs: bool = True,
) -> torch.Tensor:
    """The per-temperature sums of :func:`ebmlab.partition.ais._anneal_rbm` for chains
    ``v`` along ``betas``: a (3, K, n) tensor of sum_j log((1 + |t_k|) / (1 + |t_{k-1}|)),
    sum_j relu(top_k a_j / 2) and (b - b_a) . v at each of the K steps.

    Args:
        v: the chains' starting visible states, (n, d) in {0, 1}.
        betas: the inverse temperatures, K + 1 of them, in either direction.
        W: the weights, (d, m).
        b: the visible biases.
        c: the hidden biases.
        b_a: the base model's visible biases.
        gen: source of the uniforms, on ``v``'s device (``None``: the global one).
        graphs: capture chunks as CUDA graphs (CUDA only); else run them eagerly.
    """
    n, d = v.shape
    m = W.shape[1]
    device = W.device
    steps = len(betas) - 1
    beta = betas.to(device, wide_dtype(device))
    top = torch.maximum(beta[1:], beta[:-1])
    # per step: top / 2, beta_k / top, beta_{k-1} / top and beta_k / 2
    coef_all = torch.stack([top / 2, beta[1:] / top, beta[:-1] / top, beta[1:] / 2], 1).float()
    chunk = max(1, min(_MAX_CHUNK, _CHUNK_WORDS // (n * (m + d)), steps - 1))
    coef = torch.empty(chunk, 4, device=device)
    words = torch.empty(chunk, n * (m + d), dtype=torch.int32, device=device)
    sums = torch.empty(3, steps, n, device=device)
    chunk_sums = torch.empty(3, chunk, n, device=device)
    W32, Wt, c32 = W.float(), W.T.float(), c.float()
    gap, half_base = (b - b_a).float(), b_a.float() / 2
    v_now = v.float()
    y, t, t_prev, ratio, h = (torch.empty(n, m, device=device) for _ in range(5))
    x = torch.empty(n, d, device=device)
    h_bits = torch.empty(n, m, dtype=torch.bool, device=device)
    v_bits = torch.empty(n, d, dtype=torch.bool, device=device)

    def accumulate(j: int) -> None:
        """Step j of the chunk: the three sums at the chains' current states."""
        top_half, to_beta, to_prev, _ = coef[j]
        torch.addmm(c32, v_now, W32, out=y).mul_(top_half)  # top * a / 2
        torch.mul(y, to_beta, out=t).tanh_()
        torch.mul(y, to_prev, out=t_prev).tanh_().abs_().add_(1)
        torch.abs(t, out=ratio).add_(1).div_(t_prev).log_()
        torch.sum(ratio, 1, out=chunk_sums[0, j])
        torch.sum(y.clamp_(min=0), 1, out=chunk_sums[1, j])
        torch.mv(v_now, gap, out=chunk_sums[2, j])

    def transition(j: int) -> None:
        """One block-Gibbs step at beta_k: h given v, then v given h."""
        u = words[j]
        torch.lt(u[: n * m].view(n, m), t.mul_(_SCALE), out=h_bits)
        h.copy_(h_bits)
        torch.addmm(gap, h, Wt, out=x).mul_(coef[j, 3]).add_(half_base).tanh_().mul_(_SCALE)
        torch.lt(u[n * m :].view(n, d), x, out=v_bits)
        v_now.copy_(v_bits)

    def run(count: int) -> bool:
        for j in range(count):
            accumulate(j)
            transition(j)
        return True

    capture = graphs and device.type == "cuda"
    graph = None
    for start in range(0, steps - 1, chunk):
        count = min(chunk, steps - 1 - start)
        coef[:count].copy_(coef_all[start : start + count])
        torch.randint(-(2**31), 2**31, words.shape, generator=gen, out=words)
        if graph is not None and count == chunk:
            graph.replay()
        elif capture and count == chunk:
            graph = warm_and_capture(lambda: run(chunk), device)
        else:
            run(count)
        sums[:, start : start + count].copy_(chunk_sums[:, :count])
    coef[:1].copy_(coef_all[-1:])
    accumulate(0)  # the last temperature's sums; no transition after it
    sums[:, -1].copy_(chunk_sums[:, 0])
    return sums
