"""Sampling tests. Without CUDA, Triton kernels run under the interpreter (set in tests/conftest.py)."""


def pytest_configure(config) -> None:  # noqa: ANN001
    # The interpreter's numpy evaluates log(0) and 0/0 on masked lanes that the kernel then discards.
    for message in ("divide by zero encountered", "invalid value encountered"):
        config.addinivalue_line("filterwarnings", f"ignore:{message}:RuntimeWarning:triton.*")
