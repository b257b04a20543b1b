"""Contrastive divergence for RBMs with closed-form gradients (Tomczak 2024, eqs. 6.40-6.43).

The log-likelihood gradient of an RBM is the difference of data and model
expectations of the free-energy gradient (eq. 6.41). With mean-field hidden
statistics p(h = 1 | v) = sigmoid(c + v^T W) (eq. 6.38) it is

    dW = <v p(h|v)^T>_data - <v p(h|v)^T>_model,  db = <v>_data - <v>_model,
    dc = <p(h|v)>_data - <p(h|v)>_model,

where the model expectation uses negative samples from k steps of block Gibbs
sampling started at the data (CD-k, Hinton 2002; eq. 6.43) or at persistent
chains that survive parameter updates (PCD, Tieleman 2008). The statistics are
computed with a few matrix products and written into the parameters' ``.grad``
as the gradient of the negative log-likelihood, so any torch optimizer applies
them (SGD with momentum and weight decay is the classic choice). For RBMs with
Gaussian visible units the same CD gradient, d/dtheta [F(v_data) - F(v_model)], is
taken by autograd through the free energy; the same holds for the spike-and-slab RBM
(Courville et al. 2011) and the subspace RBM (eqs. 6.44-6.47), whose negatives come from
their three-block Gibbs samplers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ebmlab import _checks, hardware
from ebmlab._checks import ArgumentError
from ebmlab.energies.boltzmann import (
    BernoulliRBM,
    DeepBoltzmannMachine,
    GaussianBernoulliRBM,
    SubspaceRBM,
    base_rate_logits,
    bernoulli_draw,
)
from ebmlab.energies.spike_slab import SpikeSlabRBM
from ebmlab.hardware import autocast
from ebmlab.learning.chains import PersistentChains, random_rows


@dataclass
class CDStats:
    """Summary of one update: ``reconstruction_error``, the squared distance between the
    data and their mean reconstructions, averaged over rows, and ``free_energy_gap``,
    mean F(negatives) - mean F(data)."""

    reconstruction_error: float
    free_energy_gap: float


class ContrastiveDivergence(PersistentChains):
    """CD-k or persistent CD for a Bernoulli, categorical, Gaussian-Bernoulli, spike-and-slab
    or subspace RBM.

    Args:
        rbm: the model whose ``.grad`` fields are written.
        k: Gibbs steps per update.
        persistent: keep negative chains across updates (PCD).
        n_chains: persistent chains (default: the first batch's size).
        sparsity_target: the mean hidden activation q_j (a subspace RBM's gates) that
            an optional penalty pulls towards (Lee et al. 2008; Hinton 2012, §11;
            None: no penalty).
        sparsity_cost: the penalty's weight: ``sparsity_cost`` (q_j - target) joins the
            gradient of each hidden unit's bias, and the same times the mean input its
            weights, for every RBM here.
        matmul_dtype: do the matrix products in this dtype (``torch.bfloat16``: several
            times faster on CPUs with AMX, float32 where bfloat16 would not be faster,
            :func:`ebmlab.hardware.bfloat16_pays`); parameters,
            gradients and the uniforms of every draw keep at least float32.
        centering: descend along the gradient of the centred RBM (Montavon & Mueller
            2012; Melchior, Fischer & Wiskott 2016), whose energy
            -(v - mu)^T W (h - lam) - b'^T v - c'^T h describes the same model with
            offsets mu and lam at the data means of v and p(h | v) (exponential averages
            at ``centering_rate``). The offsets decouple the weight gradient from the
            biases, a better-conditioned descent that reaches a higher likelihood in the
            same number of updates; the model and its parameters W, b, c are unchanged.
            Binary-hidden RBMs with binary or categorical visible units only.
    """

    def __init__(
        self,
        rbm: BernoulliRBM | GaussianBernoulliRBM | SpikeSlabRBM | SubspaceRBM,
        k: int = 1,
        *,
        persistent: bool = False,
        n_chains: int | None = None,
        sparsity_target: float | None = None,
        sparsity_cost: float = 0.0,
        matmul_dtype: torch.dtype | None = None,
        centering: bool = False,
        centering_rate: float = 0.01,
    ) -> None:
        super().__init__(persistent, n_chains)
        self.rbm = rbm
        self.k = _checks.positive_int("k", k)
        if sparsity_target is not None:
            _checks.probability("sparsity_target", sparsity_target)
        self.sparsity_target = sparsity_target
        if centering and not isinstance(rbm, BernoulliRBM):
            raise ArgumentError(
                "centering is supported for binary-hidden RBMs with binary or categorical "
                "visible units only"
            )
        self.centering = centering
        self.centering_rate = _checks.probability("centering_rate", centering_rate)
        self.offsets: tuple[torch.Tensor, torch.Tensor] | None = None
        self.sparsity_cost = _checks.positive("sparsity_cost", sparsity_cost, allow_zero=True)
        if matmul_dtype not in (None, torch.bfloat16, torch.float16):
            raise ArgumentError(
                f"matmul_dtype must be None, torch.bfloat16 or torch.float16, got {matmul_dtype}"
            )
        self.matmul_dtype = matmul_dtype

    def accumulate(
        self, v: torch.Tensor, generator: torch.Generator | None = None, *, stats: bool = False
    ) -> CDStats | None:
        """Write -(d log-likelihood) into the parameters' ``.grad`` for the batch ``v``.

        With ``stats`` also return the reconstruction error and free-energy gap (three
        more matrix products, so off in the hot loop).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        rbm = self.rbm
        v = v.flatten(1).to(rbm.W.dtype)
        with torch.no_grad():
            ph_data = None
            if isinstance(rbm, BernoulliRBM):
                ph_data, v_neg = self._closed_form_gradient(v, generator)
            else:
                with autocast(v.device, self.matmul_dtype):
                    v_neg = self.start(v, generator)
                    v_neg = rbm.gibbs(v_neg, self.k, generator).to(v.dtype)
                    self.keep(v_neg, self.rbm.W.dtype)
                    self._free_energy_gradient(v, v_neg)
            if not stats:
                return None
            v_neg = v_neg.to(v.dtype)
            # the positive phase's p(h | v) already holds half of a Bernoulli reconstruction
            recon = (
                rbm.reconstruction(v) if ph_data is None else rbm.visible_mean(ph_data.to(v.dtype))
            )
            gap = float(rbm.free_energy(v_neg).mean() - rbm.free_energy(v).mean())
        return CDStats(float(((v - recon) ** 2).sum(1).mean()), gap)

    def _free_energy_gradient(self, v: torch.Tensor, v_neg: torch.Tensor) -> None:
        params = [p for p in self.rbm.parameters() if p.requires_grad]
        with torch.enable_grad():
            gap = self.rbm.free_energy(v).mean() - self.rbm.free_energy(v_neg).mean()
            if self.sparsity_target is not None and self.sparsity_cost:
                # a surrogate whose gradient is cost (q - target) d(mean hidden logit),
                # the closed-form rule's bias and weight terms
                logits = self.rbm.hidden_logits(v)
                excess = torch.sigmoid(logits.detach()).mean(0) - self.sparsity_target
                gap = gap + self.sparsity_cost * (excess * logits.mean(0)).sum()
            grads = torch.autograd.grad(gap, params)
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad.to(param.dtype)

    def _closed_form_gradient(
        self, v: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient of a binary-hidden RBM from its conditionals (eqs. 6.38, 6.39, 6.41).

        W, b and c are cast to ``matmul_dtype`` once per update, so every product of
        the k Gibbs steps runs on the low-precision units without further copies. The
        last step's p(h | v_neg) is the negative hidden statistic, and a CD chain's
        first hidden draw reuses the positive phase's p(h | v). Returns p(h | v) of the
        data and the negatives, both in the products' dtype.
        """
        rbm = self.rbm
        dtype = hardware.reduced_precision(v.device, self.matmul_dtype) or v.dtype
        W, b, c = (p.detach().to(dtype) for p in (rbm.W, rbm.b, rbm.c))

        def hidden_probs(x: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(hardware.matmul(x.to(dtype), W, c))

        ph_data = hidden_probs(v)
        start = self.start(v, generator)
        v_neg, ph_neg = start, ph_data if start is v else hidden_probs(start)
        for _ in range(self.k):
            h = bernoulli_draw(ph_neg, generator)
            v_neg = rbm.sample_visible_from_logits(hardware.matmul(h, W.T, b), generator)
            ph_neg = hidden_probs(v_neg)
        self.keep(v_neg, self.rbm.W.dtype)
        grad_w, grad_b, grad_c = _phase_difference(v_neg, ph_neg, v, ph_data)
        if self.sparsity_target is not None and self.sparsity_cost:
            excess = self.sparsity_cost * (ph_data.mean(0, dtype=v.dtype) - self.sparsity_target)
            grad_c = grad_c + excess
            grad_w = grad_w + v.mean(0)[:, None] * excess[None, :]
        if self.centering:
            grad_w, grad_b, grad_c = self._centred(grad_w, grad_b, grad_c, v, ph_data)
        for param, grad in ((rbm.W, grad_w), (rbm.b, grad_b), (rbm.c, grad_c)):
            param.grad = grad.to(param.dtype).contiguous()
        return ph_data, v_neg

    def _centred(
        self,
        grad_w: torch.Tensor,
        grad_b: torch.Tensor,
        grad_c: torch.Tensor,
        v: torch.Tensor,
        ph_data: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The centred update mapped back to W, b, c. With W = W', b = b' - W lam and
        c = c' - W^T mu, a gradient step on (W', b', c') moves W by
        dW' = dW - mu dc^T - db lam^T, b by db - dW' lam and c by dc - dW'^T mu."""
        grad_w, grad_b, grad_c = (g.to(v.dtype) for g in (grad_w, grad_b, grad_c))
        means = (v.mean(0), ph_data.mean(0, dtype=v.dtype))
        if self.offsets is None:
            self.offsets = means
        else:
            for offset, mean in zip(self.offsets, means, strict=True):
                offset.lerp_(mean, self.centering_rate)
        mu, lam = self.offsets
        grad_w = grad_w - torch.outer(mu, grad_c) - torch.outer(grad_b, lam)
        return grad_w, grad_b - grad_w @ lam, grad_c - grad_w.T @ mu


def _phase_difference(
    v_neg: torch.Tensor, ph_neg: torch.Tensor, v: torch.Tensor, ph_data: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """<v h^T>, <v> and <h> of the negatives minus those of the data (eq. 6.41), from
    one matrix product in the dtype of ``ph_data``:

        [v_neg^T  v^T]   [ph_neg / n_neg    1 / n_neg]   [dW   db]
        [ 1 ...   1  ] @ [ph_data / -n_pos -1 / n_pos] = [dc^T  0]

    The left factor is the stacked rows' transposed view (:func:`ebmlab.hardware.matmul`
    lays it out where its kernel needs that) and the right one is padded with zero
    columns to a multiple of 32, the shapes the matrix-product kernel runs fastest.
    """
    dtype = ph_data.dtype
    n_neg, n_pos = v_neg.shape[0], v.shape[0]
    n_visible, n_hidden = v.shape[1], ph_data.shape[1]
    rows = torch.ones(n_neg + n_pos, n_visible + 1, dtype=dtype, device=v.device)
    rows[:n_neg, :n_visible] = v_neg
    rows[n_neg:, :n_visible] = v
    right = torch.zeros(n_neg + n_pos, -(-(n_hidden + 1) // 32) * 32, dtype=dtype, device=v.device)
    torch.div(ph_neg, n_neg, out=right[:n_neg, :n_hidden])
    torch.div(ph_data, -n_pos, out=right[n_neg:, :n_hidden])
    right[:n_neg, n_hidden] = 1 / n_neg
    right[n_neg:, n_hidden] = -1 / n_pos
    product = hardware.matmul(rows.T, right)
    return (
        product[:n_visible, :n_hidden],
        product[:n_visible, n_hidden],
        product[n_visible, :n_hidden],
    )


class DBMLearning(PersistentChains):
    """Stochastic approximation for a two-layer DBM (Salakhutdinov & Hinton 2009).

    Positive statistics come from mean-field q(h1) q(h2) given the data; negative
    statistics from persistent Gibbs chains over (v, h1, h2). The negative
    log-likelihood gradient is written into the parameters' ``.grad``.

    Args:
        dbm: the two-layer deep Boltzmann machine trained.
        n_chains: number of chains run side by side.
        k: Gibbs steps of the persistent chains per update.
        mean_field_iters: fixed-point iterations of the data term's mean field.
    """

    def __init__(
        self, dbm: DeepBoltzmannMachine, n_chains: int = 100, k: int = 1, mean_field_iters: int = 10
    ) -> None:
        super().__init__(True, _checks.positive_int("n_chains", n_chains))
        self.dbm = dbm
        self.k = _checks.positive_int("k", k)
        self.mean_field_iters = _checks.positive_int("mean_field_iters", mean_field_iters)

    def accumulate(self, v: torch.Tensor, generator: torch.Generator | None = None) -> float:
        """Write the gradient into ``.grad``; returns the mean-field reconstruction error.

        Args:
            v: a batch of visible rows (B, n_visible).
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        dbm = self.dbm
        v = v.flatten(1).to(dbm.W1.dtype)
        with torch.no_grad():
            mu1, mu2 = dbm.mean_field(v, self.mean_field_iters)
            if self.chains is None:  # (v, h2): v at random data rows, h2 off
                rows = random_rows(v, self.n_chains, generator)
                self.chains = (rows, v.new_zeros(self.n_chains, dbm.n_hidden2))
            nv, nh1, nh2 = dbm.gibbs(*self.chains, self.k, generator)
            self.keep((nv, nh2))
            n, m = v.shape[0], nv.shape[0]
            grads = {
                dbm.W1: nv.T @ nh1 / m - v.T @ mu1 / n,
                dbm.W2: nh1.T @ nh2 / m - mu1.T @ mu2 / n,
                dbm.b: nv.mean(0) - v.mean(0),
                dbm.c1: nh1.mean(0) - mu1.mean(0),
                dbm.c2: nh2.mean(0) - mu2.mean(0),
            }
            for param, grad in grads.items():
                param.grad = grad
            recon = torch.sigmoid(mu1 @ dbm.W1.T + dbm.b)
            return float(((v - recon) ** 2).sum(1).mean())


def _train_doubled_rbm(
    data: torch.Tensor,
    n_hidden: int,
    *,
    double_up: bool,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """CD-1 for an RBM whose upward (``double_up``) or downward input is doubled, the
    modified RBMs of Salakhutdinov & Hinton (2009, section 3.1); returns (W, b, c)."""
    n, d = data.shape
    W = torch.randn(d, n_hidden, generator=generator, dtype=data.dtype, device=data.device) * 0.01
    b = base_rate_logits(data).to(data.dtype)
    c = data.new_zeros(n_hidden)
    up, down = (2.0, 1.0) if double_up else (1.0, 2.0)
    velocity = [torch.zeros_like(p) for p in (W, b, c)]
    for _ in range(epochs):
        for idx in torch.randperm(n, generator=generator, device=data.device).split(batch_size):
            v = data[idx]
            logits = up * (v @ W + c)
            ph = torch.sigmoid(logits)
            v_neg = torch.sigmoid(down * (bernoulli_draw(ph, generator) @ W.T + b))
            ph_neg = torch.sigmoid(up * (v_neg @ W + c))
            grads = (
                (v.T @ ph - v_neg.T @ ph_neg) / len(v),
                (v - v_neg).mean(0),
                (ph - ph_neg).mean(0),
            )
            for param, vel, grad in zip((W, b, c), velocity, grads, strict=True):
                vel.mul_(momentum).add_(grad, alpha=lr)
                param.add_(vel)
    return W, b, c


def pretrain_dbm(
    dbm: DeepBoltzmannMachine,
    data: torch.Tensor,
    epochs: int,
    *,
    batch_size: int = 100,
    lr: float = 0.05,
    momentum: float = 0.5,
    generator: torch.Generator | None = None,
) -> None:
    """Greedy layer-wise initialisation of a two-layer DBM (Salakhutdinov & Hinton 2009).

    In the DBM, h1 hears both v and h2, while each RBM of a greedy stack sees one
    neighbour only. The bottom RBM therefore doubles its upward input
    p(h1 | v) = sigmoid(2 (v W1 + c1')) and the top RBM, trained on the bottom one's
    p(h1 | v), doubles its downward input p(h1 | h2) = sigmoid(2 (W2 h2 + b2')). Their
    weights become W1 and W2 of the DBM and h1's bias the sum c1' + b2' of the two halves,
    so that each layer's total input matches what the RBMs learned. Trains ``epochs``
    epochs of CD-1 per layer and writes the DBM's parameters in place.

    Args:
        dbm: the two-layer deep Boltzmann machine initialised.
        batch_size: examples per gradient step.
        lr: learning rate of each layer's CD-1.
        momentum: momentum of the parameter updates.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.positive_int("epochs", epochs)
    options = dict(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum)
    with torch.no_grad():
        v = data.flatten(1).to(dbm.W1.dtype)
        W1, b, c1 = _train_doubled_rbm(
            v, dbm.n_hidden1, double_up=True, generator=generator, **options
        )
        codes = torch.sigmoid(2 * (v @ W1 + c1))
        W2, b2, c2 = _train_doubled_rbm(
            codes, dbm.n_hidden2, double_up=False, generator=generator, **options
        )
        for param, value in (
            (dbm.W1, W1),
            (dbm.W2, W2),
            (dbm.b, b),
            (dbm.c1, c1 + b2),
            (dbm.c2, c2),
        ):
            param.copy_(value)
