"""The facade's names resolve to what the docs promise, whatever was imported before."""
import pytest
import subprocess
import sys


@pytest.mark.slow  # > 5 s on the 2-core VM: full suite only, not the fast lane
def test_estimate_is_the_function_even_after_importing_the_estimate_package():
    code = ("import perfcheck.predict.formulas, perfcheck.predict.roofline\n"
            "import perfcheck\n"
            "assert callable(perfcheck.estimate), type(perfcheck.estimate)\n"
            "from perfcheck import estimate\n"
            "assert callable(estimate)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unknown_attribute_raises_attribute_error():
    import perfcheck
    import pytest

    with pytest.raises(AttributeError):
        perfcheck.no_such_thing


@pytest.mark.slow  # > 5 s on the 2-core VM: full suite only, not the fast lane
def test_estimator_modules_import_with_dotted_alias():
    code = ("import perfcheck\n"
            "import torch\n"
            "rows = perfcheck.estimate(torch.nn.Linear(2, 3), (torch.randn(4, 2),), system='cpu')\n"
            "import perfcheck.predict.trace as T\n"
            "assert T.trace_model and len(rows) == 1\n")
    subprocess.run([sys.executable, "-c", code], check=True)
