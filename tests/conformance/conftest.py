import pytest


@pytest.fixture(params=[True, False], ids=["accelerator", "no-float64"])
def float64(request) -> bool:
    """Each conformance check runs on a generic simulated accelerator and on one without
    double precision, as Apple's GPU (MPS) is."""
    return request.param
