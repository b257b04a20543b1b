"""scikit-learn's own tests of its BernoulliRBM (sklearn/neural_network/tests/test_rbm.py,
read from the installed scikit-learn) run against ebmlab's drop-in. Every test passes but
those listed in EXPECTED, each with the reason it cannot."""

import re
import subprocess
import sys

EXPECTED = {
    "test_fit": "pins scikit-learn's pseudo-likelihood (-21) as score_samples; ebmlab's "
    "score_samples is the exact log-likelihood (pseudo_likelihood is its own method)",
    "test_partial_fit": "the same pinned pseudo-likelihood",
    "test_transform": "calls scikit-learn's private _mean_hiddens",
    "test_sample_hiddens": "calls scikit-learn's private _sample_hiddens",
    "test_fit_gibbs[csc_matrix]": "pins scikit-learn's seeded weights",
    "test_fit_gibbs[csc_array]": "pins scikit-learn's seeded weights",
}

RUN = """
import os, sys
import pytest
import sklearn.neural_network as nn
import ebmlab.sklearn
nn.BernoulliRBM = ebmlab.sklearn.BernoulliRBM
path = os.path.join(os.path.dirname(nn.__file__), "tests", "test_rbm.py")
sys.exit(pytest.main([path, "-q", "-rA", "--tb=no", "-p", "no:cacheprovider",
                      "-p", "no:randomly", "--no-header"]))
"""


def test_scikit_learns_own_rbm_tests_pass_but_the_listed_ones():
    out = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    outcome = dict(
        (name, status)
        for status, name in re.findall(r"^(PASSED|FAILED|ERROR) \S+::(\S+)", out.stdout, re.M)
    )
    assert len(outcome) >= 20, out.stdout[-2000:]
    failed = {name for name, status in outcome.items() if status != "PASSED"}
    assert failed == set(EXPECTED), out.stdout[-3000:]
