import torch

from ebmlab.energies import BoltzmannMachine
from ebmlab.learning.boltzmann import BMContrastiveDivergence
from ebmlab.losses import exact_nll
from ebmlab.partition import binary_states


def teacher_and_data(n=4000):
    torch.manual_seed(0)
    teacher = BoltzmannMachine(6, init_std=0.6)
    with torch.no_grad():
        teacher.b.normal_(0, 0.5)
    states = binary_states(6)
    with torch.no_grad():
        p = torch.softmax(-teacher.energy(states), 0)
    gen = torch.Generator().manual_seed(1)
    data = states[torch.multinomial(p, n, replacement=True, generator=gen)]
    return teacher, data


def fit(student, loss_fn, steps=200, lr=0.1):
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    for _ in range(steps):
        loss = loss_fn()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_exact_gradient_training_reaches_the_teacher_likelihood():
    teacher, data = teacher_and_data()
    student = BoltzmannMachine(6)
    fit(student, lambda: exact_nll(student, data))
    with torch.no_grad():
        assert float(exact_nll(student, data)) < float(exact_nll(teacher, data)) + 0.01


def test_persistent_cd_gets_close_to_the_exact_fit():
    teacher, data = teacher_and_data()
    student = BoltzmannMachine(6)
    cd = BMContrastiveDivergence(student, k=1, persistent=True, n_chains=200)
    gen = torch.Generator().manual_seed(2)
    batches = data.split(100)
    step = iter(range(10**6))
    fit(student, lambda: cd.loss(batches[next(step) % len(batches)], gen), steps=300, lr=0.03)
    with torch.no_grad():
        assert float(exact_nll(student, data)) < float(exact_nll(teacher, data)) + 0.05


def test_pseudo_likelihood_and_probability_flow_fit_the_teacher():
    from ebmlab.losses import minimum_probability_flow_loss, pseudo_likelihood_loss

    teacher, data = teacher_and_data()
    for rule in (pseudo_likelihood_loss, minimum_probability_flow_loss):
        student = BoltzmannMachine(6)
        fit(student, lambda student=student, rule=rule: rule(student, data)[0])
        with torch.no_grad():
            assert float(exact_nll(student, data)) < float(exact_nll(teacher, data)) + 0.03, (
                rule.__name__
            )


def test_pseudo_likelihood_matches_its_definition():
    from ebmlab.losses import pseudo_likelihood_loss

    teacher, data = teacher_and_data(50)
    x = data[:5]
    with torch.no_grad():
        loss, _ = pseudo_likelihood_loss(teacher, x)
        total = 0.0
        for row in x:
            for i in range(6):
                on, off = row.clone(), row.clone()
                on[i], off[i] = 1.0, 0.0
                p_on = torch.sigmoid(teacher.energy(off[None]) - teacher.energy(on[None]))[0]
                total -= float(torch.log(p_on if row[i] == 1 else 1 - p_on))
    assert abs(float(loss) - total / 5) < 1e-4
