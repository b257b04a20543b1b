"""Energy Matching on a 2-D toy, scored by its exact likelihood.

``python -m benchmarks.energy_matching [--toy 8gaussians] [--eps-max 0.2]
[--flow-steps 800] [--joint-steps 1700]`` trains an MLP potential V (64-64) by Energy
Matching (:func:`ebmlab.losses.energy_matching_loss`): Adam at 2e-3, batches of 256,
the OT flow warm-up, then the joint phase (50 generation steps of 0.02, tau_star 0.8).
Every 500 steps it prints the test NLL of the Boltzmann density exp(-V / eps_max), with
log Z by quadrature on the toy's box (256^2 points), beside the true density's NLL (the
floor), and the seconds so far. Neither the paper nor torchebm reports a likelihood for
a trained potential; this is the number quadrature gives.
"""

from __future__ import annotations

import argparse
import time

import torch

from ebmlab.data import TOYS, make_toy
from ebmlab.energies import MLPEnergy
from ebmlab.losses import energy_matching_loss
from ebmlab.partition import quadrature_log_partition


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--toy", default="8gaussians", choices=sorted(TOYS))
    parser.add_argument("--eps-max", type=float, default=0.2)
    parser.add_argument("--flow-steps", type=int, default=800)
    parser.add_argument("--joint-steps", type=int, default=1700)
    args = parser.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    toy = make_toy(args.toy)
    train, test = toy.sample(20_000, g), toy.sample(5000, g)
    potential = MLPEnergy(2, hidden=(64, 64))
    optimizer = torch.optim.Adam(potential.parameters(), lr=2e-3)
    floor = float(-toy.log_prob(test).mean())
    start = time.perf_counter()
    total = args.flow_steps + args.joint_steps
    print("step | phase | test NLL (nats) | true NLL | seconds")
    for step in range(total):
        phase = "flow" if step < args.flow_steps else "joint"
        batch = train[torch.randint(len(train), (256,), generator=g)]
        loss, _ = energy_matching_loss(potential, batch, tau_star=0.8, eps_max=args.eps_max,
                                       phase=phase, steps=50, dt=0.02, generator=g)  # fmt: skip
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % 500 == 0 or step + 1 == total:
            def energy(x: torch.Tensor) -> torch.Tensor:
                return potential(x) / args.eps_max

            log_z = quadrature_log_partition(energy, toy.bounds, 256).log_z
            with torch.no_grad():
                nll = float(energy(test).mean()) + log_z
            seconds = time.perf_counter() - start
            print(f"{step + 1} | {phase} | {nll:.3f} | {floor:.3f} | {seconds:.0f}", flush=True)


if __name__ == "__main__":
    main()
