"""CI's rule (NANOASR_NO_SKIPS=1): a skipped test fails the run, except in the GPU tier."""
import pathlib

pytest_plugins = ["pytester"]

CONFTEST = pathlib.Path(__file__).with_name("conftest.py")
TESTS = {
    "test_broken_import": "import pytest\npytest.importorskip('a_module_that_is_not_there')\n\n"
                          "def test_a():\n    pass\n",
    "test_gpu": "import pytest\n\n@pytest.mark.cuda\ndef test_gpu():\n    pytest.skip('no GPU')\n\n"
                "def test_b():\n    pass\n",
}


def run(pytester, monkeypatch, strict: bool, *names):
    monkeypatch.setenv("NANOASR_NO_SKIPS", "1" if strict else "0")
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    cuda: GPU tier\n")
    pytester.makepyfile(**{name: TESTS[name] for name in names})
    return pytester.runpytest_subprocess("-p", "no:cacheprovider")


def test_a_skipped_module_fails_the_strict_run(pytester, monkeypatch):
    result = run(pytester, monkeypatch, True, "test_broken_import", "test_gpu")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*skips CI does not allow*",
                                 "*test_broken_import.py*a_module_that_is_not_there*"])


def test_the_gpu_tier_may_skip(pytester, monkeypatch):
    assert run(pytester, monkeypatch, True, "test_gpu").ret == 0


def test_skips_pass_outside_ci(pytester, monkeypatch):
    assert run(pytester, monkeypatch, False, "test_broken_import", "test_gpu").ret == 0
