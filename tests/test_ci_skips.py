"""CI's rule (NANOASR_NO_SKIPS=1): a skipped test fails the run, except in the GPU tier. The fast lane:
locally, slow and live tests are skipped unless asked for; CI runs them."""
import pathlib

import pytest

pytest_plugins = ["pytester"]

CONFTEST = pathlib.Path(__file__).with_name("conftest.py")
TESTS = {
    "test_broken_import": "import pytest\npytest.importorskip('a_module_that_is_not_there')\n\n"
                          "def test_a():\n    pass\n",
    "test_gpu": "import pytest\n\n@pytest.mark.cuda\ndef test_gpu():\n    pytest.skip('no GPU')\n\n"
                "def test_b():\n    pass\n",
    "test_tiers": "import pytest\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n\n"
                  "@pytest.mark.live\ndef test_live():\n    pass\n\ndef test_fast():\n    pass\n",
}


def run(pytester, monkeypatch, strict: bool, *names, args=(), ci: str | None = None):
    monkeypatch.setenv("NANOASR_NO_SKIPS", "1" if strict else "0")
    monkeypatch.delenv("CI", raising=False)
    if ci is not None:
        monkeypatch.setenv("CI", ci)
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    cuda: GPU tier\n    slow: slow\n    live: live\n")
    pytester.makepyfile(**{name: TESTS[name] for name in names})
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_a_skipped_module_fails_the_strict_run(pytester, monkeypatch):
    result = run(pytester, monkeypatch, True, "test_broken_import", "test_gpu")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*skips CI does not allow*",
                                 "*test_broken_import.py*a_module_that_is_not_there*"])


def test_the_gpu_tier_may_skip(pytester, monkeypatch):
    assert run(pytester, monkeypatch, True, "test_gpu").ret == 0


def test_skips_pass_outside_ci(pytester, monkeypatch):
    assert run(pytester, monkeypatch, False, "test_broken_import", "test_gpu").ret == 0


def test_the_fast_lane_skips_slow_and_live_tests(pytester, monkeypatch):
    run(pytester, monkeypatch, False, "test_tiers").assert_outcomes(passed=1, skipped=2)


def test_all_runs_every_tier(pytester, monkeypatch):
    run(pytester, monkeypatch, False, "test_tiers", args=["--all"]).assert_outcomes(passed=3)


def test_a_marker_expression_runs_what_it_names(pytester, monkeypatch):
    result = run(pytester, monkeypatch, False, "test_tiers", args=["-m", "slow"])
    result.assert_outcomes(passed=1, deselected=2)


@pytest.mark.parametrize("strict, ci", [(True, None), (False, "true")])
def test_ci_runs_every_tier(pytester, monkeypatch, strict, ci):
    run(pytester, monkeypatch, strict, "test_tiers", ci=ci).assert_outcomes(passed=3)
